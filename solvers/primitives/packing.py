"""Packing replicas onto GPUs, vectorised over rows (a layer, or a node of a layer): LPT with
cardinality and no duplicate replica on a GPU (`lpt`), then swap search (`improve`), on slot
tables ``slot_e: int64[X, G, S]``. docs/solvers.md, "How the building blocks work".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from eplb.solvers.primitives import jit
from eplb.solvers.primitives.layout import duplicates
from eplb.solvers.primitives.replication import per_replica
from eplb.tolerance import REL_TOL, better


@dataclass
class Packed:
    """Mutable packing state of ``X`` rows of ``G`` GPUs with ``S`` slots (shapes below)."""

    slot_e: np.ndarray  # int64[X, G, S]
    slot_s: np.ndarray  # float64[X, G, S]
    gpu: np.ndarray  # float64[X, G]
    holds: np.ndarray  # int16[X, E, G] replicas of each expert on each GPU

    def __post_init__(self) -> None:  # C order: the swaps update flat views of every array
        for name in ("slot_e", "slot_s", "gpu", "holds"):
            setattr(self, name, np.ascontiguousarray(getattr(self, name)))

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.slot_e.shape

    def duplicates(self) -> np.ndarray:
        """``int64[X]``: surplus replicas sharing a GPU with another replica of their expert."""
        X, G, S = self.slot_e.shape
        return duplicates(self.slot_e.reshape(X, G * S), S)

    def phy2log(self) -> np.ndarray:
        """``int64[X, G * S]`` the slot table."""
        X, G, S = self.slot_e.shape
        return self.slot_e.reshape(X, G * S)

    def rows(self, idx: np.ndarray) -> Packed:
        """A copy of rows ``idx``."""
        return Packed(self.slot_e[idx], self.slot_s[idx], self.gpu[idx], self.holds[idx])

    def assign(self, src: Packed, take: np.ndarray, rows: np.ndarray | None = None) -> None:
        """``self[rows[take]] = src[take]`` for every array (``rows`` default: all rows)."""
        idx = np.nonzero(take)[0] if rows is None else rows[take]
        for name in ("slot_e", "slot_s", "gpu", "holds"):
            getattr(self, name)[idx] = getattr(src, name)[take]


def sorted_items(load: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Replicas of every row of ``load: float[X, E]`` with ``counts: int64[X, E]``, heaviest
    first: ``item_e: int64[X, P]``, ``item_s: float64[X, P]``.

    Rows of ``counts`` must all sum to the same ``P``. Ties keep expert order (stable sort).
    """
    X, E = counts.shape
    P = int(counts[0].sum())
    experts = np.broadcast_to(np.arange(E, dtype=np.int64), (X, E)).ravel()
    item_e = np.repeat(experts, counts.ravel()).reshape(X, P)
    item_s = np.take_along_axis(per_replica(load, counts), item_e, axis=1)
    order = np.argsort(-item_s, axis=1, kind="stable")
    return np.take_along_axis(item_e, order, 1), np.take_along_axis(item_s, order, 1)


