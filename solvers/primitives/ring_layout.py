"""A ring of replicated experts through all GPUs (``robust``'s ``layout="ring"``), so that
``lp`` dispatch can move load between any two GPUs; single replicas fill the rest by LPT.
docs/solvers.md, "robust" and "How the building blocks work".
"""

from __future__ import annotations

import numpy as np

from eplb.solvers.primitives.replication import per_replica


def _ring_order(per: np.ndarray, flex: np.ndarray) -> np.ndarray:
    """Flexible experts heaviest, lightest, second heaviest, second lightest, ..."""
    srt = flex[np.argsort(-per[flex], kind="stable")]
    out = np.empty_like(srt)
    half = (srt.size + 1) // 2
    out[0::2] = srt[:half]
    out[1::2] = srt[half:][::-1]
    return out


def ring_layout(
    load: np.ndarray, counts: np.ndarray, num_gpus: int, slots_per_gpu: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(phy2log: int64[L, P], ok: bool[L])`` for ``load: float[L, E]`` and replica counts
    ``counts: int64[L, E]`` (rows summing to ``G * S``, every count in ``1..G``); see
    docs/solvers.md. Rows with ``ok`` False hold an incomplete table (use another layout)."""
    L, E = load.shape
    G, S = num_gpus, slots_per_gpu
    per = per_replica(load, counts)
    slot_e = np.full((L, G, S), -1, dtype=np.int64)
    fill = np.zeros((L, G), dtype=np.int64)
    gpu = np.zeros((L, G))
    ok = np.ones(L, dtype=bool)
    for layer in range(L):
        pos = 0
        for e in _ring_order(per[layer], np.nonzero(counts[layer] >= 2)[0]):
            c = int(counts[layer, e])
            gs = (pos + np.arange(c)) % G
            if c > G or (fill[layer, gs] >= S).any():
                ok[layer] = False
                break
            slot_e[layer, gs, fill[layer, gs]] = e
            fill[layer, gs] += 1
            gpu[layer, gs] += per[layer, e]
            pos += c - 1
    singles = np.where(counts == 1, per, -np.inf)
    order = np.argsort(-singles, axis=1, kind="stable")  # singles heaviest first, then the rest
    rows = np.arange(L)
    for k in range(int((counts == 1).sum(1).max(initial=0))):
        e = order[:, k]
        live = ok & (counts[rows, e] == 1)
        g = np.where(fill >= S, np.inf, gpu).argmin(1)
        r, gg, ee = rows[live], g[live], e[live]
        slot_e[r, gg, fill[r, gg]] = ee
        fill[r, gg] += 1
        gpu[r, gg] += per[r, ee]
    ok &= (fill == S).all(1)
    return slot_e.reshape(L, G * S), ok
