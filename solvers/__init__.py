"""Placement policies by name and one entry point: ``solvers.solve(name, load, topology)``.

`available()` lists the policies, `options(name)` a policy's options, `register` /
`unregister` add your own. The rooms: ``policies/`` (one module per registered function),
``primitives/`` (what they are built from), ``analysis/`` (lower bounds, replicas moved,
failed GPUs); `legacy` maps old spellings. docs/solvers.md.

>>> from eplb import solvers
>>> solvers.available()  # doctest: +SKIP
['deepseek', 'greedy', ...]
>>> placement = solvers.solve("greedy", trace, topology)  # doctest: +SKIP
"""

from eplb.solvers import policies as _policies  # noqa: F401  (registers the policies)
from eplb.solvers.registry import (
    available,
    check_options,
    get,
    group_fallback,
    load_plugins,
    needs_groups,
    needs_previous,
    options,
    register,
    resolve,
    solve,
    takes_previous,
    takes_windows,
    unregister,
)

__all__ = ["available", "check_options", "get", "options", "register", "resolve", "solve"]
__all__ += ["group_fallback", "load_plugins", "needs_groups", "needs_previous", "takes_previous"]
__all__ += ["takes_windows", "unregister"]