def lpt(
    load: np.ndarray,
    counts: np.ndarray,
    num_gpus: int,
    slots_per_gpu: int,
    *,
    node_penalty: np.ndarray | None = None,
    gpus_per_node: int | None = None,
) -> Packed:
    """LPT with cardinality ``slots_per_gpu`` and no duplicate replica on a GPU if avoidable.

    ``load: float[X, E]``, ``counts: int64[X, E]`` (row sums ``num_gpus * slots_per_gpu``).
    ``node_penalty: float[X, E]`` (traffic mode): added to a GPU's score when its node already
    holds a replica of the expert (with ``gpus_per_node``), spreading replicas over nodes.
    """
    X, E = counts.shape
    G, S = num_gpus, slots_per_gpu
    item_e, item_s = sorted_items(load, counts)
    P = item_e.shape[1]
    rows = np.arange(X)
    gpu = np.zeros((X, G))
    fill = np.zeros((X, G), dtype=np.int64)
    slot_e = np.zeros((X, G, S), dtype=np.int64)
    slot_s = np.zeros((X, G, S))
    avail = np.zeros((X, G))  # GPU load, inf once the GPU is full
    # flat views: one 1-D index per update instead of a tuple of index arrays
    gpu_f, fill_f, avail_f = gpu.reshape(-1), fill.reshape(-1), avail.reshape(-1)
    row_g = rows * G
    # an expert's replicas are consecutive items (equal per-replica load, stable sort): a run.
    # A GPU holds the item's expert iff the last item it took is of the item's run
    run = np.zeros((X, P), dtype=np.int32)
    np.cumsum(item_e[:, 1:] != item_e[:, :-1], axis=1, out=run[:, 1:])
    run_t = np.ascontiguousarray(run.T)  # [P, X]: item j's column as a contiguous row
    s_t = np.ascontiguousarray(item_s.T)
    last = np.full((X, G), -1, dtype=np.int32)
    last_f = last.reshape(-1)
    gpu_of = np.empty((P, X), dtype=np.int64)  # the GPU and slot of each item
    slot_of = np.empty((P, X), dtype=np.int64)
    inf = np.inf
    any_stuck = False
    start = 0
    kernels = jit.kernels() if node_penalty is None and item_s.dtype == np.float64 else None
    if kernels is not None:  # the loop below, compiled (the same placement)
        gpu_of_t = np.empty((X, P), dtype=np.int64)
        slot_of_t = np.empty((X, P), dtype=np.int64)
        any_stuck = kernels.lpt_fill(item_s, run, G, S, gpu, gpu_of_t, slot_of_t)
        gpu_of, slot_of = gpu_of_t.T, slot_of_t.T
        start = P  # nothing left for the loop
    elif node_penalty is None and (G == 1 or (item_s[:, G - 2] > 0).all()):
        # the G heaviest items go to GPUs 0..G-1 in turn: each takes the first empty GPU,
        # every GPU taken so far already carries a positive load (and holds its run's expert)
        gpu_of[:G] = np.arange(G)[:, None]
        slot_of[:G] = 0
        gpu[:] = item_s[:, :G]
        fill[:] = 1
        avail[:] = inf if S == 1 else gpu
        last[:] = run[:, :G]
        start = G
    for j in range(start, P):
        s_j = s_t[j]
        held = last == run_t[j][:, None]
        score = avail
        if node_penalty is not None:
            h = held.reshape(X, -1, gpus_per_node).any(-1)  # [X, N]
            pen = node_penalty[rows, item_e[:, j]][:, None]
            score = avail + np.repeat(h, gpus_per_node, axis=1) * pen
        free = np.where(held, inf, score)
        g = free.argmin(1)
        fg = row_g + g
        if not np.isfinite(free.reshape(-1)[fg]).all():
            # every GPU with room holds this expert (or a huge node penalty overflowed to
            # inf): accept a duplicate on a GPU with room, repair later
            stuck = ~np.isfinite(free.reshape(-1)[fg])
            any_stuck = True
            room = np.where(fill < S, np.minimum(score, np.finfo(float).max), inf)
            g[stuck] = room[stuck].argmin(1)
            fg = row_g + g
        k = fill_f[fg]
        gpu_of[j] = g
        slot_of[j] = k
        load_g = gpu_f[fg] + s_j
        gpu_f[fg] = load_g
        k += 1
        fill_f[fg] = k
        avail_f[fg] = np.where(k >= S, inf, load_g)
        last_f[fg] = run_t[j]
    at = (gpu_of * S + slot_of).T  # [X, P]: each item's place in its row's slot table
    slot_e.reshape(X, -1)[rows[:, None], at] = item_e
    slot_s.reshape(X, -1)[rows[:, None], at] = item_s
    holds = np.zeros((X, E, G), dtype=np.int16)
    at = (rows[:, None, None], slot_e, np.arange(G)[None, :, None])
    if any_stuck:  # a GPU may hold an expert twice
        np.add.at(holds, at, 1)
    else:
        holds[at] = 1
    packed = Packed(slot_e, slot_s, gpu, holds)
    if packed.duplicates().any():
        repair_duplicates(packed)
    return packed


