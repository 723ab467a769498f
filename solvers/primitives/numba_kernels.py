"""The compiled kernels (`solvers.primitives.jit`; imported only where numba is installed: the
``fast`` extra): `search` (the count search of `pairing.improve_counts`), `lpt_fill` (the
placement loop of `packing.lpt`) and `pack_sorted` (the loop of DeepSeek's balanced packing,
`deepseek_kernels._pack_sorted`). Each does the same floating-point operations in the same
order and breaks ties the same way as the numpy code it replaces. Module-level functions so
that numba's on-disk cache finds them again in the next process (compiled once per machine,
loaded in milliseconds after)."""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def stable_order(size):
    """The experts by (size, index): a stable argsort of ``size``."""
    order = np.argsort(size)  # then equal sizes put back in index order
    E = size.size
    t = 0
    while t < E:
        u = t + 1
        while u < E and size[order[u]] == size[order[t]]:
            u += 1
        if u - t > 1:
            order[t:u] = np.sort(order[t:u])
        t = u
    return order

@numba.njit(cache=True, nogil=True)
def sorted_objective(w, c, order, P):
    """The pair objective of counts ``c`` with ``order`` their stable size order."""
    xs = np.empty(P)
    k = 0
    for t in range(order.size):
        e = order[t]
        v = w[e] / c[e] if c[e] > 0 else 0.0
        for _ in range(c[e]):
            xs[k] = v
            k += 1
    best = -np.inf
    for q in range(P):
        s = xs[q] + xs[P - 1 - q]
        if s > best:
            best = s
    return best

@numba.njit(cache=True, nogil=True, inline="always")
def rank_value(q, xs, va, vb, na, nb, start_a, start_b, p1, c1, p2, c2, P):
    """The replica at rank ``q`` of a moved list (`pairing.rebuilt_objectives`' map)."""
    if start_a <= q < start_a + na:
        return va
    if start_b <= q < start_b + nb:
        return vb
    t = q - na * int(q >= start_a + na) - nb * int(q >= start_b + nb)  # its kept index
    t += c1 * int(t >= p1) + c2 * int(t >= p2 - c1)  # its position in the row
    return xs[min(t, P - 1)]

@numba.njit(cache=True, nogil=True)
def smallest(key, k, out, at):
    """``out[at:at + k]``: the first ``k`` of a stable argsort of ``key`` (insertion into a
    sorted list of ``k``; equal keys keep index order)."""
    n = 0
    for e in range(key.size):
        v = key[e]
        if n == k and not v < key[out[at + n - 1]]:
            continue
        j = n if n < k else k - 1  # the slot to fill, then move down
        while j > 0 and v < key[out[at + j - 1]]:
            out[at + j] = out[at + j - 1]
            j -= 1
        out[at + j] = e
        if n < k:
            n += 1

@numba.njit(cache=True, nogil=True)
def reorder(order, size, a, b):
    """``order`` (experts by (size, index)) after ``size[a]`` and ``size[b]`` changed."""
    E = order.size
    j = 0
    for t in range(E):  # drop a and b
        e = order[t]
        if e != a and e != b:
            order[j] = e
            j += 1
    for e in (a, b):  # insert each at its (size, index) place
        t = j
        while t > 0 and (size[order[t - 1]] > size[e]
                         or (size[order[t - 1]] == size[e] and order[t - 1] > e)):
            order[t] = order[t - 1]
            t -= 1
        order[t] = e
        j += 1

