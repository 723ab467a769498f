"""Baseline for `benchmarks/bench_solvers.py`: ``greedy``'s even-split pipeline as it was
before the speed-up of issue 12, frozen here so the benchmark compares both in one process
(same input, same machine load). The two slots per GPU count search evaluated each move by
rebuilding the sorted list (O(P) per move) and ran its two searches (with and without
duplicates) one after the other; `pair_layout` counted the replicas per GPU with ``np.add.at``.
Not used by the package.
"""

from __future__ import annotations

import numpy as np

from eplb.solvers.primitives import packing, pairing
from eplb.solvers.primitives.deepseek_kernels import placement_table, replicate
from eplb.solvers.primitives.even_split import row_caps
from eplb.solvers.primitives.layout import max_load
from eplb.solvers.primitives.pairing import pair_objective
from eplb.solvers.primitives.replication import per_replica, waterfill
from eplb.tolerance import better


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
        obj[rows, cols] = pairing._moved_objective(
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


def pack_even(
    load: np.ndarray,
    num_gpus: int,
    slots_per_gpu: int,
    *,
    present: np.ndarray | None = None,
    budget: int = 10_000,
    counts: np.ndarray | None = None,
) -> packing.Packed:
    """Even-split greedy for rows ``load: float[X, E]`` on ``num_gpus`` x ``slots_per_gpu``.

    ``present: bool[X, E]`` restricts each row to some experts (hierarchical per-node rows);
    ``counts: int64[X, E]`` fixes the replica counts (else water-filling).
    """
    X, E = load.shape
    G, S = num_gpus, slots_per_gpu
    if present is None:
        present = np.ones((X, E), dtype=bool)
    cap = row_caps(present, G, S)
    if counts is None:
        counts = waterfill(load, G * S, cap, present=present)
    if S == 2:
        return _pack_pairs(load, counts, cap, present, budget)
    packed = packing.lpt(load, counts, G, S)
    packing.improve(packed, budget=budget)
    return packed


def _pack_pairs(load, counts, cap, present, budget) -> packing.Packed:
    start = counts
    if present.all():  # DeepSeek's float32 counts as a second start
        _, _, ds = replicate(load.astype(np.float32), int(counts[0].sum()))
        ok = (ds <= cap).all(1)
        take = ok & (pairing.pair_objective(load, ds) < pairing.pair_objective(load, counts))
        start = np.where(take[:, None], ds, counts)
    improved = improve_counts(load, start, cap, present=present, budget=budget)
    packed = _layout_pairs(load, improved, budget)
    # candidates: the start itself, and a search that ignores duplicates (its pairing is used
    # where it puts no expert twice on a GPU); the best duplicate-free layout per row wins
    free = improve_counts(load, start, cap, present=present, budget=budget, distinct=False)
    for c in (start, free):
        alt = _layout_pairs(load, c, budget)
        packed.assign(alt, _key(alt) < _key(packed))
    return packed


def _key(p: packing.Packed) -> np.ndarray:
    """Sort key of candidate packings: duplicates last, then max GPU load."""
    return np.where(p.duplicates() > 0, np.inf, p.gpu.max(1))


def _layout_pairs(load, counts, budget) -> packing.Packed:
    """Sorted pairing; rows where a duplicate had to be swapped away are polished by swaps
    and compared with LPT on the same counts."""
    packed = pair_layout(load, counts)
    G = packed.shape[1]
    fixed = np.nonzero(better(pairing.pair_objective(load, counts), packed.gpu.max(1)))[0]
    fixed = np.union1d(fixed, np.nonzero(packed.duplicates() > 0)[0])
    if fixed.size:
        sub = packed.rows(fixed)
        packing.improve(sub, budget=budget)
        alt = packing.lpt(load[fixed], counts[fixed], G, 2)
        packing.improve(alt, budget=budget)
        sub.assign(alt, _key(alt) < _key(sub))
        packed.assign(sub, np.ones(fixed.size, dtype=bool), rows=fixed)
    return packed


def pair_layout(load: np.ndarray, counts: np.ndarray, *, repair: bool = True) -> packing.Packed:
    """`pairing.pair_layout` as it was before the speed-up (``np.add.at`` for the holds)."""
    X, E = counts.shape
    P = int(counts[0].sum())
    G = P // 2
    size = per_replica(load, counts)
    items_e = np.repeat(np.broadcast_to(np.arange(E), (X, E)).ravel(), counts.ravel()).reshape(X, P)
    items_s = np.take_along_axis(size, items_e, 1)
    order = np.lexsort((items_e, pairing._ordinal(items_e), -items_s), axis=1)
    se = np.take_along_axis(items_e, order, 1)
    ss = np.take_along_axis(items_s, order, 1)
    slot_e = np.stack([se[:, :G], se[:, ::-1][:, :G]], axis=2)
    slot_s = np.stack([ss[:, :G], ss[:, ::-1][:, :G]], axis=2)
    holds = np.zeros((X, E, G), dtype=np.int16)
    xs = np.repeat(np.arange(X), 2 * G)
    np.add.at(holds, (xs, slot_e.ravel(), np.tile(np.repeat(np.arange(G), 2), X)), 1)
    packed = packing.Packed(slot_e, slot_s, slot_s.sum(2), holds)
    if repair and packed.duplicates().any():
        packing.repair_duplicates(packed)
    return packed


def deepseek_candidates(load: np.ndarray, topology, num_groups: int | None) -> list[np.ndarray]:
    """DeepSeek's placements ``[int64[L, P], ...]``: global, and hierarchical too when
    ``num_groups`` makes DeepSeek hierarchical (``num_groups % N == 0``)."""
    out = [placement_table(load, topology, None)[0]]
    N = topology.num_nodes
    if num_groups is not None and num_groups % N == 0 and load.shape[1] % num_groups == 0:
        out.append(placement_table(load, topology, num_groups)[0])
    return out


def place_even(
    load: np.ndarray, topology, num_groups: int | None = None, budget: int = 10_000
) -> tuple[np.ndarray, np.ndarray]:
    """Even-split greedy ``phy2log: int64[L, P]`` for ``load: float64[L, E]`` that is never
    worse than DeepSeek's placement (global, and hierarchical when ``num_groups`` makes
    DeepSeek hierarchical) on any layer: a layer where DeepSeek's is strictly better takes it
    (duplicates included). Returns the table and ``int64[k]`` the layers taken from DeepSeek."""
    L, E = load.shape
    G, S = topology.num_gpus, topology.slots_per_gpu
    phy2log = pack_even(load, G, S, budget=budget).phy2log()
    best = max_load(load, phy2log, S)
    taken = np.zeros(L, dtype=bool)
    for alt in deepseek_candidates(load, topology, num_groups):
        val = max_load(load, alt, S)
        take = better(val, best)
        phy2log = np.where(take[:, None], alt, phy2log)
        best = np.where(take, val, best)
        taken |= take
    return phy2log, np.nonzero(taken)[0]
