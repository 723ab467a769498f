"""Slots and ``replica_share`` together: the ``greedy_weighted`` placement.

Per layer, the better of the even-split greedy placement and the chain layout built for
shares, each with its optimal shares (an LP); with ``rdma_weight > 0`` the traffic-aware
greedy placement with optimal shares. docs/solvers.md, "Weighted shares".
"""

from __future__ import annotations

import numpy as np

from eplb.solvers.primitives.even_split import place_even
from eplb.solvers.primitives.layout import duplicates
from eplb.solvers.primitives.shares import chain_layout, optimal_shares
from eplb.solvers.primitives.traffic_packing import pack_traffic
from eplb.tolerance import better
from eplb.topology import Topology


def place_weighted(
    load: np.ndarray,
    topology: Topology,
    num_groups: int | None = None,
    rdma_weight: float = 0.0,
    budget: int = 10_000,
) -> tuple[np.ndarray, np.ndarray, dict]:
    """``(phy2log: int64[L, P], replica_share: float64[L, P], info)`` for ``load: float64[L,
    E]``. ``budget``: max swap iterations; ``num_groups`` only adds DeepSeek's hierarchical
    placement as a candidate. ``info["structure"]``: which structure each layer took."""
    L, E = load.shape
    S = topology.slots_per_gpu
    info: dict = {"policy": "global", "weighted": True}
    if rdma_weight > 0:
        packed, _ = pack_traffic(load, topology, rdma_weight, budget=budget)
        base = packed.phy2log()
        share, _ = optimal_shares(load, base, topology)
        info.update(
            rdma_weight=rdma_weight,
            structure=["traffic"] * L,
            duplicates=int(duplicates(base, S).sum()),
        )
        return base, share, info
    base, taken = place_even(load, topology, num_groups, budget)
    share, best = optimal_shares(load, base, topology)
    structure = np.array(["greedy"] * L, dtype=object)
    structure[taken] = "deepseek"
    chain = chain_layout(load, topology)
    if chain is not None:
        c_share, c_best = optimal_shares(load, chain, topology)
        take = better(c_best, best)
        base = np.where(take[:, None], chain, base)
        share = np.where(take[:, None], c_share, share)
        best = np.where(take, c_best, best)
        structure[take] = "chain"
    info["structure"] = structure.tolist()
    info["deepseek_layers"] = np.nonzero(structure == "deepseek")[0].tolist()
    info["duplicates"] = int(duplicates(base, S).sum())
    return base, share, info