def _swap(p: Packed, lay, g1, k1, g2, k2) -> None:
    """Exchange slot ``(g1, k1)`` with ``(g2, k2)`` in rows ``lay`` (arrays of equal length;
    the GPUs of one call are distinct within a row)."""
    X, G, S = p.shape
    E = p.holds.shape[1]
    a, b = lay * G + g1, lay * G + g2  # flat GPU indices
    i1, i2 = a * S + k1, b * S + k2  # flat slot indices
    se, ss = p.slot_e.reshape(-1), p.slot_s.reshape(-1)
    e1, e2 = se[i1], se[i2]
    s1, s2 = ss[i1], ss[i2]
    se[i1], se[i2] = e2, e1
    ss[i1], ss[i2] = s2, s1
    gpu = p.gpu.reshape(-1)
    gpu[a] += s2 - s1
    gpu[b] += s1 - s2
    base = lay * E
    at = np.concatenate([(base + e1) * G + g1, (base + e2) * G + g2,
                         (base + e1) * G + g2, (base + e2) * G + g1])
    n = lay.size
    np.add.at(p.holds.reshape(-1), at, np.repeat(np.array([-1, 1], dtype=p.holds.dtype), 2 * n))


def repair_duplicates(p: Packed) -> None:
    """Swap away duplicate replicas (two of one expert on one GPU) where a swap exists.

    Each duplicate is exchanged with the replica, on a GPU without its expert, whose expert is
    not on the duplicate's GPU, that keeps the larger of the two GPU loads smallest.
    """
    X, G, S = p.shape
    for x in np.nonzero(p.duplicates())[0]:
        for _ in range(G * S):
            dup = np.argwhere(p.holds[x] > 1)
            if not len(dup):
                break
            e, g = (int(v) for v in dup[0])
            k = int(np.nonzero(p.slot_e[x, g] == e)[0][0])
            s = p.slot_s[x, g, k]
            other_e, other_s = p.slot_e[x], p.slot_s[x]  # [G, S]
            ok = (p.holds[x, e][:, None] == 0) & (p.holds[x][other_e, g] == 0)
            ok[g] = False
            worst = np.maximum(p.gpu[x, g] - s + other_s, p.gpu[x][:, None] - other_s + s)
            worst = np.where(ok, worst, np.inf)
            flat = int(worst.argmin())
            if not np.isfinite(worst.flat[flat]):
                break
            g2, k2 = divmod(flat, S)
            _swap(p, np.array([x]), np.array([g]), np.array([k]), np.array([g2]), np.array([k2]))


@dataclass
class TrafficTerm:
    """Traffic-aware swap scoring: objective ``max GPU load + weight * expected_rdma``.

    ``node_count: int64[X, E, N]`` replicas of each expert per node (kept up to date),
    ``load: float[X, E]`` expert loads, ``weight`` = ``rdma_weight / G`` (see traffic_cost).
    """

    node_count: np.ndarray
    load: np.ndarray
    weight: float
    gpus_per_node: int


def improve(
    p: Packed,
    *,
    budget: int = 10_000,
    near: int | None = 8,
    polish: int = 8,
    allow_duplicates: bool = False,
    traffic: TrafficTerm | None = None,
) -> int:
    """Swap local search on the heaviest GPUs of every row; returns the iterations run.

    Phases, each until no row improves (or ``budget`` iterations in total):

    1. without a traffic term and with 16+ GPUs, the 4 heaviest GPUs swap at once, each with
       its own 2 light partners (disjoint pools; each swap lowers its pair below the heavy
       GPU's load, so the sorted load vector still decreases and the search terminates);
    2. the heaviest GPU with the ``near`` lightest GPUs as partners;
    3. the heaviest GPU with every GPU, at most ``polish`` iterations.

    ``near=None`` runs only phase 3 (without the ``polish`` cap).
    """
    G = p.shape[1]
    if G < 2:  # one GPU: nothing to swap with
        return 0
    if not near:
        return _improve_phase(p, budget, None, allow_duplicates, traffic)
    iters = 0
    if traffic is None and G >= 16:
        iters += _multi_phase(p, budget, 4, 2, allow_duplicates)
    iters += _improve_phase(p, budget - iters, near, allow_duplicates, traffic)
    if near < G - 1:
        iters += _improve_phase(p, min(polish, budget - iters), None, allow_duplicates, traffic)
    return iters


