"""Two slots per GPU (``S = 2``, DeepSeek's decode setting): exact method and fast heuristic.

With two replicas per GPU and fixed replica counts, pairing the heaviest replica with the
lightest, the second heaviest with the second lightest, and so on minimises the largest pair
sum (exchange argument: if ``a >= b`` and ``c >= d`` then ``max(a + d, b + c) <= max(a + c,
b + d)``). So the whole problem is a choice of counts ``c_e``: minimise over count vectors the
value ``max_i x_(i) + x_(P+1-i)`` of the sorted per-replica loads ``x``.

Feasibility of a target ``T`` (Hall's condition for this threshold graph): call a replica of
size ``s > T/2`` *big* (it needs a partner ``<= T - s``) and the others *small* (position
``T - s``: the largest big it can partner). ``T`` is reachable iff counts exist with
``sum c_e <= P`` (surplus slots go to an expert whose replicas are small, which only adds
partners) such that for every threshold ``u > T/2``::

    #{big replicas >= u}  <=  #{small replicas with position >= u}

Choosing ``c_e`` per expert is a multiple-choice integer program over boolean
``x[e, c]`` ("expert e has c replicas"); the thresholds are the distinct big sizes and the
prefix sums chain through one balance variable per threshold, so the model is sparse.
`certify` searches the target: a fast local search over counts gives an upper bound ``U``,
the LP relaxation (scipy HiGHS) at ``U (1 - 1e-9)`` often proves it optimal at once,
otherwise the integer program (OR-Tools CP-SAT, several times faster than a MIP solver on
it) either finds better counts (local search restarts from them) or proves that nothing
below ``U (1 - 1e-9)`` exists. The certificate is therefore exact up to
a relative ``1e-9``; with a time limit the LP bound is reported instead.

The greedy solver uses `improve_counts` (local search moving one replica at a time from the
DeepSeek/water-fill start, keeping only improvements), so it is never worse than DeepSeek.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from solvers.packing import Packed, repair_duplicates
from solvers.replication import per_replica

CERT_TOL = 1e-9


def pair_objective(load: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``float64[X]`` largest pair sum of the sorted pairing for ``counts: int64[X, E]``."""
    X, E = counts.shape
    P = int(counts[0].sum())
    items = np.repeat(per_replica(load, counts).ravel(), counts.ravel()).reshape(X, P)
    items.sort(axis=1)
    return (items + items[:, ::-1]).max(1)


def improve_counts(
    load: np.ndarray, counts: np.ndarray, cap, *, budget: int = 200, receivers: int = 16,
    light_receivers: int = 4, present: np.ndarray | None = None, distinct: bool = True,
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
            xs[rows], xe[rows], di[rows, cols], ri[rows, cols], ca[rows, cols], cb[rows, cols],
            sa[rows, cols], sb[rows, cols], distinct,
        )
        j = obj.argmin(1)
        gain = obj[r, j] < best[active] * (1 - 1e-12)
        g = r[gain]
        counts[active[g], di[g, j[g]]] -= 1
        counts[active[g], ri[g, j[g]]] += 1
        best[active[g]] = obj[g, j[g]]
        active = active[g]
    return counts


