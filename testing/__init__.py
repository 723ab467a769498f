"""Property testing for placement policies, yours and ours (as ``numpy.testing``).

`assert_valid_placement` checks one placement, `assert_meta_truthful` its metadata;
`check_solver("mine")` runs the invariant suite
every solver of the toolkit passes, with hypothesis, reporting shrunk counterexamples;
`strategies` holds the hypothesis strategies. ``hypothesis`` is needed only by the last two.
See docs/solvers.md, section "Your own policy: `eplb.testing`".
"""

from __future__ import annotations

from typing import Any

from eplb.testing.asserts import assert_valid_placement
from eplb.testing.check import CheckReport, check_solver
from eplb.testing.meta import assert_meta_truthful

__all__ = [
    "CheckReport", "assert_meta_truthful", "assert_valid_placement", "check_solver", "strategies",
]


def __getattr__(name: str) -> Any:
    if name == "strategies":  # lazy: hypothesis is needed only when strategies are used
        import importlib

        return importlib.import_module("eplb.testing.strategies")
    raise AttributeError(f"module 'eplb.testing' has no attribute {name!r}")

