"""Set partitions by dynamic programming over subsets (group-to-node assignment).

``f: float[2**n, X]`` gives a value for every subset (bit mask) of ``n`` items and each of
``X`` rows; `best_partitions` finds, per row, the partition of all items into ``num_parts``
non-empty blocks minimising the largest block value. Cost ``O(num_parts * 3**n)`` vector
operations, fine for ``n <= 10``.
"""

from __future__ import annotations

import numpy as np


def best_partitions(f: np.ndarray, num_parts: int) -> tuple[np.ndarray, np.ndarray]:
    """For ``f: float[2**n, X]`` (a value per subset of ``n`` items and row), ``(value:
    float64[X], masks: int64[X, num_parts])``: the min over partitions of the
    max block value (``inf`` where impossible) and the blocks of a best partition (the last
    block holds the lowest item of each remaining set)."""
    size, X = f.shape
    full = size - 1
    best = [f.copy()]
    choice = [np.zeros((size, X), dtype=np.int64)]
    for _ in range(num_parts - 1):
        prev = best[-1]
        nxt = np.full_like(prev, np.inf)
        pick = np.zeros((size, X), dtype=np.int64)
        for mask in range(1, size):
            low = mask & -mask
            rest = mask ^ low
            sub = rest
            while True:
                s = sub | low  # the block holding the lowest item
                if s != mask:
                    cand = np.maximum(f[s], prev[mask ^ s])
                    take = cand < nxt[mask]
                    nxt[mask] = np.where(take, cand, nxt[mask])
                    pick[mask] = np.where(take, s, pick[mask])
                if sub == 0:
                    break
                sub = (sub - 1) & rest
        best.append(nxt)
        choice.append(pick)
    masks = np.zeros((X, num_parts), dtype=np.int64)
    for x in range(X):
        mask = full
        for k in range(num_parts - 1, 0, -1):
            s = int(choice[k][mask, x])
            masks[x, k] = s
            mask ^= s
        masks[x, 0] = mask
    return best[-1][full].copy(), masks