@numba.njit(cache=True, nogil=True)
def evaluate(w, c, order, cap, present, P, bst, receivers, light_receivers, keep_factor,
             need_free, need_distinct, res):
    """Best move for the free and the distinct variants: res[0:3] = (obj, donor, recv)
    free, res[3:6] distinct (obj inf: none). ``order``: the experts by (replica size,
    index), as a stable sort of the sizes gives them."""
    E = w.shape[0]
    res[0] = np.inf
    res[3] = np.inf
    room = np.empty(E, dtype=np.bool_)
    size = np.zeros(E)
    for e in range(E):
        room[e] = present[e] and c[e] < cap
        if c[e] > 0:
            size[e] = w[e] / c[e]
    xs = np.empty(P)
    first = np.empty(E, dtype=np.int64)
    ends = np.empty(E, dtype=np.int64)
    k = 0
    for t in range(E):
        e = order[t]
        first[e] = k
        for _ in range(c[e]):
            xs[k] = size[e]
            k += 1
        ends[t] = k
    # the critical pair: first maximum of xs + reversed xs
    i = 0
    top = -np.inf
    for q in range(P):
        s = xs[q] + xs[P - 1 - q]
        if s > top:
            top = s
            i = q
    lo_at = min(i, P - 1 - i)
    H = P // 2
    lo, hi = xs[lo_at], xs[P - 1 - lo_at]
    # receivers: the experts at sorted positions P - 1 - i and i, heavy, light
    nh = min(receivers, E)
    nl = min(light_receivers, E)
    R = 2 + nh + nl
    recv = np.empty(R, dtype=np.int64)
    for col in range(2):
        pos = P - 1 - i if col == 0 else i
        t = 0
        while ends[t] <= pos:
            t += 1
        recv[col] = order[t]
    key = np.empty(E)
    for e in range(E):
        key[e] = -size[e] if room[e] else np.inf
    smallest(key, nh, recv, 2)
    for e in range(E):
        key[e] = w[e] / (c[e] + 1) if room[e] else np.inf
    smallest(key, nl, recv, 2 + nh)
    donors = np.empty(E, dtype=np.int64)
    D = 0
    for e in range(E):
        if c[e] >= 2:
            donors[D] = e
            D += 1
    if D == 0:
        return
    slack = P
    for q in range(P):
        slack -= int(xs[q] >= hi) + int(xs[q] >= lo)
    keep = (lo + hi) < bst * keep_factor
    # donor terms
    sa = np.empty(D)
    fa = np.empty(D, dtype=np.int64)
    for d in range(D):
        a = donors[d]
        ca = c[a]
        sa[d] = w[a] / max(ca - 1, 1)
        oa = size[a]
        fa[d] = (ca - 1) * (int(sa[d] >= hi) + int(sa[d] >= lo)) - ca * (
            int(oa >= hi) + int(oa >= lo))
    best_free = np.inf
    best_dist = np.inf
    for rj in range(R):
        b = recv[rj]
        again = False
        for r2 in range(rj):
            if recv[r2] == b:
                again = True
                break
        if again or not room[b]:
            continue
        cb = c[b]
        sb = w[b] / (cb + 1)
        ob = size[b]
        gb = (cb + 1) * (int(sb >= hi) + int(sb >= lo)) - cb * (int(ob >= hi) + int(ob >= lo))
        floor = min(xs[0], sb)
        for dj in range(D):
            a = donors[dj]
            if a == b:
                continue
            if not (sa[dj] + floor < bst):
                continue
            if not (gb + fa[dj] <= slack or keep):
                continue
            # the moved list, sorted (as `pairing.rebuilt_objectives` builds it): the kept
            # replicas with ca - 1 of sa and cb + 1 of sb inserted; read one rank at a time
            ca = c[a]
            va = sa[dj]
            pa, pb = first[a], first[b]
            oa = size[a]
            na, nb = ca - 1, cb + 1
            le_a = np.searchsorted(xs, va, side="right")
            le_b = np.searchsorted(xs, sb, side="right")
            m_a = le_a - ca * int(oa <= va) - cb * int(ob <= va)
            m_b = le_b - ca * int(oa <= sb) - cb * int(ob <= sb)
            start_a = m_a + nb * int(sb < va)
            start_b = m_b + na * int(va <= sb)
            if pa < pb:
                p1, c1, p2, c2 = pa, ca, pb, cb
            else:
                p1, c1, p2, c2 = pb, cb, pa, ca
            # the largest pair (each pair once, from the old critical pair outward); a
            # move that cannot win for a variant it serves is dropped once a pair reaches
            # that bound (the first of equal objectives wins, so equal cannot)
            bound = best_free if need_free else -np.inf
            if need_distinct and best_dist > bound:
                bound = best_dist
            if bst * keep_factor < bound:  # and it must improve on the row's objective
                bound = bst * keep_factor
            obj = -np.inf
            for t in range(H):
                q = lo_at + t
                if q >= H:
                    q -= H
                s = (rank_value(q, xs, va, sb, na, nb, start_a, start_b, p1, c1, p2, c2, P)
                     + rank_value(P - 1 - q, xs, va, sb, na, nb, start_a, start_b, p1, c1,
                                  p2, c2, P))
                if s > obj:
                    obj = s
                    if obj >= bound:
                        break
            if obj >= bound:
                continue
            tie = (rank_value(H - 1, xs, va, sb, na, nb, start_a, start_b, p1, c1, p2, c2, P)
                   == rank_value(H, xs, va, sb, na, nb, start_a, start_b, p1, c1, p2, c2, P))
            if need_free and obj < best_free:
                best_free = obj
                res[0], res[1], res[2] = obj, a, b
            if need_distinct and not tie and obj < best_dist:
                best_dist = obj
                res[3], res[4], res[5] = obj, a, b

