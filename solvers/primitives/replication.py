"""Replica counts by water-filling, capped at the GPUs: ``waterfill`` gives the next slot to the
largest ``load / count`` (as DeepSeek's ``replicate``) but never more replicas than ``cap``,
which minimises the largest per-replica load. docs/solvers.md, "How the building blocks work".
"""

from __future__ import annotations

import numpy as np


def default_cap(num_experts: int, num_gpus: int, slots_per_gpu: int) -> int:
    """Largest useful replica count: ``G`` when the experts can fill every GPU with distinct
    experts (``E >= S``), else enough replicas for the slots to be filled at all."""
    if num_experts >= slots_per_gpu:
        return num_gpus
    return -(-num_gpus * slots_per_gpu // num_experts)


def waterfill(
    load: np.ndarray,
    num_slots: int | np.ndarray,
    cap: int,
    *,
    present: np.ndarray | None = None,
    bonus: np.ndarray | None = None,
) -> np.ndarray:
    """Replica counts ``int64[X, E]`` for ``load: float[X, E]`` and ``num_slots`` (``int`` or
    ``int[X]``) per row.

    Every present expert gets one slot, then each further slot goes to the present expert
    with the largest ``load / count`` (plus ``bonus[x, e, count]`` if given, a float[X, E, K]
    priority added while ``count < K``) among those below ``cap``; ties go to the lowest index.
    ``present: bool[X, E]`` (default all) marks the experts that exist in a row; absent
    experts get count 0. Slots left once every expert is at ``cap`` are not handed out (the
    caller chooses ``cap`` so this cannot happen for a feasible problem).
    """
    load = np.asarray(load, dtype=np.float64)
    X, E = load.shape
    if present is None:
        present = np.ones((X, E), dtype=bool)
    counts = present.astype(np.int64)
    slots = np.broadcast_to(np.asarray(num_slots, dtype=np.int64), (X,))
    extra = slots - counts.sum(1)
    rows = np.arange(X)
    steps = int(extra.max(initial=0))
    if bonus is None:  # only the chosen entry's priority changes: update it in place
        caps = np.broadcast_to(np.asarray(cap), (X, 1))[:, 0]
        prio = np.where(present & (counts < cap), load / np.maximum(counts, 1), -np.inf)
        for step in range(steps):
            e = prio.argmax(1)
            live = (step < extra) & np.isfinite(prio[rows, e])
            r, e = rows[live], e[live]
            c = counts[r, e] + 1
            counts[r, e] = c
            prio[r, e] = np.where(c < caps[r], load[r, e] / c, -np.inf)
        return counts
    for step in range(steps):
        prio = np.where(present & (counts < cap), load / np.maximum(counts, 1), -np.inf)
        if bonus is not None:
            k = np.minimum(counts, bonus.shape[2] - 1)
            b = np.take_along_axis(bonus, k[:, :, None], 2)[:, :, 0]
            prio = prio + np.where(counts < bonus.shape[2], b, 0.0)
        e = prio.argmax(1)
        live = (step < extra) & np.isfinite(prio[rows, e])
        counts[rows[live], e[live]] += 1
    return counts


def per_replica(load: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``float64[X, E]`` load of one replica of ``load: float[X, E]`` with ``counts: int[X,
    E]`` (``load / count``; 0 where the count is 0)."""
    return np.divide(load, counts, out=np.zeros(np.shape(load)), where=counts > 0)
