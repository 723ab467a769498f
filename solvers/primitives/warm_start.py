"""The start of every layer of the exact models (``ilp``, ``ilp_weighted``): the greedy
placement the options ask for; the exact result is never worse than it."""

from __future__ import annotations

import numpy as np

from eplb.placement import Placement
from eplb.solvers.primitives.even_split import place_even
from eplb.solvers.primitives.group_placement import best_hierarchical
from eplb.solvers.primitives.shares import optimal_shares
from eplb.solvers.primitives.traffic_packing import pack_traffic
from eplb.solvers.primitives.weighted_placement import place_weighted
from eplb.topology import Topology


def warm_start(
    load: np.ndarray,
    topology: Topology,
    groups: int | None,
    rdma_weight: float,
    *,
    weighted: bool,
) -> tuple[Placement, str]:
    """``(start, name)``: the start of every layer of ``load: float64[L, E]``: the
    ``hierarchical`` placement when ``groups`` is given (with optimal shares when
    ``weighted``), else the ``greedy_weighted``, traffic-aware or even-split greedy one."""
    E = load.shape[1]
    if groups is not None:
        phy2log, info = best_hierarchical(load, topology, groups)
        share = None
        if weighted:
            share, _ = optimal_shares(load, phy2log, topology)
        return Placement(phy2log, E, topology, share, {"solver": info}), "hierarchical"
    if weighted:
        phy2log, share, info = place_weighted(load, topology, rdma_weight=rdma_weight)
        return Placement(phy2log, E, topology, share, meta={"solver": info}), "greedy"
    if rdma_weight:
        packed, _ = pack_traffic(load, topology, rdma_weight)
        return Placement(packed.phy2log(), E, topology), "greedy"
    phy2log, _ = place_even(load, topology)
    return Placement(phy2log, E, topology), "greedy"