@numba.njit(cache=True, nogil=True)
def search(load, counts, cap, present, distinct, load_id, budget, receivers,
           light_receivers, keep_factor):
    X, E = counts.shape
    P = 0
    for e in range(E):
        P += counts[0, e]
    best = np.empty(X)
    order = np.empty((X, E), dtype=np.int64)
    size = np.zeros(E)
    for x in range(X):
        for e in range(E):
            size[e] = load[x, e] / counts[x, e] if counts[x, e] > 0 else 0.0
        order[x] = stable_order(size)
        best[x] = sorted_objective(load[x], counts[x], order[x], P)
    active = np.ones(X, dtype=np.bool_)
    res = np.empty((X, 6))
    rep = np.empty(X, dtype=np.int64)
    for _ in range(budget):
        n_active = 0
        for x in range(X):
            if not active[x]:
                continue
            n_active += 1
            # an earlier active row with the same load and counts: share its evaluation
            rep[x] = x
            for z in range(x):
                if active[z] and rep[z] == z and load_id[z] == load_id[x]:
                    same = True
                    for e in range(E):
                        if counts[z, e] != counts[x, e]:
                            same = False
                            break
                    if same:
                        rep[x] = z
                        break
        if n_active == 0:
            break
        # which variants each representative needs
        need = np.zeros((X, 2), dtype=np.bool_)
        for x in range(X):
            if active[x]:
                need[rep[x], 1 if distinct[x] else 0] = True
        for x in range(X):
            if active[x] and rep[x] == x:
                evaluate(load[x], counts[x], order[x], cap[x], present[x], P, best[x],
                         receivers, light_receivers, keep_factor, need[x, 0], need[x, 1],
                         res[x])
        moved = False
        for x in range(X):
            if not active[x]:
                continue
            o = 3 if distinct[x] else 0
            r = res[rep[x]]
            obj = r[o]
            if obj < best[x] * keep_factor:
                a, b = int(r[o + 1]), int(r[o + 2])
                counts[x, a] -= 1
                counts[x, b] += 1
                best[x] = obj
                # the row's order (a function of its counts) after the move
                for e in range(E):
                    size[e] = load[x, e] / counts[x, e] if counts[x, e] > 0 else 0.0
                reorder(order[x], size, a, b)
                moved = True
            else:
                active[x] = False
        if not moved:
            break

@numba.njit(cache=True, nogil=True)
def pack_sorted(w, m, per, start, choice, rank):
    """`deepseek_kernels._pack_sorted`'s loop, row by row (``w: float32[X, n]`` heaviest first;
    ``choice``, ``rank``: int64[X, n] filled from item ``start`` on)."""
    X, n = w.shape
    key = np.empty(m, dtype=w.dtype)
    cnt = np.empty(m, dtype=np.int64)
    for x in range(X):
        for p in range(m):
            key[p] = w[x, p] if start else 0
            cnt[p] = 1 if start else 0
        for j in range(start, n):
            p = 0
            for q in range(1, m):
                if key[q] < key[p]:
                    p = q
            choice[x, j] = p
            c = cnt[p]
            rank[x, j] = c
            c += 1
            cnt[p] = c
            key[p] += w[x, j]
            if c >= per:
                key[p] = np.inf


@numba.njit(cache=True, nogil=True)
def lpt_fill(item_s, run, G, S, gpu, gpu_of, slot_of):
    """`packing.lpt`'s placement loop (no node penalty), row by row: item ``j`` (heaviest
    first) to the least loaded GPU with a free slot whose last item is not of its run (lowest
    index on ties); when every such GPU holds it, the least loaded GPU with a free slot.
    Returns whether any row had to place a duplicate."""
    X, P = item_s.shape
    fill = np.empty(G, dtype=np.int64)
    last = np.empty(G, dtype=np.int64)
    avail = np.empty(G)
    stuck = False
    for x in range(X):
        for g in range(G):
            fill[g] = 0
            last[g] = -1
            avail[g] = 0.0
            gpu[x, g] = 0.0
        for j in range(P):
            r = run[x, j]
            best = -1
            bv = np.inf
            for g in range(G):
                if last[g] != r and avail[g] < bv:
                    bv = avail[g]
                    best = g
            if best < 0:  # every GPU with room holds it: a duplicate, repaired later
                stuck = True
                for g in range(G):
                    if fill[g] < S and avail[g] < bv:
                        bv = avail[g]
                        best = g
            g = best
            k = fill[g]
            gpu_of[x, j] = g
            slot_of[x, j] = k
            load_g = gpu[x, g] + item_s[x, j]
            gpu[x, g] = load_g
            k += 1
            fill[g] = k
            avail[g] = np.inf if k >= S else load_g
            last[g] = r
    return stuck
