"""Placement policies: a registry by name and one entry point, `solve`.

Policies (one registered function each): ``deepseek`` (bit-exact DeepSeek EPLB), ``greedy``
(slot-aware global greedy, never worse than deepseek), ``greedy_weighted`` (also chooses
``replica_share``), ``greedy_traffic`` (trades balance for expected RDMA), ``repair``
(incremental repair of the live placement), ``hierarchical`` (group-to-node contract, exact
when small), ``ilp`` / ``ilp_weighted`` (exact per layer, certified bound and gap).
`options(name)` lists a policy's options; `solvers.legacy` maps old spellings (e.g.
``solve("greedy", weighted=True)``). Lower bounds: `solvers.analysis.bounds.lower_bound`;
replicas moved: `solvers.analysis.migration`; traffic proxy: `solvers.primitives.traffic_cost`.
Property checks for your own policies: `eplb.testing`. See docs/solvers.md.

>>> import solvers
>>> solvers.available()  # doctest: +SKIP
['deepseek', 'greedy', ...]
>>> placement = solvers.solve("greedy", trace, topology)  # doctest: +SKIP
"""

from eplb.solvers import policies as _policies  # noqa: F401  (registers the policies)
from eplb.solvers.registry import (
    available,
    check_options,
    get,
    options,
    register,
    resolve,
    solve,
    takes_windows,
    unregister,
)

__all__ = ["available", "check_options", "get", "options", "register", "resolve", "solve"]
__all__ += ["takes_windows", "unregister"]