def _middle_tie(load: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``bool[X]``: the two middle replicas of the sorted list are equal."""
    X, E = counts.shape
    P = int(counts[0].sum())
    items = np.repeat(per_replica(load, counts).ravel(), counts.ravel()).reshape(X, P)
    items.sort(axis=1)
    return items[:, P // 2 - 1] == items[:, P // 2]


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


# --------------------------------------------------------------------------- exact method
@dataclass
class Certificate:
    """Result of `certify` for one layer."""

    counts: np.ndarray  # int64[E]
    objective: float  # largest GPU load of the sorted pairing for ``counts``
    bound: float  # proven lower bound on the optimum
    status: str  # "optimal" (bound within CERT_TOL) or "time_limit"
    milp_calls: int
    seconds: float

    @property
    def gap(self) -> float:
        return 0.0 if self.objective <= 0 else max(0.0, 1 - self.bound / self.objective)


def _options(w: np.ndarray, P: int, T: float, cap: int):
    """Count options ``(expert, count)`` allowed under target ``T`` (or None if none)."""
    E = w.shape[0]
    tol = 1e-12 * T
    with np.errstate(divide="ignore", invalid="ignore"):
        clo = np.maximum(1, np.ceil(np.where(T > 0, w / T, np.where(w > 0, np.inf, 1)) - 1e-12))
    if not np.all(np.isfinite(clo)):
        return None
    clo = clo.astype(np.int64)
    clo = np.where(w / clo > T + tol, clo + 1, clo)
    if np.any(clo > cap):
        return None
    F = P - int(clo.sum())
    if F < 0:
        return None
    num = np.minimum(F, cap - clo) + 1
    oe = np.repeat(np.arange(E), num)
    oc = clo[oe] + np.arange(oe.size) - np.repeat(np.cumsum(num) - num, num)
    return oe, oc


def _model(w: np.ndarray, P: int, T: float, cap: int, companions: int = 1):
    """Sparse ballot model at target ``T``: ``(oe, oc, n, K, A_eq, b_eq, a_slots)`` or None.

    ``companions``: small replicas each big one needs on its GPU (``S - 1``; the model is
    exact for ``S = 2`` and a relaxation for larger ``S``).
    """
    from scipy.sparse import coo_matrix, vstack

    opts = _options(w, P, T, cap)
    if opts is None:
        return None
    oe, oc = opts
    n = oe.size
    E = w.shape[0]
    tol = 1e-12 * T
    s = w[oe] / oc
    big = s > T / 2 + tol
    pos = np.where(big, s, T - s)
    levels = np.unique(pos[big])[::-1]  # descending thresholds
    K = levels.size
    k_of = np.searchsorted(-levels, -pos - tol, side="left")  # first level <= pos (+tol)
    rel = np.nonzero(k_of < K)[0]
    sign = np.where(big, -float(companions), 1.0) * oc
    # balance_k = balance_{k-1} + sum(sign * x over options at level k); balance >= 0
    # (no big replica at all, K = 0: no ballot constraint, only the slot count)
    link = max(K - 1, 0)
    rows = np.r_[k_of[rel], np.arange(K), np.arange(1, K)]
    cols = np.r_[rel, n + np.arange(K), n + np.arange(link)]
    vals = np.r_[sign[rel], -np.ones(K), np.ones(link)]
    chain = coo_matrix((vals, (rows, cols)), shape=(K, n + K))
    one = coo_matrix((np.ones(n), (oe, np.arange(n))), shape=(E, n + K))
    a_eq = vstack([chain, one]).tocsr()
    b_eq = np.r_[np.zeros(K), np.ones(E)]
    a_slots = np.r_[oc.astype(float), np.zeros(K)]
    return oe, oc, n, K, a_eq, b_eq, a_slots


def _fill(w: np.ndarray, counts: np.ndarray, P: int, cap: int) -> np.ndarray:
    """Hand surplus slots to the expert with the smallest next replica (keeps pairs valid)."""
    counts = counts.copy()
    while counts.sum() < P:
        nxt = np.where(counts < cap, w / (counts + 1), np.inf)
        counts[int(nxt.argmin())] += 1
    return counts


def lp_feasible(w: np.ndarray, P: int, T: float, cap: int, companions: int = 1) -> bool:
    """LP relaxation of the ballot model at ``T``; False proves ``T`` unreachable."""
    from scipy.optimize import linprog

    m = _model(w, P, T, cap, companions)
    if m is None:
        return False
    oe, oc, n, K, a_eq, b_eq, a_slots = m
    res = linprog(
        np.zeros(n + K), A_ub=a_slots[None, :], b_ub=[P], A_eq=a_eq, b_eq=b_eq,
        bounds=[(0, 1)] * n + [(0, None)] * K, method="highs",
    )
    return res.status == 0


def milp_counts(w: np.ndarray, P: int, T: float, cap: int, time_limit: float, seed: int = 0,
                hint: np.ndarray | None = None):
    """Integer ballot model at ``T`` (OR-Tools CP-SAT, one worker, ``time_limit`` in
    deterministic seconds). Returns ``(result, deterministic_seconds)``: ``result`` is counts
    reaching ``T``, ``None`` if ``T`` is proven unreachable, or ``"time_limit"``. ``hint``:
    counts to start the search from (usually the incumbent, just above ``T``)."""
    from ortools.sat.python import cp_model

    opts = _options(w, P, T, cap)
    if opts is None:
        return None, 0.0
    oe, oc = opts
    n = oe.size
    tol = 1e-12 * T
    s = w[oe] / oc
    big = s > T / 2 + tol
    pos = np.where(big, s, T - s)
    levels = np.unique(pos[big])[::-1]
    K = levels.size
    k_of = np.searchsorted(-levels, -pos - tol, side="left")
    sign = np.where(big, -1, 1) * oc
    m = cp_model.CpModel()
    x = [m.NewBoolVar(f"x{i}") for i in range(n)]
    starts = np.searchsorted(oe, np.arange(w.size))
    ends = np.r_[starts[1:], n]
    for lo, hi in zip(starts, ends, strict=True):
        m.AddExactlyOne(x[lo:hi])
    m.Add(sum(int(c) * v for c, v in zip(oc, x, strict=True)) <= P)
    if hint is not None:
        for i in range(n):
            m.AddHint(x[i], int(hint[oe[i]] == oc[i]))
    prev = 0
    order = np.argsort(k_of, kind="stable")
    cut = np.searchsorted(k_of[order], np.arange(K + 1))
    for k in range(K):
        idx = order[cut[k] : cut[k + 1]]
        bal = m.NewIntVar(0, P, f"b{k}")
        m.Add(bal == prev + sum(int(sign[i]) * x[i] for i in idx))
        prev = bal
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = seed
    solver.parameters.max_deterministic_time = max(time_limit, 0.01)
    solver.parameters.max_time_in_seconds = 5 * max(time_limit, 0.01) + 5  # safety net
    status = solver.Solve(m)
    used = solver.deterministic_time
    if status == cp_model.INFEASIBLE:
        return None, used
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return "time_limit", used
    chosen = np.array([solver.Value(v) for v in x], dtype=bool)
    counts = np.zeros(w.shape[0], dtype=np.int64)
    counts[oe[chosen]] = oc[chosen]
    return _fill(w, counts, P, cap), used


def simple_bound(w: np.ndarray, P: int, cap: int) -> float:
    """max(total / G, smallest possible largest replica) for one layer."""
    from solvers.replication import waterfill

    c = waterfill(w[None], P, cap)[0]
    return float(max(w.sum() / (P // 2), (w / c).max()))


def lp_bound(
    w: np.ndarray, P: int, cap: int, lo: float, hi: float, iters: int = 40, companions: int = 1,
    rel_tol: float = CERT_TOL,
) -> float:
    """Largest target proven unreachable by the LP relaxation in ``[lo, hi]`` (``lo`` a known
    bound, ``hi`` a reachable value), to a relative ``rel_tol``; ``lo`` if nothing better.

    Gallops down from ``hi`` (the LP is usually tight, so one or two solves suffice), then
    bisects.
    """
    step = rel_tol
    top = hi
    for _ in range(iters):
        t = top * (1 - step)
        if t <= lo:
            break
        if not lp_feasible(w, P, t, cap, companions):
            lo = t
            break
        hi, step = t, step * 4
    for _ in range(iters):
        if hi - lo <= rel_tol * hi:
            break
        mid = 0.5 * (lo + hi)
        if lp_feasible(w, P, mid, cap, companions):
            hi = mid
        else:
            lo = mid
    return lo


def certify(
    w: np.ndarray, P: int, start: np.ndarray, *, cap: int | None = None,
    time_limit: float | None = 60.0,
) -> Certificate:
    """Exact ``S = 2`` optimum of one layer ``w: float[E]`` with ``P`` slots (``P // 2`` GPUs).

    ``start: int64[E]`` initial counts (e.g. the greedy's). ``cap`` limits replicas per expert
    (default ``P - E + 1``: any count, i.e. the true problem, duplicates on a GPU allowed).
    ``time_limit``: CP-SAT deterministic seconds in total (deterministic result).
    """
    t0 = time.perf_counter()
    E = w.shape[0]
    cap = P - E + 1 if cap is None else cap
    budget = np.inf if time_limit is None else float(time_limit)  # deterministic seconds
    counts = improve_counts(w[None], start[None], cap, distinct=False)[0]
    ub = float(pair_objective(w[None], counts[None])[0])
    lb = simple_bound(w, P, cap)
    calls = 0
    status = "time_limit"
    while True:
        if ub <= lb * (1 + CERT_TOL) or ub <= 0:
            status = "optimal"
            break
        target = ub * (1 - CERT_TOL)
        if not lp_feasible(w, P, target, cap):
            lb = max(lb, target)
            status = "optimal"
            break
        if budget <= 0:
            break
        calls += 1
        found, used = milp_counts(w, P, target, cap, min(budget, 1e6), hint=counts)
        budget -= used
        if found is None:
            lb = max(lb, target)
            status = "optimal"
            break
        if isinstance(found, str):
            break
        found = improve_counts(w[None], found[None], cap, distinct=False)[0]
        value = float(pair_objective(w[None], found[None])[0])
        if value >= ub:  # cannot happen for a correct model; stop rather than loop
            break
        counts, ub = found, value
    if status != "optimal":
        lb = max(lb, lp_bound(w, P, cap, lb, ub))
    return Certificate(counts, ub, min(lb, ub), status, calls, time.perf_counter() - t0)