def _multi_phase(p: Packed, budget: int, width: int, near: int, allow_duplicates) -> int:
    """Swaps on the ``width`` heaviest GPUs at once, partner pools interleaved and disjoint."""
    X, G, S = p.shape
    m = width
    k = min(near, (G - m) // m)
    active = np.arange(X)
    it = 0
    while active.size and it < budget:
        it += 1
        n = active.size
        ld = p.gpu[active]
        order = np.argsort(ld, axis=1, kind="stable")
        ls = np.take_along_axis(ld, order, 1)  # loads in that order
        h = order[:, ::-1][:, :m]  # [n, m] heaviest first
        lh = ls[:, ::-1][:, :m]
        pick = np.arange(m * k).reshape(k, m).T  # [m, k] disjoint pools, interleaved
        cand = order[:, pick]  # [n, m, k]
        a_s, a_e = _gpu_slots(p, active[:, None], h)  # [n, m, S]
        b_s, b_e = _gpu_slots(p, active[:, None, None], cand)  # [n, m, k, S]
        b_s, b_e = b_s.reshape(n, m, k * S), b_e.reshape(n, m, k * S)
        bg = np.repeat(cand, S, axis=2)  # [n, m, kS]
        gl = np.repeat(ls[:, pick], S, axis=2)
        score = _pair_loads(a_s, b_s, lh, gl).reshape(n * m, -1)  # [n * m, S * kS]
        swaps = (np.repeat(active, m), a_e.reshape(n * m, S), b_e.reshape(n * m, -1),
                 h.reshape(-1), cand.reshape(n * m, k))  # one row per heavy GPU
        best = _best_swap(p, score, lh.reshape(-1), swaps, allow_duplicates).reshape(n, m)
        good = better(np.take_along_axis(score, best.reshape(-1, 1), 1)[:, 0], lh.reshape(-1))
        good = good.reshape(n, m)
        if not good.any():
            break
        ri, ji = np.nonzero(good)
        ia, ib = np.divmod(best[ri, ji], k * S)
        _swap(p, active[ri], h[ri, ji], ia, bg[ri, ji, ib], ib % S)
        active = active[good.any(1)]
    return it


def _gpu_slots(p: Packed, rows: np.ndarray, gpus: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Slot sizes and experts (``[..., S]`` each) of GPUs ``gpus`` in rows ``rows`` (arrays
    broadcast together), gathered as whole rows of the flat ``[X * G, S]`` tables."""
    X, G, S = p.shape
    at = rows * G + gpus
    return p.slot_s.reshape(X * G, S).take(at, axis=0), p.slot_e.reshape(X * G, S).take(at, axis=0)


def _pair_loads(a_s, b_s, lh, gl) -> np.ndarray:
    """``float64[..., S, kS]``: the larger of the two GPU loads after swapping slot ``i`` of the
    heavy GPU (sizes ``a_s: [..., S]``, load ``lh: [...]``) with partner slot ``j`` (sizes
    ``b_s: [..., kS]``, partner loads ``gl: [..., kS]``).

    A swap improves iff this is `better` than ``lh``; that implies the moved-out replica is the
    larger (``a - b > lh * REL_TOL``), so the best swap of a row is its argmin, checked once.
    """
    d = a_s[..., :, None] - b_s[..., None, :]
    pair = lh[..., None, None] - d
    d += gl[..., None, :]
    np.maximum(pair, d, out=pair)
    return pair


def _best_swap(
    p: Packed, score: np.ndarray, lh: np.ndarray, swaps: tuple, allow_duplicates: bool
) -> np.ndarray:
    """``int64[n]``: per row of ``score: float64[n, S * kS]`` (`_pair_loads`, flattened) the
    first index of the smallest entry whose swap creates no duplicate (`_no_duplicate`).

    Duplicates are checked lazily: only at each row's argmin, and only where that swap would
    improve on ``lh: float64[n]`` (else the row has no improving swap either way); a duplicate
    minimum is set to inf (``score`` is modified) and the row searched again. After a few
    rounds the rows left get the full mask. Same result as masking every duplicate first.
    ``swaps``: per row ``(layer: [n], a_e: [n, S], b_e: [n, kS], h: [n], cand: [n, k])`` as
    `_no_duplicate` takes them.
    """
    best = score.argmin(1)
    if allow_duplicates:
        return best
    todo = np.arange(score.shape[0])
    for _ in range(4):
        todo = todo[better(score[todo, best[todo]], lh[todo])]
        if not todo.size:
            return best
        layer, a_e, b_e, h, cand = (a[todo] for a in swaps)
        i = np.arange(todo.size)
        ia, ib = np.divmod(best[todo], b_e.shape[1])  # heavy slot, partner slot (partner-major)
        partner = cand[i, ib // a_e.shape[1]]
        free = (p.holds[layer, a_e[i, ia], partner] == 0) & (p.holds[layer, b_e[i, ib], h] == 0)
        todo = todo[~free]
        if not todo.size:
            return best
        score[todo, best[todo]] = np.inf
        best[todo] = score[todo].argmin(1)
    todo = todo[better(score[todo, best[todo]], lh[todo])]
    if todo.size:
        layer, a_e, b_e, h, cand = (a[todo] for a in swaps)
        ok = _no_duplicate(p, layer, a_e, b_e, h, cand).reshape(todo.size, -1)
        sub = score[todo]
        sub[~ok] = np.inf
        score[todo] = sub
        best[todo] = sub.argmin(1)
    return best


def _no_duplicate(p: Packed, rows, a_e, b_e, h, cand) -> np.ndarray:
    """``bool[..., S, k, S]``: swapping slot ``i`` of heavy GPU ``h`` with slot ``j`` of partner
    ``cand[c]`` creates no duplicate (neither expert is already on the other GPU).

    ``rows``: layer rows broadcastable to ``h``; ``h: [...]``, ``a_e: [..., S]`` experts on
    ``h``, ``cand: [..., k]`` partner GPUs, ``b_e: [..., k*S]`` their experts (partner-major).
    The checks are gathered at ``[..., S, k]`` and ``[..., k, S]`` and broadcast, instead of
    one gather per (slot, partner slot) pair.
    """
    k = cand.shape[-1]
    S = a_e.shape[-1]
    a_on = np.take_along_axis(p.holds[rows[..., None], a_e], cand[..., None, :], -1)  # [.., S, k]
    b_on = p.holds[rows[..., None], b_e, h[..., None]]  # [..., k*S]
    b_free = (b_on == 0).reshape(*b_on.shape[:-1], k, S)
    return (a_on == 0)[..., :, :, None] & b_free[..., None, :, :]


def _improve_phase(p: Packed, budget: int, near, allow_duplicates, traffic) -> int:
    X, G, S = p.shape
    active = np.arange(X)
    k = G - 1 if near is None or near >= G - 1 else near
    it = 0
    while active.size and it < budget:
        it += 1
        n = active.size
        r = np.arange(n)
        ld = p.gpu[active]
        order = np.argsort(ld, axis=1, kind="stable")
        ls = np.take_along_axis(ld, order, 1)  # loads in that order
        h = order[:, -1]
        lh = ls[:, -1]
        cand = order[:, :k]  # [n, k] partner GPUs, lightest first
        a_s, a_e = _gpu_slots(p, active, h)  # [n, S]
        b_s, b_e = _gpu_slots(p, active[:, None], cand)  # [n, k, S]
        b_s, b_e = b_s.reshape(n, k * S), b_e.reshape(n, k * S)
        bg = np.repeat(cand, S, axis=1)  # [n, kS]
        gl = np.repeat(ls[:, :k], S, axis=1)
        if traffic is None:
            score = _pair_loads(a_s, b_s, lh, gl).reshape(n, -1)  # [n, S * kS]
            best = _best_swap(p, score, lh, (active, a_e, b_e, h, cand), allow_duplicates)
            good = better(score[r, best], lh)
        else:
            d = a_s[:, :, None] - b_s[:, None, :]  # [n, S, kS]
            pair = lh[:, None, None] - d
            np.maximum(pair, gl[:, None, :] + d, out=pair)
            ok = d > 0
            if not allow_duplicates:
                ok &= _no_duplicate(p, active, a_e, b_e, h, cand).reshape(ok.shape)
            score = _traffic_score(p, traffic, active, order, h, lh, a_e, b_e, bg, pair, ok)
            best = score.argmin(1)
            good = np.isfinite(score[r, best])
        if not good.any():
            break
        ia, ib = np.divmod(best[good], k * S)
        gb = bg[r[good], ib]
        kb = ib % S
        lay = active[good]
        hh = h[good]
        if traffic is not None:
            _update_nodes(p, traffic, lay, hh, ia, gb, kb)
        _swap(p, lay, hh, ia, gb, kb)
        active = lay
    return it


def _traffic_score(p, t: TrafficTerm, active, order, h, lh, a_e, b_e, bg, pair, ok):
    """Score swaps by the change of ``max load + weight * rdma``; inf where not improving."""
    n = active.size
    r = np.arange(n)
    gpn = t.gpus_per_node
    N = t.node_count.shape[2]
    ld = p.gpu[active]
    # max load over GPUs other than h and the partner
    second = ld[r, order[:, -2]]
    third = ld[r, order[:, -3]] if ld.shape[1] > 2 else np.full(n, -np.inf)
    rest = np.where(bg == order[:, -2][:, None], third[:, None], second[:, None])  # [n, kS]
    nh = h // gpn
    nb = bg // gpn  # [n, kS]
    nc = t.node_count[active]  # [n, E, N]
    wa = t.load[active[:, None], a_e]  # [n, S]
    wb = t.load[active[:, None], b_e]  # [n, kS]
    cross = nb[:, None, :] != nh[:, None, None]
    a_leave = (nc[r[:, None], a_e, nh[:, None]] == 1)[:, :, None]
    a_enter = (
        np.take_along_axis(nc[r[:, None], a_e], np.broadcast_to(nb[:, None, :], pair.shape), 2) == 0
    )
    b_leave = (np.take_along_axis(nc[r[:, None], b_e], nb[:, :, None], 2)[:, :, 0] == 1)[:, None, :]
    b_enter = (nc[r[:, None], b_e, nh[:, None]] == 0)[:, None, :]
    dn_a = a_enter.astype(float) - a_leave
    dn_b = b_enter.astype(float) - b_leave
    d_rdma = -(wa[:, :, None] * dn_a + wb[:, None, :] * dn_b) / N * cross
    new_max = np.maximum(rest[:, None, :], pair)
    obj = new_max + t.weight * d_rdma
    lex = (pair < lh[:, None, None] * (1 - REL_TOL)) & (d_rdma <= 0)
    better = obj < lh[:, None, None] * (1 - REL_TOL)
    ok = ok & (lex | better)
    return np.where(ok, obj + 1e-9 * pair, np.inf).reshape(n, -1)


def _update_nodes(p, t: TrafficTerm, lay, hh, ia, gb, kb) -> None:
    gpn = t.gpus_per_node
    ea, eb = p.slot_e[lay, hh, ia], p.slot_e[lay, gb, kb]
    np.subtract.at(t.node_count, (lay, ea, hh // gpn), 1)
    np.add.at(t.node_count, (lay, ea, gb // gpn), 1)
    np.subtract.at(t.node_count, (lay, eb, gb // gpn), 1)
    np.add.at(t.node_count, (lay, eb, hh // gpn), 1)


def node_counts(p: Packed, gpus_per_node: int) -> np.ndarray:
    """``int64[X, E, N]`` replicas of each expert per node."""
    X, E, G = p.holds.shape
    return p.holds.reshape(X, E, G // gpus_per_node, gpus_per_node).sum(-1)
