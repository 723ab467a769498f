"""Traffic-aware greedy packing: ``max GPU load + rdma_weight * expected_rdma / G`` per layer
(`traffic_cost`), with counts that reward replicas on new nodes, LPT that spreads an expert
over nodes and swaps scored by the exact change of the objective; the best candidate per layer
wins. docs/solvers.md, "Traffic-aware".
"""

from __future__ import annotations

import numpy as np

from eplb.solvers.primitives import packing
from eplb.solvers.primitives.replication import default_cap, waterfill
from eplb.solvers.primitives.traffic_cost import rdma_from_node_count, traffic_objective
from eplb.tolerance import better
from eplb.topology import Topology

BETAS = (0.0, 1.0, 4.0, 16.0, 64.0)  # count-priority multiples of rdma_weight / G


def pack_traffic(
    load: np.ndarray, topology: Topology, rdma_weight: float, *, budget: int = 10_000
) -> tuple[packing.Packed, np.ndarray]:
    """Traffic-aware packing of ``load: float64[L, E]``: the packing and ``float64[L]``
    objective values (docs/solvers.md)."""
    L, E = load.shape
    G, S, N = topology.num_gpus, topology.slots_per_gpu, topology.num_nodes
    gpn = topology.gpus_per_node
    cap = default_cap(E, G, S)
    weight = rdma_weight / G
    best_obj = np.full(L, np.inf)
    best: packing.Packed | None = None
    for beta in BETAS:
        bonus = None
        if beta > 0:
            bonus = np.zeros((L, E, N + 1))
            bonus[:, :, 1:N] = (beta * weight * load / N)[:, :, None]
        counts = waterfill(load, G * S, cap, bonus=bonus)
        packed = packing.lpt(load, counts, G, S, node_penalty=weight * load / N, gpus_per_node=gpn)
        term = packing.TrafficTerm(packing.node_counts(packed, gpn), load, weight, gpn)
        packing.improve(packed, budget=budget, traffic=term)
        obj = traffic_objective(
            packed.gpu, rdma_from_node_count(term.node_count, load), rdma_weight
        )
        if best is None:
            best, best_obj = packed, obj
            continue
        take = better(obj, best_obj)
        best.assign(packed, take)
        best_obj = np.where(take, obj, best_obj)
    return best, best_obj
