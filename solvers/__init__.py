"""Placement policies: a registry by name and one entry point.

Registered: ``deepseek`` (bit-exact DeepSeek EPLB), ``greedy`` (slot-aware global greedy with
swap search; ``weighted``, ``rdma_weight``), ``hierarchical`` (group-to-node contract, best
assignment), ``ilp`` (exact per-layer model, certified bound and gap). Lower bounds:
`solvers.bounds.lower_bound`; relabeling against ``previous=``: `solvers.migration`;
incremental repair of the live placement (greedy ``tolerance`` / ``migration_budget``):
`solvers.incremental`;
traffic proxy: `solvers.traffic_cost.expected_rdma`. See docs/solvers.md.

>>> import solvers
>>> solvers.available()  # doctest: +SKIP
['deepseek', ...]
>>> placement = solvers.solve("deepseek", load, topology, num_groups=8)  # doctest: +SKIP
"""

from solvers import deepseek as _deepseek  # noqa: F401  (registers "deepseek")
from solvers import greedy as _greedy  # noqa: F401  (registers "greedy")
from solvers import hierarchical as _hierarchical  # noqa: F401  (registers "hierarchical")
from solvers import ilp as _ilp  # noqa: F401  (registers "ilp")
from solvers.registry import available, get, options, register, solve

__all__ = ["available", "get", "options", "register", "solve"]
