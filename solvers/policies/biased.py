"""``biased``: the practitioner's first try (ROCm ATOM's ``--eplb-placement-policy biased``,
ROCm/ATOM PR #1210: "top-K fully replicated"): per layer the hottest experts get a replica on
every GPU, as many as the redundant slots allow (``K = (P - E) // (G - 1)``); the slots left
over give the next hottest experts one more replica each; LPT (`solvers.primitives.packing`)
packs the replicas without two of one expert on a GPU. No swap search: it is a baseline.
``meta["solver"]["fully_replicated"]`` is read from the placement (experts on every GPU).
docs/solvers.md, "biased".
"""

from __future__ import annotations

import numpy as np

from eplb.placement import Placement
from eplb.solvers.primitives.layout import gpu_counts
from eplb.solvers.primitives.packing import lpt
from eplb.solvers.registry import register
from eplb.topology import Topology


def replica_counts(load: np.ndarray, num_gpus: int, num_slots: int) -> np.ndarray:
    """``int64[L, E]`` replicas per expert: the ``K`` hottest of each row of ``load: float[L,
    E]`` on all ``num_gpus`` GPUs, the leftover slots one each to the next hottest (cycling
    over the experts if every one is on every GPU already); rows sum to ``num_slots``."""
    L, E = load.shape
    G, R = num_gpus, num_slots - E
    order = np.argsort(-load, axis=1, kind="stable")  # hottest first, ties by expert id
    counts = np.ones((L, E), dtype=np.int64)
    K = min(R // (G - 1), E) if G > 1 else 0
    rows = np.arange(L)[:, None]
    if K:
        counts[rows, order[:, :K]] = G
    left = R - K * (G - 1)
    if left:
        rest = order[:, K:] if K < E else order
        pick = np.resize(np.arange(rest.shape[1]), left)
        np.add.at(counts, (np.repeat(np.arange(L), left), rest[:, pick].ravel()), 1)
    return counts


@register("biased")
def biased(load: np.ndarray, topology: Topology) -> Placement:
    """Top-K experts fully replicated on ``load: float64[L, E]`` (module docstring);
    deterministic, no options."""
    G, S = topology.num_gpus, topology.slots_per_gpu
    counts = replica_counts(load, G, topology.num_slots)
    phy2log = lpt(load, counts, G, S).phy2log()
    info = {"policy": "biased", "fully_replicated": fully_replicated(phy2log, load.shape[1], S)}
    return Placement(phy2log, load.shape[1], topology, meta={"solver": info})


def fully_replicated(phy2log: np.ndarray, num_experts: int, slots_per_gpu: int) -> int:
    """Experts with a replica on every GPU, the fewest over the layers of ``phy2log:
    int64[L, P]`` (read from the placement: ``K`` where the packing keeps the ``K`` hottest
    on every GPU, every expert when all are)."""
    on = gpu_counts(phy2log, num_experts, slots_per_gpu) > 0  # [L, G, E]
    return int(on.all(1).sum(1).min())
