"""Per-row helpers on slot tables ``phy2log: int64[X, P]`` (a row is a layer, or one layer's
slots of a node): GPU loads, replica counts per GPU, duplicates, moved replicas.

Slot ``p`` of a row lives on GPU ``p // S``. Loads use an even split (``load / count``)
unless ``share: float64[X, P]`` is given. ``-1`` is an empty slot: no expert, no load.
"""

from __future__ import annotations

import numpy as np

from eplb.moves import gpu_moves


def replica_counts(phy2log: np.ndarray, num_experts: int) -> np.ndarray:
    """``int64[X, E]`` replicas of each expert per row of ``phy2log: int64[X, P]``."""
    X = phy2log.shape[0]
    ok = phy2log >= 0
    key = (phy2log + np.arange(X)[:, None] * num_experts)[ok]
    return np.bincount(key, minlength=X * num_experts).reshape(X, num_experts)


def gpu_loads(
    load: np.ndarray, phy2log: np.ndarray, slots_per_gpu: int, share: np.ndarray | None = None
) -> np.ndarray:
    """``float64[X, G]`` GPU loads of tables ``phy2log: int64[X, P]`` for ``load: float[X, E]``
    (``share: float[X, P]``, default the even split)."""
    X, E = load.shape
    if share is None:
        cnt = replica_counts(phy2log, E)
        per = np.take_along_axis(load / np.maximum(cnt, 1), np.maximum(phy2log, 0), 1)
    else:
        per = np.take_along_axis(load, np.maximum(phy2log, 0), 1) * share
    per = np.where(phy2log >= 0, per, 0.0)
    return per.reshape(X, -1, slots_per_gpu).sum(2)


def max_load(load: np.ndarray, phy2log: np.ndarray, slots_per_gpu: int) -> np.ndarray:
    """``float64[X]`` largest GPU load of ``phy2log: int64[X, P]`` for ``load: float[X, E]``
    (even split)."""
    return gpu_loads(load, phy2log, slots_per_gpu).max(1)


def gpu_counts(phy2log: np.ndarray, num_experts: int, slots_per_gpu: int) -> np.ndarray:
    """``int64[X, G, E]`` replicas of each expert on each GPU of ``phy2log: int64[X, P]``."""
    X, P = phy2log.shape
    G = P // slots_per_gpu
    key = (np.arange(X)[:, None] * G + np.arange(P) // slots_per_gpu) * num_experts + phy2log
    key = key[phy2log >= 0]
    return np.bincount(key, minlength=X * G * num_experts).reshape(X, G, num_experts)


def duplicates(phy2log: np.ndarray, slots_per_gpu: int) -> np.ndarray:
    """``int64[X]``: surplus replicas of ``phy2log: int64[X, P]`` sharing a GPU with another
    replica of their expert."""
    e = np.sort(phy2log.reshape(phy2log.shape[0], -1, slots_per_gpu), axis=2)
    return ((e[:, :, 1:] == e[:, :, :-1]) & (e[:, :, 1:] >= 0)).sum((1, 2))


def moved(old: np.ndarray, new: np.ndarray, num_experts: int, slots_per_gpu: int) -> np.ndarray:
    """``int64[X]``: replicas of ``new: int64[X, P]`` that a GPU receives over a link, i.e.
    slots whose expert that GPU did not hold in ``old: int64[X, P]`` (`eplb.moves`, the one
    meaning: reordering, or another copy of an expert already on the GPU, moves nothing)."""
    G = new.shape[-1] // slots_per_gpu
    return gpu_moves(old, new, G).sum(1)
