"""Placement policies: a registry by name and one entry point.

>>> import solvers
>>> solvers.available()  # doctest: +SKIP
['deepseek', ...]
>>> placement = solvers.solve("deepseek", load, topology, num_groups=8)  # doctest: +SKIP
"""

from solvers import deepseek as _deepseek  # noqa: F401  (registers "deepseek")
from solvers.registry import available, get, register, solve

__all__ = ["available", "get", "register", "solve"]
