"""``greedy_weighted``: greedy that also chooses ``replica_share`` (weighted dispatch).

Per layer the better of the even-split greedy placement and the chain layout designed for
shares (``S >= 3``), each with optimal shares (how often this reaches ``total / G``: measured
in docs/solvers.md, "Weighted shares"); ``rdma_weight > 0``: the traffic-aware placement
with optimal shares (`solvers.primitives.weighted_placement`). ``meta["solver"]["structure"]``
per layer.
"""

from __future__ import annotations

import numpy as np

from eplb.placement import Placement
from eplb.solvers.primitives.validation import NonNegFloat, NonNegInt
from eplb.solvers.primitives.weighted_placement import place_weighted
from eplb.solvers.registry import register
from eplb.topology import Topology


@register("greedy_weighted")
def greedy_weighted(
    load: np.ndarray,
    topology: Topology,
    *,
    num_groups: int | None = None,
    rdma_weight: NonNegFloat = 0.0,
    budget: NonNegInt = 10_000,
) -> Placement:
    """Weighted greedy on ``load: float64[L, E]`` (module docstring). ``budget``: max swap
    iterations; ``num_groups`` only adds DeepSeek's hierarchical placement as a candidate."""
    phy2log, share, info = place_weighted(load, topology, num_groups, rdma_weight, budget)
    return Placement(phy2log, load.shape[1], topology, share, meta={"solver": info})
