"""Placement policies: a registry by name and one entry point, `solve`.

Policies (one registered function each): ``deepseek`` (bit-exact DeepSeek EPLB), ``greedy``
(slot-aware global greedy, never worse than deepseek), ``greedy_weighted`` (also chooses
``replica_share``), ``greedy_traffic`` (trades balance for expected RDMA), ``repair``
(incremental repair of the live placement), ``hierarchical`` (group-to-node contract, exact
when small), ``ilp`` / ``ilp_weighted`` (exact per layer, certified bound and gap).
`options(name)` lists a policy's options; `solvers.legacy` maps old spellings (e.g.
``solve("greedy", weighted=True)``). Lower bounds: `solvers.bounds.lower_bound`; relabeling
against ``previous=``: `solvers.migration`; traffic proxy: `solvers.traffic_cost`. Property
checks for your own policies: `eplb.testing`. See docs/solvers.md.

>>> import solvers
>>> solvers.available()  # doctest: +SKIP
['deepseek', 'greedy', ...]
>>> placement = solvers.solve("greedy", trace, topology)  # doctest: +SKIP
"""

from eplb.solvers import deepseek as _deepseek  # noqa: F401  (registers the policies)
from eplb.solvers import greedy as _greedy  # noqa: F401
from eplb.solvers import greedy_traffic as _greedy_traffic  # noqa: F401
from eplb.solvers import greedy_weighted as _greedy_weighted  # noqa: F401
from eplb.solvers import hierarchical as _hierarchical  # noqa: F401
from eplb.solvers import ilp as _ilp  # noqa: F401
from eplb.solvers import relaxed as _relaxed  # noqa: F401  (research policy, issue 14)
from eplb.solvers import repair as _repair  # noqa: F401
from eplb.solvers import robust as _robust  # noqa: F401
from eplb.solvers.registry import (
    available,
    check_options,
    get,
    options,
    register,
    resolve,
    solve,
    takes_windows,
)

__all__ = ["available", "check_options", "get", "options", "register", "resolve", "solve"]
__all__ += ["takes_windows"]
