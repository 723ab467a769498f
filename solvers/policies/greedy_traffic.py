"""``greedy_traffic``: greedy that trades balance for expected RDMA traffic.

Minimises, per layer, ``max GPU load + rdma_weight * expected_rdma / G`` (`traffic_cost`:
both terms in tokens per GPU) with the traffic-aware counts, LPT and swaps of
`solvers.primitives.traffic_packing`. ``meta["solver"]["objective"]`` holds the per-layer objective.
"""

from __future__ import annotations

import numpy as np

from eplb.placement import Placement
from eplb.solvers.primitives.layout import duplicates
from eplb.solvers.primitives.traffic_packing import pack_traffic
from eplb.solvers.primitives.validation import NonNegFloat, NonNegInt
from eplb.solvers.registry import register
from eplb.topology import Topology


@register("greedy_traffic")
def greedy_traffic(
    load: np.ndarray,
    topology: Topology,
    *,
    rdma_weight: NonNegFloat = 1.0,
    budget: NonNegInt = 10_000,
) -> Placement:
    """Traffic-aware greedy on ``load: float64[L, E]``; ``rdma_weight >= 0`` prices one RDMA
    pick per GPU like one token on the busiest GPU; ``budget``: max swap iterations."""
    packed, obj = pack_traffic(load, topology, rdma_weight, budget=budget)
    phy2log = packed.phy2log()
    info = {
        "policy": "global",
        "rdma_weight": rdma_weight,
        "objective": obj.tolist(),
        "duplicates": int(duplicates(phy2log, topology.slots_per_gpu).sum()),
    }
    return Placement(phy2log, load.shape[1], topology, meta={"solver": info})
