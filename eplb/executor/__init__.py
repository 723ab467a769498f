"""Reference executor: one expert-parallel MoE layer driven by placement tables, in numpy.

`MoELayer` (the dense truth), `ReferenceExecutor` (the layer on ``G`` simulated ranks) and the
kernels; the dispatch policies it routes by are `eplb.dispatch`'s (``route``, ``POLICIES``,
``check_policy``, ``dispatch_table`` are handed on from there). Depends on the eplb core only.
See docs/core.md, section "The reference executor".
"""

from eplb.dispatch import POLICIES, check_policy, dispatch_table, route
from eplb.executor.executor import (
    ExecutorStats,
    RebalanceReport,
    ReferenceExecutor,
    even_token_rank,
    weight_moves,
)
from eplb.executor.kernels import (
    Buffer,
    DispatchLayout,
    combine,
    dispatch,
    dispatch_layout,
    expert_compute,
)
from eplb.executor.model import MoELayer, check_topk, swiglu

__all__ = [
    "POLICIES",
    "Buffer",
    "DispatchLayout",
    "ExecutorStats",
    "MoELayer",
    "RebalanceReport",
    "ReferenceExecutor",
    "check_policy",
    "check_topk",
    "combine",
    "dispatch",
    "dispatch_layout",
    "dispatch_table",
    "even_token_rank",
    "expert_compute",
    "route",
    "swiglu",
    "weight_moves",
]
