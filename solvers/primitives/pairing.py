"""Two slots per GPU: the sorted pairing (heaviest replica with the lightest, which minimises
the largest pair) and `improve_counts`, the count local search ``greedy`` uses; the exact
method is `solvers.primitives.pairing_exact`. docs/solvers.md, "Two slots per GPU".
"""

from __future__ import annotations

import numpy as np

from eplb.solvers.primitives import jit, pairing_jit
from eplb.solvers.primitives.packing import Packed, repair_duplicates
from eplb.solvers.primitives.replication import per_replica
from eplb.tolerance import better

REBUILD_CELLS = 250_000  # moves x replicas per step up to which `rebuilt_objectives` is used


def pair_objective(load: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``float64[X]`` largest pair sum of the sorted pairing of ``load: float[X, E]`` with
    ``counts: int64[X, E]``."""
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
    distinct: bool | np.ndarray = True,
    load_id: np.ndarray | None = None,
) -> np.ndarray:
    """Local search over counts for ``S = 2``: move one replica between experts while the
    pair objective strictly drops (best move per step). Vectorised over rows
    ``load: float[X, E]``, ``counts: int64[X, E]``.

    Receivers tried per step: the experts of the critical (largest) pair, the ``receivers``
    experts with the largest replicas and the ``light_receivers`` experts with the smallest
    next replica; donors: every expert with two or more replicas. Moves that keep a pair as
    large as the critical one (a count test) are dropped, the others' objectives computed
    exactly (`rebuilt_objectives`, or `moved_objectives` for many moves). ``cap``: int or
    ``int[X, 1]`` replica limit; ``present: bool[X, E]`` experts that exist (default all).
    ``distinct: bool | bool[X]`` (per row): reject moves whose two middle replicas are equal
    (the sign that the sorted pairing puts two replicas of one expert on a GPU), for
    placements without duplicates. ``load_id: int[X]``: rows with equal ids have equal
    ``load``, ``cap`` and ``present`` (e.g. the same layer searched with and without
    ``distinct``); while their counts agree their moves are evaluated once.
    """
    counts = counts.copy()
    X, E = counts.shape
    cap_all = np.broadcast_to(np.asarray(cap), (X, 1))
    present = np.ones((X, E), dtype=bool) if present is None else present
    distinct_all = np.broadcast_to(np.asarray(distinct, dtype=bool), (X,))
    if load.dtype == np.float64 and jit.available():  # compiled (the ``fast`` extra)
        return pairing_jit.improve_counts_jit(
            load, counts, cap_all[:, 0], budget, receivers, light_receivers, present,
            distinct_all, np.arange(X) if load_id is None else load_id,
        ).astype(counts.dtype, copy=False)
    P = int(counts[0].sum())
    best = pair_objective(load, counts)
    active = np.arange(X)
    experts = np.arange(E)
    load_id = np.arange(X) if load_id is None else np.asarray(load_id)
    mix = np.random.default_rng(0).integers(1, 2**62, size=E)  # fixed hash of a count row
    for _ in range(budget):
        if not active.size:
            break
        # rows in the same state (same load, same counts) share one evaluation
        rep, back = _same_state(load_id[active], counts[active], mix)
        ids = active[rep]
        w, c = load[ids], counts[ids]
        n = ids.size
        r = np.arange(n)
        rc = r[:, None]
        room = present[ids] & (c < cap_all[ids])
        size = per_replica(w, c)
        # the sorted replicas: experts by replica size (stable: equal sizes in expert order,
        # as a stable sort of the replicas), each repeated by its count
        order = np.argsort(size, axis=1, kind="stable")
        c_o = c[rc, order]
        xs = np.repeat(size[rc, order].ravel(), c_o.ravel()).reshape(n, P)
        ends = np.cumsum(c_o, 1)
        first = np.empty((n, E), dtype=np.int64)  # first sorted position of each expert
        first[rc, order] = ends - c_o
        i = (xs + xs[:, ::-1]).argmax(1)
        lo_at = np.minimum(i, P - 1 - i)  # the critical pair: ranks lo_at, P - 1 - lo_at
        crit = order[rc, (ends[:, None, :] <= np.stack([P - 1 - i, i], 1)[:, :, None]).sum(2)]
        nxt = np.where(room, w / (c + 1), np.inf)
        light = _smallest(nxt, light_receivers)
        heavy = _smallest(-np.where(room, size, -np.inf), receivers)
        recv = np.concatenate([crit, heavy, light], 1)  # [n, R]
        D = int((c >= 2).sum(1).max(initial=0))
        if D == 0:
            break
        donors = np.sort(np.where(c >= 2, experts, E), axis=1)[:, :D]  # [n, D], E = none
        R = recv.shape[1]
        don = np.minimum(donors, E - 1)
        ca, cb = c[rc, don], c[rc, recv]
        sa = w[rc, don] / np.maximum(ca - 1, 1)
        sb = w[rc, recv] / (cb + 1)
        bst = best[ids]
        floor = np.minimum(xs[:, :1], sb)  # the smallest replica after the move is >= floor
        # a receiver listed twice: its later column repeats the earlier one's moves (the
        # argmin takes the first of equal values), so it is not evaluated
        again = (recv[:, :, None] == recv[:, None, :]) & np.tri(R, R, -1, dtype=bool)
        valid = (
            (donors < E)[:, None, :]
            & (donors[:, None, :] != recv[:, :, None])
            & (room[rc, recv] & ~again.any(2))[:, :, None]
            & (sa[:, None, :] + floor[:, :, None] < bst[:, None, None])
        )  # [n, R, D]: receiver-major, as the moves' columns
        # the critical pair (lo, hi): a move leaving at least P + 1 replicas at or above hi
        # and at or above lo in total keeps a pair summing to at least lo + hi, the current
        # objective, so it is no improvement (the replicas >= hi are the top ranks); the
        # count is the row's, minus the donor's and receiver's replicas before, plus after
        lo, hi = xs[r, lo_at][:, None], xs[r, P - 1 - lo_at][:, None]
        oa, ob = size[rc, don], size[rc, recv]
        f_a = (ca - 1) * ((sa >= hi).astype(np.int64) + (sa >= lo)) - ca * (
            (oa >= hi).astype(np.int64) + (oa >= lo)
        )
        g_b = (cb + 1) * ((sb >= hi).astype(np.int64) + (sb >= lo)) - cb * (
            (ob >= hi).astype(np.int64) + (ob >= lo)
        )
        slack = P - (xs >= hi).sum(1) - (xs >= lo).sum(1)
        keep = better(lo + hi, bst[:, None])[:, :, None]
        valid &= (g_b[:, :, None] + f_a[:, None, :] <= slack[:, None, None]) | keep
        rows, rj, dj = np.nonzero(valid)
        evaluate = rebuilt_objectives if rows.size * P <= REBUILD_CELLS else moved_objectives
        val, tie = evaluate(
            xs,
            first,
            rows,
            donors[rows, dj],
            recv[rows, rj],
            ca[rows, dj],
            cb[rows, rj],
            sa[rows, dj],
            sb[rows, rj],
            *([bst[rows]] if evaluate is moved_objectives else []),
        )
        cols = rj * D + dj
        obj0 = np.full((n, R * D), np.inf)
        obj0[rows, cols] = val
        ties = np.zeros((n, R * D), dtype=bool)
        ties[rows, cols] = tie
        # back to the active rows; distinct rows reject moves with equal middle replicas
        obj = np.where(distinct_all[active][:, None] & ties[back], np.inf, obj0[back])
        r = np.arange(active.size)
        j = obj.argmin(1)
        gain = better(obj[r, j], best[active])
        g = r[gain]
        jg, bg = j[g], back[g]
        counts[active[g], donors[bg, jg % D]] -= 1
        counts[active[g], recv[bg, jg // D]] += 1
        best[active[g]] = obj[g, jg]
        active = active[g]
    return counts


def _smallest(key: np.ndarray, k: int) -> np.ndarray:
    """``int64[n, min(k, E)]``: the first ``k`` columns of the stable argsort of ``key: float[n,
    E]`` (no NaN); by a partition for many rows, where it is cheaper than the full sort."""
    n, E = key.shape
    k = min(k, E)
    if n < 8:
        return np.argsort(key, axis=1, kind="stable")[:, :k]
    kth = np.partition(key, k - 1, axis=1)[:, k - 1 : k]
    below = key < kth
    tied = key == kth  # the first of these (by index) fill the k places
    take = below | (tied & (np.cumsum(tied, 1) <= k - below.sum(1, keepdims=True)))
    idx = np.nonzero(take)[1].reshape(n, k)
    rc = np.arange(n)[:, None]
    return idx[rc, np.argsort(key[rc, idx], axis=1, kind="stable")]


def _same_state(
    load_id: np.ndarray, counts: np.ndarray, mix: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(rep, back)``: representative rows of the distinct (load, counts) states and the
    state of every row (``counts[rep][back] == counts``); rows are merged only when their
    counts are verified equal, so a hash collision just keeps them apart."""
    with np.errstate(over="ignore"):
        key = counts @ mix + load_id * np.int64(0x9E3779B97F4A7C15 - 2**64)
    _, rep, back = np.unique(key, return_index=True, return_inverse=True)
    back = back.ravel()
    if (load_id[rep][back] != load_id).any() or (counts[rep][back] != counts).any():
        n = counts.shape[0]
        return np.arange(n), np.arange(n)
    return rep, back


def moved_objectives(
    xs, first, row, a, b, ca, cb, sa, sb, bound=None
) -> tuple[np.ndarray, np.ndarray]:
    """Exact pair objective after moving one replica from expert ``a`` to ``b``, for ``K``
    moves on the sorted rows ``xs: float64[n, P]`` (``first: int64[n, E]`` the first position
    of each expert's run in its row; ``row, a, b, ca, cb, sa, sb: [K]``: the move's row
    (ascending), experts, counts before, and new replica sizes ``w_a / (ca - 1)`` and
    ``w_b / (cb + 1)``). Returns ``float64[K]`` objectives and ``bool[K]``: the two middle
    replicas of the new list are equal (the sorted pairing then puts two replicas of one
    expert on a GPU). ``bound: float64[K]``: moves whose objective is provably not below it
    (not `tolerance.better`), by the pairs of the two new blocks' first replicas, are
    returned as ``inf`` without the full evaluation.

    Without rebuilding the list: the new sorted list is the kept replicas (the row without
    ``a``'s and ``b``'s runs), each shifted by a constant on at most five pieces, with the
    ``ca - 1`` new replicas of ``a`` and ``cb + 1`` of ``b`` inserted as two blocks. Pairing
    rank ``r`` with ``P - 1 - r`` cuts the ranks into at most 14 segments on which both sides
    come from one piece or block; a segment of two kept pieces with shifts ``t`` and ``u`` is
    a range of ``x_j + x_{P-1-(t+u)-j}``, whose maximum a sparse table gives in O(1), and a
    segment touching a block is the block's value plus the largest kept value facing it. The
    sums are the same floating-point additions as in the rebuilt list, so the result is
    bit-identical (tested against re-sorting).
    """
    n, P = xs.shape
    K = row.size
    if K == 0:
        return np.empty(0), np.zeros(0, dtype=bool)
    pa, pb = first[row, a], first[row, b]
    oa, ob = xs[row, pa], xs[row, pb]
    na, nb = ca - 1, cb + 1
    le_a = np.empty(K, dtype=np.int64)  # replicas <= sa in the row (before the move)
    le_b = np.empty(K, dtype=np.int64)
    bounds = np.searchsorted(row, np.arange(n + 1))  # rows come sorted (np.nonzero)
    for x in range(n):
        sel = slice(bounds[x], bounds[x + 1])
        le_a[sel] = np.searchsorted(xs[x], sa[sel], "right")
        le_b[sel] = np.searchsorted(xs[x], sb[sel], "right")
    m_a = le_a - ca * (oa <= sa) - cb * (ob <= sa)  # kept replicas <= sa
    m_b = le_b - ca * (oa <= sb) - cb * (ob <= sb)
    a_first = pa < pb
    p1 = np.where(a_first, pa, pb)
    c1 = np.where(a_first, ca, cb)
    c2 = np.where(a_first, cb, ca)
    p2 = np.where(a_first, pb, pa)
    kept = P - ca - cb
    # kept pieces in kept-index space: shifts change at the removed runs and the blocks
    q = np.sort(np.stack([p1, p2 - c1, m_a, m_b], 1), 1)
    q = np.minimum(np.maximum(q, 0), kept[:, None])
    bnd = np.concatenate([np.zeros((K, 1), dtype=np.int64), q, kept[:, None]], 1)  # [K, 6]
    m = bnd[:, :5]
    offset = c1[:, None] * (m >= p1[:, None]) + c2[:, None] * (m >= (p2 - c1)[:, None])
    shift = na[:, None] * (m >= m_a[:, None]) + nb[:, None] * (m >= m_b[:, None])
    delta = shift - offset  # new rank minus old position, per kept piece   [K, 5]
    start = np.empty((K, 7), dtype=np.int64)  # 5 kept pieces, block a, block b (new ranks)
    end = np.empty((K, 7), dtype=np.int64)
    start[:, :5], end[:, :5] = bnd[:, :5] + shift, bnd[:, 1:] + shift
    start[:, 5] = m_a + nb * (sb < sa)
    start[:, 6] = m_b + na * (sa <= sb)
    end[:, 5], end[:, 6] = start[:, 5] + na, start[:, 6] + nb
    empty = start >= end
    shift7 = np.zeros((K, 7), dtype=np.int64)  # per interval: shift of a kept piece
    shift7[:, :5] = delta
    value7 = np.zeros((K, 7))  # value of a block
    value7[:, 5], value7[:, 6] = sa, sb
    H = P // 2
    out = np.full(K, np.inf)
    tie = np.zeros(K, dtype=bool)
    live = np.arange(K)

    def value_at(q, at):  # the replica at new rank q of the moves ``live[at]``
        k = ((start[at] <= q[:, None]) & (q[:, None] < end[at])).argmax(1)
        kept_val = xs[row[at], np.clip(q - shift7[at, k], 0, P - 1)]
        return np.where(k >= 5, value7[at, k], kept_val)

    if bound is not None:  # actual pairs of the new list bound its objective: those at the
        # ranks of the row's three largest pairs and those of each block's first replica;
        # a move whose bound is not below ``bound`` is dropped (checks cheapest-first)
        sums = xs[:, :H] + xs[:, ::-1][:, :H]
        top = np.argsort(-sums, axis=1, kind="stable")[:, :3]
        checks = [("pair", c) for c in range(top.shape[1])] + [("block", 5), ("block", 6)]
        for kind, c in checks:
            if kind == "pair":
                q = top[row[live], c]
                lb = value_at(q, live) + value_at(P - 1 - q, live)
            else:
                lb = value7[live, c] + value_at(P - 1 - start[live, c], live)
            live = live[better(lb, bound[live])]
            if not live.size:
                return out, tie
    tie[live] = value_at(np.full(live.size, H - 1), live) == value_at(np.full(live.size, H), live)
    start, end, empty, shift7, value7 = (v[live] for v in (start, end, empty, shift7, value7))
    row = row[live]
    K = live.size
    # segments: ranks where the interval of r or of its partner P - 1 - r changes
    pts_a = np.where(empty, P, start)
    pts_b = np.where(empty, P, P - end)
    allp = np.concatenate([pts_a, pts_b], 1)  # [K, 14]
    srt = np.argsort(allp, axis=1, kind="stable")
    base = np.arange(K)[:, None]
    lo = allp[base, srt]
    hi = np.empty_like(lo)
    hi[:, :-1] = lo[:, 1:]
    hi[:, -1] = P
    seg = lo < hi
    from_a = srt < 7
    ta = np.cumsum(from_a, 1) - 1
    tb = np.arange(1, 15) - ta - 2
    t = np.argsort(pts_a, axis=1, kind="stable")[base, np.maximum(ta, 0)]
    u = np.argsort(pts_b, axis=1, kind="stable")[base, np.maximum(tb, 0)]
    # per interval: shift (kept pieces) or value (blocks); flat lookups
    t_block, u_block = t >= 5, u >= 5
    flat_t, flat_u = base * 7 + t, base * 7 + u
    dt, du = shift7.ravel()[flat_t], shift7.ravel()[flat_u]
    rr = row[:, None]
    left = np.where(t_block, value7.ravel()[flat_t], xs[rr, np.clip(hi - 1 - dt, 0, P - 1)])
    right = np.where(u_block, value7.ravel()[flat_u], xs[rr, np.clip(P - 1 - lo - du, 0, P - 1)])
    best = np.where(seg, left + right, -np.inf)
    both = seg & ~t_block & ~u_block  # two kept pieces: a range maximum of shifted pair sums
    if both.any():
        kk, ss = np.nonzero(both)
        d = dt[kk, ss] + du[kk, ss]
        lo_j, hi_j = lo[kk, ss] - dt[kk, ss], hi[kk, ss] - dt[kk, ss]
        key, which = np.unique(row[kk] * (2 * P + 1) + (d + P), return_inverse=True)
        lev = np.floor(np.log2(hi_j - lo_j)).astype(np.int64)
        tab = _pair_tables(xs, key // (2 * P + 1), key % (2 * P + 1) - P, int(lev.max()) + 1)
        best[kk, ss] = np.maximum(tab[lev, which, lo_j], tab[lev, which, hi_j - (1 << lev)])
    out[live] = best.max(1)
    return out, tie


def rebuilt_objectives(xs, first, row, a, b, ca, cb, sa, sb) -> tuple[np.ndarray, np.ndarray]:
    """`moved_objectives` (same arguments, same bit-identical results, no bound) by building
    each moved list: O(P) per move in a few whole-array steps, cheaper than the segment
    method for a few moves (its fixed cost is many small array operations)."""
    n, P = xs.shape
    K = row.size
    x = xs[row]  # [K, P]
    pa, pb = first[row, a], first[row, b]
    oa, ob = xs[row, pa], xs[row, pb]
    # kept replicas <= each new size
    m_a = (x <= sa[:, None]).sum(1) - ca * (oa <= sa) - cb * (ob <= sa)
    m_b = (x <= sb[:, None]).sum(1) - ca * (oa <= sb) - cb * (ob <= sb)
    i32 = np.int32 if K * P < 2**31 else np.int64
    na, nb = (ca - 1).astype(i32)[:, None], (cb + 1).astype(i32)[:, None]
    start_a = (m_a + (cb + 1) * (sb < sa)).astype(i32)[:, None]
    start_b = (m_b + (ca - 1) * (sa <= sb)).astype(i32)[:, None]
    end_a, end_b = start_a + na, start_b + nb
    q = np.arange(P, dtype=i32)
    t = q - na * (q >= end_a) - nb * (q >= end_b)  # kept index of rank q
    a_first = pa < pb
    p1 = np.where(a_first, pa, pb).astype(i32)[:, None]
    c1 = np.where(a_first, ca, cb).astype(i32)[:, None]
    c2 = np.where(a_first, cb, ca).astype(i32)[:, None]
    p2 = np.where(a_first, pb, pa).astype(i32)[:, None]
    t += c1 * (t >= p1) + c2 * (t >= p2 - c1)  # its position in the row
    np.minimum(t, P - 1, out=t)
    t += (np.arange(K, dtype=i32) * P)[:, None]
    y = x.ravel()[t]
    y[(q >= start_a) & (q < end_a)] = np.repeat(sa, na.ravel())
    y[(q >= start_b) & (q < end_b)] = np.repeat(sb, nb.ravel())
    return (y + y[:, ::-1]).max(1), y[:, P // 2 - 1] == y[:, P // 2]


def _pair_tables(xs: np.ndarray, rows: np.ndarray, ds: np.ndarray, levels: int) -> np.ndarray:
    """``float64[levels, U, P]``: for each (row, shift ``d``) the maxima of ``x_j +
    x_{P-1-d-j}`` over ``j .. j + 2**k - 1`` at level ``k`` (a sparse table; ``-inf`` where
    the partner falls outside the row)."""
    P = xs.shape[1]
    j = np.arange(P)
    k = P - 1 - ds[:, None] - j[None, :]  # [U, P]
    ok = (k >= 0) & (k < P)
    out = np.empty((levels, len(ds), P))
    g = xs[rows] + np.take_along_axis(xs[rows], np.clip(k, 0, P - 1), 1)
    out[0] = np.where(ok, g, -np.inf)
    for lev in range(1, levels):
        h = 1 << (lev - 1)
        np.maximum(out[lev - 1, :, : P - h], out[lev - 1, :, h:], out=out[lev, :, : P - h])
        out[lev, :, P - h :] = -np.inf
    return out


def _moved_objective(xs, xe, a, b, ca, cb, sa, sb, distinct, chunk: int = 1 << 21) -> np.ndarray:
    """Reference for `moved_objectives`: rebuilds the sorted list of every move (``xs, xe:
    [K, P]`` sorted sizes and experts before each move). O(P) per move; tests only."""
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
    """Sorted pairing of ``load: float[X, E]`` with ``counts: int64[X, E]`` as a packing: GPU
    ``g`` holds the ``g``-th heaviest and the ``g``-th
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
    holds = np.zeros(X * E * G, dtype=np.int16)
    cell = np.arange(X)[:, None] * (E * G) + np.arange(G)  # [X, G] flat (row, expert 0, gpu)
    for s in range(2):  # one replica per GPU and slot: the indices are distinct
        holds[(cell + slot_e[:, :, s] * G).ravel()] += 1
    holds = holds.reshape(X, E, G)
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
