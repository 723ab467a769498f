"""Packing against several load scenarios at once (``robust``'s ``scenarios``): LPT and swaps
minimising the mean (or the largest) over the scenarios of the largest GPU load.
docs/solvers.md, "How the building blocks work".
"""

from __future__ import annotations

import numpy as np

from eplb.solvers.primitives.replication import per_replica

OBJECTIVES = ("mean", "worst")


def _agg(m: np.ndarray, how: str) -> np.ndarray:
    """Objective of per-scenario maxima ``m: [..., K]``; ``worst`` breaks ties by the mean."""
    if how == "worst":
        return m.max(-1) + 1e-9 * m.mean(-1)
    return m.mean(-1)


def _per_replica(scen: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``float64[X, K, E]`` load of one replica per scenario."""
    X, K, E = scen.shape
    c = np.broadcast_to(counts[:, None, :], scen.shape).reshape(X * K, E)
    return per_replica(scen.reshape(X * K, E), c).reshape(X, K, E)


def objective(scen: np.ndarray, phy2log: np.ndarray, slots_per_gpu: int, how: str = "mean"):
    """``float64[X]`` objective of tables ``phy2log: int64[X, P]`` under scenarios ``scen:
    float[X, K, E]`` (even split)."""
    X, K, E = scen.shape
    cnt = np.zeros((X, E), dtype=np.int64)
    np.add.at(cnt, (np.arange(X)[:, None], phy2log), 1)
    per = _per_replica(scen, cnt)
    v = np.take_along_axis(per, np.broadcast_to(phy2log[:, None, :], (X, K, phy2log.shape[1])), 2)
    gpu = v.reshape(X, K, -1, slots_per_gpu).sum(-1)  # [X, K, G]
    return _agg(gpu.max(-1), how)


def lpt(
    scen: np.ndarray, counts: np.ndarray, num_gpus: int, slots_per_gpu: int, how: str = "mean"
) -> np.ndarray:
    """Greedy scenario packing of ``scen: float[X, K, E]`` with ``counts: int64[X, E]``;
    ``slot_e: int64[X, G, S]`` (docs/solvers.md)."""
    X, K, E = scen.shape
    G, S = num_gpus, slots_per_gpu
    per = _per_replica(scen, counts)  # [X, K, E]
    P = G * S
    rows = np.arange(X)
    item_e = np.repeat(np.tile(np.arange(E), X), counts.ravel()).reshape(X, P)
    key = np.take_along_axis(per.mean(1), item_e, 1)
    item_e = np.take_along_axis(item_e, np.argsort(-key, axis=1, kind="stable"), 1)
    gpu = np.zeros((X, G, K))
    fill = np.zeros((X, G), dtype=np.int64)
    holds = np.zeros((X, E, G), dtype=bool)
    slot_e = np.zeros((X, G, S), dtype=np.int64)
    for j in range(P):
        e = item_e[:, j]
        v = per[rows, :, e]  # [X, K]
        top = gpu.max(1)  # [X, K]
        score = _agg(np.maximum(top[:, None, :], gpu + v[:, None, :]), how)  # [X, G]
        mean = gpu.mean(-1)
        score = score + 1e-9 * mean / np.maximum(mean.max(1, keepdims=True), 1e-300)
        full = fill >= S
        g = np.where(full | holds[rows, e], np.inf, score).argmin(1)
        stuck = full[rows, g] | holds[rows, e, g]  # every free GPU holds e: allow a duplicate
        if stuck.any():
            g[stuck] = np.where(full[stuck], np.inf, score[stuck]).argmin(1)
        slot_e[rows, g, fill[rows, g]] = e
        fill[rows, g] += 1
        gpu[rows, g] += v
        holds[rows, e, g] = True
    return slot_e


def _rest_max(gpu: np.ndarray, a: np.ndarray) -> np.ndarray:
    """``[n, G, K]``: largest load over GPUs other than ``a`` (per row) and ``b`` (axis 1)."""
    n, G, K = gpu.shape
    order = np.argsort(gpu, axis=1)[:, ::-1][:, :3]  # [n, 3, K] top GPUs per scenario
    top = np.take_along_axis(gpu, order, 1)
    if G < 3:
        pad = 3 - G
        order = np.concatenate([order, np.full((n, pad, K), -1)], 1)
        top = np.concatenate([top, np.full((n, pad, K), -np.inf)], 1)
    b = np.arange(G)[None, :, None, None]
    idx = order[:, None, :, :]  # [n, 1, 3, K]
    ok = (idx != a[:, None, None, None]) & (idx != b)  # [n, G, 3, K]
    first = ok.argmax(2)  # first of the top 3 not excluded
    tops = np.broadcast_to(top[:, None], ok.shape)
    return np.take_along_axis(tops, first[:, :, None], 2)[:, :, 0]


def improve(
    slot_e: np.ndarray, scen: np.ndarray, counts: np.ndarray, how: str = "mean", budget: int = 1000
) -> int:
    """Swap search on ``slot_e: int64[X, G, S]`` in place (``scen: float[X, K, E]``,
    ``counts: int64[X, E]``); returns the steps run."""
    X, G, S = slot_e.shape
    if G < 2:
        return 0
    K, E = scen.shape[1:]
    per = _per_replica(scen, counts)
    sv = np.take_along_axis(per, slot_e.reshape(X, 1, G * S), 2).reshape(X, K, G, S)
    sv = sv.transpose(0, 2, 3, 1).copy()  # [X, G, S, K]
    gpu = sv.sum(2)  # [X, G, K]
    holds = np.zeros((X, E, G), dtype=np.int64)
    np.add.at(holds, (np.arange(X)[:, None, None], slot_e, np.arange(G)[None, :, None]), 1)
    active = np.arange(X)
    steps = 0
    while active.size and steps < budget:
        steps += 1
        n = active.size
        r = np.arange(n)
        gp = gpu[active]
        top = gp.max(1)  # [n, K]
        crit = (gp >= top[:, None, :] * (1 - 1e-12)).sum(-1)  # scenarios where g is busiest
        a = crit.argmax(1)
        la = gp[r, a]  # [n, K]
        va, vb = sv[active, a], sv[active]  # [n, S, K], [n, G, S, K]
        d = va[:, None, :, None, :] - vb[:, :, None, :, :]  # [n, G, Sa, Sb, K]
        new_max = np.maximum(la[:, None, None, None, :] - d, gp[:, :, None, None, :] + d)
        rest = _rest_max(gp, a)  # [n, G, K]
        obj = _agg(np.maximum(rest[:, :, None, None, :], new_max), how)  # [n, G, Sa, Sb]
        cur = _agg(top, how)
        ea, eb = slot_e[active, a], slot_e[active]  # [n, Sa], [n, G, Sb]
        ok = (
            holds[active[:, None, None], ea[:, :, None], np.arange(G)[None, None, :]] == 0
        ).transpose(0, 2, 1)[:, :, :, None]  # a's expert not on b
        ok = ok & (holds[active[:, None, None], eb, a[:, None, None]] == 0)[:, :, None, :]
        ok[r, a] = False
        obj = np.where(ok, obj, np.inf).reshape(n, -1)
        best = obj.argmin(1)
        good = obj[r, best] < cur * (1 - 1e-9) - 1e-12
        if not good.any():
            break
        lay = active[good]
        aa = a[good]
        b, ia, ib = np.unravel_index(best[good], (G, S, S))
        e1, e2 = slot_e[lay, aa, ia], slot_e[lay, b, ib]
        v1, v2 = sv[lay, aa, ia], sv[lay, b, ib]
        slot_e[lay, aa, ia], slot_e[lay, b, ib] = e2, e1
        sv[lay, aa, ia], sv[lay, b, ib] = v2, v1
        gpu[lay, aa] += v2 - v1
        gpu[lay, b] += v1 - v2
        np.subtract.at(holds, (lay, e1, aa), 1)
        np.add.at(holds, (lay, e1, b), 1)
        np.subtract.at(holds, (lay, e2, b), 1)
        np.add.at(holds, (lay, e2, aa), 1)
        active = lay
    return steps


def pack(
    scen: np.ndarray,
    counts: np.ndarray,
    num_gpus: int,
    slots_per_gpu: int,
    *,
    how: str = "mean",
    budget: int = 1000,
) -> np.ndarray:
    """`lpt` then `improve` for ``scen: float[X, K, E]`` and ``counts: int64[X, E]``:
    ``phy2log: int64[X, P]``."""
    slot_e = lpt(scen, counts, num_gpus, slots_per_gpu, how)
    improve(slot_e, scen, counts, how, budget)
    return slot_e.reshape(slot_e.shape[0], -1)
