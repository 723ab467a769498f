"""Two slots per GPU (``S = 2``, DeepSeek's decode setting): the sorted pairing and the count
local search used by ``greedy`` (the exact method is `solvers.pairing_exact`).

With two replicas per GPU and fixed replica counts, pairing the heaviest replica with the
lightest, the second heaviest with the second lightest, and so on minimises the largest pair
sum (exchange argument: if ``a >= b`` and ``c >= d`` then ``max(a + d, b + c) <= max(a + c,
b + d)``). So the whole problem is a choice of counts ``c_e``: minimise over count vectors the
value ``max_i x_(i) + x_(P+1-i)`` of the sorted per-replica loads ``x``. `improve_counts`
moves one replica at a time from a start (DeepSeek's or the water-filling counts) while the
objective drops; `pair_layout` turns counts into GPUs.
"""

from __future__ import annotations

import numpy as np

from solvers.packing import Packed, repair_duplicates
from solvers.replication import per_replica
from solvers.tolerance import better


def pair_objective(load: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``float64[X]`` largest pair sum of the sorted pairing for ``counts: int64[X, E]``."""
    X, E = counts.shape
    P = int(counts[0].sum())
    items = np.repeat(per_replica(load, counts).ravel(), counts.ravel()).reshape(X, P)
    items.sort(axis=1)
    return (items + items[:, ::-1]).max(1)


def improve_counts(
    load: np.ndarray,
    counts: np.ndarray,
    cap,
    *,
    budget: int = 200,
    receivers: int = 16,
    light_receivers: int = 4,
    present: np.ndarray | None = None,
    distinct: bool = True,
) -> np.ndarray:
    """Local search over counts for ``S = 2``: move one replica between experts while the
    pair objective strictly drops (best move per step). Vectorised over rows
    ``load: float[X, E]``, ``counts: int64[X, E]``.

    Receivers tried per step: the experts of the critical (largest) pair, the ``receivers``
    experts with the largest replicas and the ``light_receivers`` experts with the smallest
    next replica; donors: every expert with two or more replicas. A move is evaluated by
    merging the changed replicas into the sorted list (no re-sort). ``cap``: int or
    ``int[X, 1]`` replica limit; ``present: bool[X, E]`` experts that exist (default all).
    ``distinct``: reject moves whose two middle replicas are equal (the sign that the sorted
    pairing puts two replicas of one expert on a GPU), for placements without duplicates.
    """
    counts = counts.copy()
    X, E = counts.shape
    cap_all = np.broadcast_to(np.asarray(cap), (X, 1))
    present = np.ones((X, E), dtype=bool) if present is None else present
    P = int(counts[0].sum())
    best = pair_objective(load, counts)
    active = np.arange(X)
    for _ in range(budget):
        if not active.size:
            break
        w, c = load[active], counts[active]
        n = active.size
        r = np.arange(n)
        cap = cap_all[active]
        room = present[active] & (c < cap)
        size = per_replica(w, c)
        items_e = np.repeat(np.broadcast_to(np.arange(E), (n, E)).ravel(), c.ravel()).reshape(n, P)
        items_s = np.take_along_axis(size, items_e, 1)
        order = np.argsort(items_s, axis=1, kind="stable")
        xe = np.take_along_axis(items_e, order, 1)
        xs = np.take_along_axis(items_s, order, 1)
        i = (xs + xs[:, ::-1]).argmax(1)
        nxt = np.where(room, w / (c + 1), np.inf)
        light = np.argsort(nxt, axis=1, kind="stable")[:, :light_receivers]
        heavy = np.argsort(-np.where(room, size, -np.inf), axis=1, kind="stable")
        recv = np.concatenate(
            [xe[r, P - 1 - i][:, None], xe[r, i][:, None], heavy[:, :receivers], light], 1
        )
        D = int((c >= 2).sum(1).max(initial=0))
        if D == 0:
            break
        donors = np.sort(np.where(c >= 2, np.arange(E), E), axis=1)[:, :D]  # [n, D], E = none
        R = recv.shape[1]
        ri = np.repeat(recv, D, axis=1)  # [n, R*D]
        di = np.tile(donors, (1, R))
        di_c = np.minimum(di, E - 1)
        ca = np.take_along_axis(c, di_c, 1)
        cb = np.take_along_axis(c, ri, 1)
        wa = np.take_along_axis(w, di_c, 1)
        wb = np.take_along_axis(w, ri, 1)
        sa = wa / np.maximum(ca - 1, 1)
        sb = wb / (cb + 1)
        floor = np.minimum(xs[:, :1], sb)  # the smallest replica after the move is >= floor
        valid = (di < E) & (di != ri) & np.take_along_axis(room, ri, 1)
        valid &= sa + floor < best[active][:, None]
        obj = np.full(valid.shape, np.inf)
        rows, cols = np.nonzero(valid)
        obj[rows, cols] = _moved_objective(
            xs[rows],
            xe[rows],
            di[rows, cols],
            ri[rows, cols],
            ca[rows, cols],
            cb[rows, cols],
            sa[rows, cols],
            sb[rows, cols],
            distinct,
        )
        j = obj.argmin(1)
        gain = better(obj[r, j], best[active])
        g = r[gain]
        counts[active[g], di[g, j[g]]] -= 1
        counts[active[g], ri[g, j[g]]] += 1
        best[active[g]] = obj[g, j[g]]
        active = active[g]
    return counts


def _moved_objective(xs, xe, a, b, ca, cb, sa, sb, distinct, chunk: int = 1 << 21) -> np.ndarray:
    """Pair objective after moving one replica from expert ``a`` to ``b`` (``[K]`` moves).

    ``xs, xe: [K, P]`` sorted replica sizes and experts before the move; ``ca, cb`` the
    counts before; ``sa = w_a / (ca - 1)``, ``sb = w_b / (cb + 1)`` the new replica sizes.
    """
    K, P = xs.shape
    out = np.empty(K)
    step = max(1, chunk // max(P, 1))
    pos = np.arange(P)
    for lo in range(0, K, step):
        sl = slice(lo, lo + step)
        x, e = xs[sl], xe[sl]
        A, B = a[sl, None], b[sl, None]
        na, nb = (ca[sl] - 1)[:, None], (cb[sl] + 1)[:, None]
        ya, yb = sa[sl, None], sb[sl, None]
        keep = (e != A) & (e != B)
        rank = np.cumsum(keep, axis=1) - 1
        idx = rank + na * (ya < x) + nb * (yb < x)
        idx = np.where(keep, idx, P)
        y = np.zeros((x.shape[0], P + 1))
        np.put_along_axis(y, idx, x, axis=1)
        y = y[:, :P]
        start_a = (keep & (x <= ya)).sum(1, keepdims=True) + nb * (yb < ya)
        start_b = (keep & (x <= yb)).sum(1, keepdims=True) + na * (ya <= yb)
        y = np.where((pos >= start_a) & (pos < start_a + na), ya, y)
        y = np.where((pos >= start_b) & (pos < start_b + nb), yb, y)
        out[sl] = (y + y[:, ::-1]).max(1)
        if distinct:
            out[sl] = np.where(y[:, P // 2 - 1] == y[:, P // 2], np.inf, out[sl])
    return out


def pair_layout(load: np.ndarray, counts: np.ndarray, *, repair: bool = True) -> Packed:
    """Sorted pairing as a packing: GPU ``g`` holds the ``g``-th heaviest and the ``g``-th
    lightest replica. Equal-size replicas are interleaved by expert so that a GPU gets two
    replicas of one expert only when unavoidable; with ``repair`` remaining duplicates are
    swapped away when a swap exists (`packing.repair_duplicates`, may raise the max)."""
    X, E = counts.shape
    P = int(counts[0].sum())
    G = P // 2
    size = per_replica(load, counts)
    items_e = np.repeat(np.broadcast_to(np.arange(E), (X, E)).ravel(), counts.ravel()).reshape(X, P)
    items_s = np.take_along_axis(size, items_e, 1)
    order = np.lexsort((items_e, _ordinal(items_e), -items_s), axis=1)
    se = np.take_along_axis(items_e, order, 1)
    ss = np.take_along_axis(items_s, order, 1)
    slot_e = np.stack([se[:, :G], se[:, ::-1][:, :G]], axis=2)
    slot_s = np.stack([ss[:, :G], ss[:, ::-1][:, :G]], axis=2)
    holds = np.zeros((X, E, G), dtype=np.int16)
    xs = np.repeat(np.arange(X), 2 * G)
    np.add.at(holds, (xs, slot_e.ravel(), np.tile(np.repeat(np.arange(G), 2), X)), 1)
    packed = Packed(slot_e, slot_s, slot_s.sum(2), holds)
    if repair and packed.duplicates().any():
        repair_duplicates(packed)
    return packed


def _ordinal(items_e: np.ndarray) -> np.ndarray:
    """``int64[X, P]`` ordinal of each item among the (adjacent) items of its expert."""
    X, P = items_e.shape
    new = np.ones((X, P), dtype=bool)
    new[:, 1:] = items_e[:, 1:] != items_e[:, :-1]
    pos = np.broadcast_to(np.arange(P), (X, P))
    return pos - np.maximum.accumulate(np.where(new, pos, 0), axis=1)
