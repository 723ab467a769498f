"""``greedy_weighted``: greedy that also chooses ``replica_share`` (weighted dispatch).

Per layer, the better of two structures, each with its optimal shares (an LP,
`shares.optimal_shares`): the even-split greedy placement (`even_split.place_even`, never
worse than DeepSeek's) and the chain layout designed for shares (`shares.chain_layout`), which
with ``P - E >= G - 1`` spare slots usually reaches ``total / G``. With ``rdma_weight > 0``
the traffic-aware greedy placement (`traffic_packing`) gets optimal shares instead.
``meta["solver"]["structure"]`` says which structure each layer took.
"""

from __future__ import annotations

import numpy as np

from eplb.placement import Placement
from eplb.solvers.even_split import place_even
from eplb.solvers.layout import duplicates
from eplb.solvers.registry import register
from eplb.solvers.shares import chain_layout, optimal_shares
from eplb.solvers.traffic_packing import pack_traffic
from eplb.solvers.validation import NonNegFloat, NonNegInt
from eplb.tolerance import better
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
        return Placement(base, E, topology, share, meta={"solver": info})
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
    return Placement(base, E, topology, share, meta={"solver": info})
