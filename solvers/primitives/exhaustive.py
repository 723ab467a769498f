"""Exact placement of small problems by enumerating every table of ``k`` experts on ``G``
interchangeable GPUs of ``S`` slots (even split, duplicates allowed): what makes
``hierarchical`` exact when small. docs/solvers.md, "How the building blocks work".
"""

from __future__ import annotations

from functools import lru_cache
from itertools import combinations_with_replacement
from math import comb

import numpy as np

MAX_TABLES = 20_000  # largest enumeration per (experts, GPUs, slots)


def num_tables(k: int, num_gpus: int, slots_per_gpu: int) -> int:
    """Upper bound on the tables `tables` enumerates (GPU contents as multisets)."""
    K = comb(k + slots_per_gpu - 1, slots_per_gpu)
    return comb(K + num_gpus - 1, num_gpus)


@lru_cache(maxsize=64)
def tables(k: int, num_gpus: int, slots_per_gpu: int) -> tuple[np.ndarray, np.ndarray]:
    """``(tab: int64[T, G*S], dup: int64[T])``: every table holding each of the ``k``
    experts at least once, GPUs in canonical order, and its duplicate replicas (surplus
    copies of an expert on one GPU). Read-only arrays, cached."""
    S = slots_per_gpu
    gpus = np.array(list(combinations_with_replacement(range(k), S)), dtype=np.int64)
    pick = np.array(list(combinations_with_replacement(range(len(gpus)), num_gpus)), dtype=np.int64)
    tab = gpus[pick].reshape(len(pick), num_gpus * S)
    cnt = np.zeros((len(tab), k), dtype=np.int64)
    np.add.at(cnt, (np.repeat(np.arange(len(tab)), tab.shape[1]), tab.ravel()), 1)
    keep = (cnt >= 1).all(1)
    tab = tab[keep]
    g = tab.reshape(len(tab), num_gpus, S)  # contents sorted inside each GPU
    dup = (g[:, :, 1:] == g[:, :, :-1]).sum((1, 2))
    tab.flags.writeable = False
    dup.flags.writeable = False
    return tab, dup


def best_tables(
    load: np.ndarray, num_gpus: int, slots_per_gpu: int
) -> tuple[np.ndarray, np.ndarray]:
    """Optimal tables for rows ``load: float64[X, k]`` (``k`` experts each).

    Returns ``tab: int64[X, G*S]`` (local expert indices ``0..k-1``) and ``float64[X]`` the
    optimal max GPU loads. The caller checks `num_tables` first.
    """
    X, k = load.shape
    tab, dup = tables(k, num_gpus, slots_per_gpu)
    T = len(tab)
    cnt = np.zeros((T, k), dtype=np.int64)
    np.add.at(cnt, (np.repeat(np.arange(T), tab.shape[1]), tab.ravel()), 1)
    inv = 1.0 / np.take_along_axis(cnt, tab, 1)  # [T, P] share of each slot
    out = np.empty((X, tab.shape[1]), dtype=np.int64)
    val = np.empty(X)
    step = max(1, (1 << 22) // max(T * tab.shape[1], 1))
    for lo in range(0, X, step):
        w = load[lo : lo + step]
        per = w[:, tab] * inv[None]  # [x, T, P]
        mx = per.reshape(len(w), T, num_gpus, slots_per_gpu).sum(3).max(2)  # [x, T]
        best = mx.min(1, keepdims=True)
        tie = mx <= best  # exact ties only: every table's loads are summed the same way
        key = np.where(tie, dup[None, :], np.iinfo(np.int64).max)
        pick = key.argmin(1)
        out[lo : lo + step] = tab[pick]
        val[lo : lo + step] = mx[np.arange(len(w)), pick]
    return out, val
