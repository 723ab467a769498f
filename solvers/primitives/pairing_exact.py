"""Two slots per GPU: the exact method (`certify`: count local search, LP relaxation, then an
integer program that finds better counts or proves none exist, to a relative 1e-9) and the
ballot LP bound (`lp_bound`, valid for any ``S``). docs/solvers.md, "Two slots per GPU".
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from eplb.solvers.primitives.pairing import improve_counts, pair_objective
from eplb.solvers.primitives.replication import waterfill
from eplb.tolerance import PROOF_TOL

CERT_TOL = PROOF_TOL  # relative precision of a certificate


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
    stopped: str | None = None  # "wall" when the wall limit ended the search

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
    from scipy.sparse import coo_matrix, vstack  # lazy: scipy is heavy; start-up avoids it

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
    """LP relaxation of the ballot model at ``T`` for one layer ``w: float[E]``; False proves
    ``T`` unreachable."""
    from scipy.optimize import linprog  # lazy: scipy is heavy; start-up avoids it

    m = _model(w, P, T, cap, companions)
    if m is None:
        return False
    oe, oc, n, K, a_eq, b_eq, a_slots = m
    res = linprog(
        np.zeros(n + K),
        A_ub=a_slots[None, :],
        b_ub=[P],
        A_eq=a_eq,
        b_eq=b_eq,
        bounds=[(0, 1)] * n + [(0, None)] * K,
        method="highs",
    )
    return res.status == 0


def milp_counts(
    w: np.ndarray,
    P: int,
    T: float,
    cap: int,
    time_limit: float,
    seed: int = 0,
    hint: np.ndarray | None = None,
    wall_limit: float | None = None,
):
    """Integer ballot model at ``T`` for one layer ``w: float[E]`` (OR-Tools CP-SAT, one
    worker, ``time_limit`` in
    deterministic seconds, ``wall_limit`` wall seconds; without it a safety net of
    ``5 time_limit + 5``). Returns ``(result, deterministic_seconds)``: ``result`` is counts
    reaching ``T``, ``None`` if ``T`` is proven unreachable, or ``"time_limit"``. ``hint``:
    ``int64[E]`` counts to start the search from (usually the incumbent, just above ``T``)."""
    from ortools.sat.python import cp_model  # lazy: OR-Tools is heavy; start-up avoids it

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
    net = 5 * max(time_limit, 0.01) + 5  # safety net
    solver.parameters.max_time_in_seconds = net if wall_limit is None else min(net, wall_limit)
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
    """max(total / G, smallest possible largest replica) for one layer ``w: float[E]``."""
    c = waterfill(w[None], P, cap)[0]
    return float(max(w.sum() / (P // 2), (w / c).max()))


def lp_bound(
    w: np.ndarray,
    P: int,
    cap: int,
    lo: float,
    hi: float,
    iters: int = 40,
    companions: int = 1,
    rel_tol: float = CERT_TOL,
    deadline: float | None = None,
) -> float:
    """Largest target for one layer ``w: float[E]`` proven unreachable by the LP relaxation in
    ``[lo, hi]`` (``lo`` a known
    bound, ``hi`` a reachable value), to a relative ``rel_tol``; ``lo`` if nothing better.

    Gallops down from ``hi`` (the LP is usually tight, so one or two solves suffice), then
    bisects; stops early (still a valid bound) once ``time.perf_counter()`` passes
    ``deadline``.
    """
    step = rel_tol
    top = hi
    for _ in range(iters):
        if deadline is not None and time.perf_counter() > deadline:
            return lo
        t = top * (1 - step)
        if t <= lo:
            break
        if not lp_feasible(w, P, t, cap, companions):
            lo = t
            break
        hi, step = t, step * 4
    for _ in range(iters):
        if hi - lo <= rel_tol * hi or (deadline is not None and time.perf_counter() > deadline):
            break
        mid = 0.5 * (lo + hi)
        if lp_feasible(w, P, mid, cap, companions):
            hi = mid
        else:
            lo = mid
    return lo


def certify(
    w: np.ndarray,
    P: int,
    start: np.ndarray,
    *,
    cap: int | None = None,
    time_limit: float | None = 60.0,
    wall_limit: float | None = None,
) -> Certificate:
    """Exact ``S = 2`` optimum of one layer ``w: float[E]`` with ``P`` slots (``P // 2`` GPUs).

    ``start: int64[E]`` initial counts (e.g. the greedy's). ``cap`` limits replicas per expert
    (default ``P - E + 1``: any count, i.e. the true problem, duplicates on a GPU allowed).
    ``time_limit``: CP-SAT deterministic seconds in total (reproducible result);
    ``wall_limit``: wall seconds in total (the result then depends on machine speed when it
    binds: ``Certificate.stopped == "wall"``).
    """
    t0 = time.perf_counter()
    deadline = None if wall_limit is None else t0 + wall_limit
    stopped = None
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
        left = None if deadline is None else deadline - time.perf_counter()
        if left is not None and left <= 0:
            stopped = "wall"
            break
        calls += 1
        found, used = milp_counts(w, P, target, cap, min(budget, 1e6), hint=counts, wall_limit=left)
        budget -= used
        if deadline is not None and time.perf_counter() >= deadline and isinstance(found, str):
            stopped = "wall"
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
        lb = max(lb, lp_bound(w, P, cap, lb, ub, deadline=deadline))
    return Certificate(counts, ub, min(lb, ub), status, calls, time.perf_counter() - t0, stopped)
