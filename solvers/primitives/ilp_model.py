"""The exact model of one layer for ``ilp`` / ``ilp_weighted``: `LayerProblem` ->
`solve_layer` -> `LayerResult`. CP-SAT on the even-split problem (with the group contract,
traffic and migration terms), a MIP through SCIP with shares, or the pairing method at two
slots per GPU; "optimal" only when a proven bound meets the objective. docs/solvers.md, "ilp".
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from eplb.moves import gpu_moves
from eplb.solvers.primitives import pairing, pairing_exact
from eplb.solvers.primitives.shares import optimal_shares, wrap_layout, wrap_orders
from eplb.tolerance import PROOF_TOL, REL_TOL, better, proven
from eplb.topology import Topology

SCALE_TARGET = 1e8  # scaled max GPU load: at least this many integer units (see _scale)
EXACT_SCALE_LIMIT = 1e13  # largest scaled load for the exact integer scale
DEFAULT_DETERMINISTIC = 10.0  # CP-SAT deterministic seconds per layer without a wall limit
CPSAT_MAX_SEED = 2**31 - 1  # CP-SAT's random_seed is a 32-bit integer


@dataclass(frozen=True, eq=False)
class LayerProblem:
    """One layer of the ilp. Arrays: ``w: float64[E]`` tokens per expert, ``warm: int64[P]`` a
    valid start (``warm_share: float64[P]`` its shares when weighted), ``previous: int64[P]``
    the live slots (migration terms only). ``bound``: a proven lower bound on the objective.
    ``deterministic_time``: CP-SAT deterministic seconds (reproducible); the wall limit is
    given to `solve_layer`."""

    w: np.ndarray
    topology: Topology
    warm: np.ndarray
    warm_share: np.ndarray | None = None
    bound: float = 0.0
    hierarchical: bool = False
    num_groups: int | None = None
    weighted: bool = False
    rdma_weight: float = 0.0
    duplicates: bool = True
    counts: Literal["auto", "free", "fixed"] = "auto"
    max_vars: int = 40_000
    migration_weight: float = 0.0
    migration_budget: int | None = None
    previous: np.ndarray | None = None
    pairing: bool = False
    deterministic_time: float | None = DEFAULT_DETERMINISTIC
    seed: int = 0
    threads: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "w", np.asarray(self.w, dtype=np.float64))
        object.__setattr__(self, "warm", np.asarray(self.warm, dtype=np.int64))
        if self.previous is not None:
            object.__setattr__(self, "previous", np.asarray(self.previous, dtype=np.int64))

    @property
    def E(self) -> int:
        return self.w.size

    @property
    def G(self) -> int:
        return self.topology.num_gpus

    @property
    def S(self) -> int:
        return self.topology.slots_per_gpu

    @property
    def N(self) -> int:
        return self.topology.num_nodes

    @property
    def gpn(self) -> int:
        return self.topology.gpus_per_node

    @property
    def P(self) -> int:
        return self.topology.num_slots

    @property
    def migration(self) -> bool:
        """The objective or constraints price moves against ``previous``."""
        return self.previous is not None and (
            bool(self.migration_weight) or self.migration_budget is not None
        )


@dataclass(frozen=True, eq=False)
class LayerResult:
    """``slots: int64[P]``, ``share: float64[P] | None``; ``objective`` exact, ``bound``
    proven, ``gap = 1 - bound / objective``; ``status`` ``"optimal"`` or ``"feasible"``;
    ``method``: ``bound`` (the start met the bound), ``pairing``, ``cpsat``, ``mip`` or
    ``skipped`` (no time left); ``stopped``: ``"wall"`` when the wall limit cut the search
    (the result then depends on machine speed), else None."""

    slots: np.ndarray
    share: np.ndarray | None
    objective: float
    bound: float
    gap: float
    status: str
    method: str
    seconds: float
    stopped: str | None = None
    refuted: bool = False  # the model's certificate was beaten by an independent layout


# ----------------------------------------------------------------------------- objective
def gpu_load_row(w: np.ndarray, slots: np.ndarray, S: int, share=None) -> np.ndarray:
    """``float64[G]`` GPU loads of one layer's ``slots: int64[P]`` for ``w: float[E]``
    (``share: float[P]``, default the even split; ``-1``: an empty slot)."""
    used = slots >= 0
    e = np.maximum(slots, 0)
    cnt = np.bincount(slots[used], minlength=w.size)
    per = w[e] * (1.0 / np.maximum(cnt[e], 1) if share is None else share)
    return np.where(used, per, 0.0).reshape(-1, S).sum(1)


def _rdma_row(w: np.ndarray, slots: np.ndarray, N: int) -> float:
    node = np.repeat(np.arange(N), slots.size // N)
    held = np.zeros((w.size, N), dtype=bool)
    used = slots >= 0
    held[slots[used], node[used]] = True
    return float((w * (1 - held.sum(1) / N)).sum())


def _gpu_expert(slots: np.ndarray, S: int, E: int) -> np.ndarray:
    """``int64[G, E]`` replicas of each expert on each GPU of ``slots: int64[P]`` (``-1``
    empty)."""
    key = np.arange(slots.size) // S * E + slots
    return np.bincount(key[slots >= 0], minlength=slots.size // S * E).reshape(-1, E)


def _moved_row(slots: np.ndarray, prev: np.ndarray | None, S: int, E: int) -> int:
    # moves as the core counts them (`eplb.moves`: slots whose expert the GPU did not hold)
    if prev is None:
        return 0
    return int(gpu_moves(prev[None], slots[None], slots.size // S).sum())


def objective(pb: LayerProblem, slots: np.ndarray, share=None) -> float:
    """Exact objective of one layer's ``slots: int64[P]`` (``share: float[P]`` or even
    split): max load + traffic + migration terms."""
    val = float(gpu_load_row(pb.w, slots, pb.S, share).max())
    if pb.rdma_weight:
        val += pb.rdma_weight * _rdma_row(pb.w, slots, pb.N) / pb.G
    if pb.migration_weight:
        val += pb.migration_weight * _moved_row(slots, pb.previous, pb.S, pb.E)
    return val


def admissible(pb: LayerProblem, slots: np.ndarray) -> bool:
    """``slots: int64[P]`` belong to the class the model solves (``duplicates=False``: no two
    replicas of an expert on one GPU; ``hierarchical``: every expert group on one node and
    every node holding a group, the model's contract)."""
    slots = np.asarray(slots)
    if pb.hierarchical:
        used = slots >= 0
        group = slots[used] // (pb.E // pb.num_groups)
        node = (np.arange(slots.size) // (pb.gpn * pb.S))[used]
        pairs = np.unique(group * pb.N + node)
        if np.unique(pairs // pb.N).size != pairs.size or np.unique(pairs % pb.N).size != pb.N:
            return False
    if pb.duplicates:
        return True
    e = np.sort(slots.reshape(-1, pb.S), axis=1)
    return not ((e[:, 1:] == e[:, :-1]) & (e[:, 1:] >= 0)).any()


# ----------------------------------------------------------------------------- CP-SAT
def _candidates(pb: LayerProblem, warm: np.ndarray, upper: float):
    """Count candidates per expert and whether they are complete (sound)."""
    w, P, E = pb.w, pb.P, pb.E
    cap = P - E + 1 if pb.duplicates else min(pb.G, P - E + 1)
    if pb.hierarchical:
        cap = min(cap, pb.gpn * pb.S if pb.duplicates else pb.gpn)
    warm_c = np.bincount(warm, minlength=E)
    if pb.counts == "fixed":
        return [[int(c)] for c in warm_c], False
    with np.errstate(divide="ignore", invalid="ignore"):
        lo = np.where(upper > 0, np.ceil(w / upper * (1 - REL_TOL)), 1)
    lo = np.clip(lo, 1, cap).astype(np.int64)
    lo = np.minimum(lo, warm_c)  # keep the warm start feasible under round-off
    F = P - int(lo.sum())
    hi = np.minimum(cap, lo + F)
    size = int((hi - lo + 1).sum()) * pb.G
    if pb.counts == "auto" and size > pb.max_vars:
        return [[int(c)] for c in warm_c], False
    return [list(range(int(a), int(b) + 1)) for a, b in zip(lo, hi, strict=True)], True


def _rounding_units(pb: LayerProblem) -> int:
    """Largest total rounding error of the scaled model's objective, in integer units: one
    per replica on a GPU (``S``), one per traffic term (``E N``), one per moved replica."""
    units = pb.S
    if pb.rdma_weight:
        units += pb.E * pb.N
    if pb.migration_weight:
        units += pb.P
    return units


def _scale(pb: LayerProblem, cands: list[list[int]], max_load: float) -> float:
    """Integer scale of the per-replica loads: exact (every ``scale * w_e / c`` an integer,
    so the model's optimum and bound are the true ones) for integer loads whose candidate
    counts have a small common multiple; else ``max_load`` (the start's) becomes ``8 units /
    PROOF_TOL`` integer units (``units``: `_rounding_units`), loads rounded down: the model's
    bound stays a valid lower bound and its optimum is within ``PROOF_TOL / 8`` of the true
    one, so a truly optimal layer is certified."""
    w = pb.w
    if np.all(w == np.round(w)):
        lcm = 1
        for c in {c for cs in cands for c in cs}:
            lcm = math.lcm(lcm, c)
        if lcm * float(w.max(initial=0.0)) * max(len(cands), 1) <= EXACT_SCALE_LIMIT:
            return float(lcm)
    target = max(SCALE_TARGET, 8 * _rounding_units(pb) / PROOF_TOL)
    return target / max_load if max_load > 0 else 1.0


def canonical_unit(w: np.ndarray) -> float:
    """The load unit that makes the integer model scale-free: ``w / unit`` (exact in floating
    point) is the same array for ``w`` and ``c * w`` whenever both are exact in floating point
    (issue 18: a model built on raw loads gave CP-SAT other coefficients, and so another
    search, for the load times 2). ``w: float[E] >= 0``; the primitive integer vector of ``w``
    when one fits in 53 bits, else a power of two near ``w.max()``."""
    nz = w[w > 0]
    if nz.size == 0:
        return 1.0
    mant, exp = np.frexp(nz)
    ints = (mant * 2.0**53).astype(np.int64)  # exact: 53-bit mantissas
    low = np.array([(int(i) & -int(i)).bit_length() - 1 for i in ints])
    k = int((exp - 53 + low).min())  # every load is an integer multiple of 2**k
    with np.errstate(over="ignore"):
        top = float(np.ldexp(nz.max(), -k))
    if top <= 2.0**53:
        g = int(np.gcd.reduce(np.ldexp(nz, -k).astype(np.int64)))
        return float(np.ldexp(float(g), k))
    return float(2.0 ** math.floor(math.log2(float(nz.max()))))


def canonical(pb: LayerProblem) -> tuple[LayerProblem, float]:
    """``(pb in units of canonical_unit(pb.w), unit)``: the same problem with every objective
    term divided by ``unit`` (the migration price too), so objectives and bounds scale back
    by ``unit``."""
    unit = canonical_unit(pb.w)
    if unit == 1.0:
        return pb, 1.0
    return replace(
        pb, w=pb.w / unit, bound=pb.bound / unit, migration_weight=pb.migration_weight / unit,
        warm_share=pb.warm_share,
    ), unit


def _limits(params, pb: LayerProblem, wall: float | None) -> None:
    """CP-SAT limits: deterministic time (reproducible) and/or wall seconds; without a wall
    limit a safety net of ``5 deterministic + 5`` seconds."""
    dt = pb.deterministic_time
    if dt is not None:
        params.max_deterministic_time = dt
        net = 5 * dt + 5
        params.max_time_in_seconds = net if wall is None else min(net, wall)
    elif wall is not None:
        params.max_time_in_seconds = wall


class _OutOfTime(Exception):
    """The layer's end came while its model was being built."""


def _check_end(end: float | None) -> None:
    if end is not None and time.time() >= end:
        raise _OutOfTime


def _clip(wall: float | None, end: float | None) -> float | None:
    """``wall`` seconds, at most the time left until ``end``."""
    if end is None:
        return wall
    left = max(0.0, end - time.time())
    return left if wall is None else min(wall, left)


def _skipped(exact: bool) -> dict:
    """What a model solve reports when its wall time ran out before the search began."""
    return {"exact_model": exact, "cp_status": "UNKNOWN", "cp_bound": None, "stopped": "wall",
            "method": "skipped"}


def _solve_cpsat(
    pb: LayerProblem, warm: np.ndarray, wall: float | None, end: float | None = None
) -> dict:
    """CP-SAT on the even-split model: a search of at most ``wall`` seconds, all done by
    ``end`` (``time.time()``, the whole solve's deadline; None: no deadline): building the
    model counts, and a build that reaches ``end`` searches nothing."""
    try:
        return _cpsat(pb, warm, wall, end)
    except _OutOfTime:
        return _skipped(False)


def _cpsat(pb: LayerProblem, warm: np.ndarray, wall: float | None, end: float | None) -> dict:
    from ortools.sat.python import cp_model  # lazy: OR-Tools is heavy; start-up avoids it

    w, G, S, N, gpn, P = pb.w, pb.G, pb.S, pb.N, pb.gpn, pb.P
    E = pb.E
    upper = objective(pb, warm)
    cands, exact = _candidates(pb, warm, upper)
    scale = _scale(pb, cands, float(gpu_load_row(w, warm, S).max()))
    m = cp_model.CpModel()
    warm_c = np.bincount(warm, minlength=E)
    warm_y = np.bincount(np.arange(P) // S * E + warm, minlength=G * E).reshape(G, E)
    gpu_terms = [[] for _ in range(G)]
    gpu_count = [[] for _ in range(G)]
    per_node = [[[] for _ in range(N)] for _ in range(E)]
    exp_gpu = [[[] for _ in range(G)] for _ in range(E)]
    hints = []
    group = None
    if pb.hierarchical:
        ng = pb.num_groups
        group = np.arange(E) // (E // ng)
        a = [[m.NewBoolVar(f"a{k}_{n}") for n in range(N)] for k in range(ng)]
        for k in range(ng):
            m.AddExactlyOne(a[k])
        for n in range(N):
            m.AddBoolOr([a[k][n] for k in range(ng)])
            m.Add(sum((E // ng) * a[k][n] for k in range(ng)) <= gpn * S)
        warm_node = warm.reshape(N, -1)
        for k in range(ng):
            node_k = int(np.nonzero((group[warm_node] == k).any(1))[0][0])
            for n in range(N):
                hints.append((a[k][n], int(n == node_k)))
    for e in range(E):
        _check_end(end)
        cs = cands[e]
        xs = {}
        for c in cs:
            xs[c] = m.NewConstant(1) if len(cs) == 1 else m.NewBoolVar(f"x{e}_{c}")
            if len(cs) > 1:
                hints.append((xs[c], int(c == warm_c[e])))
        if len(cs) > 1:
            m.AddExactlyOne(list(xs.values()))
        for c in cs:
            r = int(math.floor(scale * w[e] / c))
            ub = min(c, S) if pb.duplicates else 1
            ys = []
            for g in range(G):
                y = m.NewIntVar(0, ub, f"y{e}_{c}_{g}") if ub > 1 else m.NewBoolVar(f"y{e}_{c}_{g}")
                ys.append(y)
                gpu_terms[g].append((r, y))
                gpu_count[g].append(y)
                per_node[e][g // gpn].append(y)
                exp_gpu[e][g].append(y)
                hints.append((y, int(warm_y[g, e]) if c == warm_c[e] else 0))
                if group is not None:
                    host = a[int(group[e])][g // gpn]
                    if ub > 1:
                        m.Add(y <= ub * host)
                    else:
                        m.AddImplication(y, host)
            m.Add(sum(ys) == c * xs[c])
    loads = []
    zmax = int(math.floor(scale * w.sum())) + 1
    for g in range(G):
        m.Add(sum(gpu_count[g]) == S)
        lg = m.NewIntVar(0, zmax, f"load{g}")
        m.Add(lg == sum(r * y for r, y in gpu_terms[g]))
        loads.append(lg)
    z = m.NewIntVar(0, zmax, "z")
    for lg in loads:
        m.Add(z >= lg)
    if not pb.migration:  # symmetry: GPUs ordered by load (inside each node if nodes matter)
        global_sym = not (pb.hierarchical or pb.rdma_weight)
        for g in range(G - 1):
            if global_sym or (g + 1) % gpn:
                m.Add(loads[g] >= loads[g + 1])
    terms = [z]
    if pb.rdma_weight:
        lam = pb.rdma_weight
        for e in range(E):
            coef = int(math.ceil(scale * lam * w[e] / (G * N)))
            if coef == 0:
                continue
            for n in range(N):
                h = m.NewBoolVar(f"h{e}_{n}")
                m.Add(h <= sum(per_node[e][n]))
                terms.append(-coef * h)
                hints.append((h, int((warm.reshape(N, -1)[n] == e).any())))
    if pb.migration:
        old = _gpu_expert(pb.previous, S, E)
        # `eplb.moves`: every replica on a GPU that held none of its expert moves; more
        # copies of an expert the GPU held are local copies
        moved_terms = [sum(exp_gpu[e][g]) for e in range(E) for g in range(G) if old[g, e] == 0]
        if pb.migration_budget is not None:
            m.Add(sum(moved_terms) <= int(pb.migration_budget))
        if pb.migration_weight:
            terms.append(int(math.floor(scale * pb.migration_weight)) * sum(moved_terms))
    m.Minimize(sum(terms))
    for g in range(G):  # hint: loads of the warm start (already ordered by the caller)
        held = np.nonzero(warm_y[g])[0]
        val = sum(int(math.floor(scale * w[e] / warm_c[e])) * int(warm_y[g, e]) for e in held)
        hints.append((loads[g], val))
    for i, (var, val) in enumerate(hints):
        if i % 4096 == 0:
            _check_end(end)
        m.AddHint(var, val)
    _check_end(end)
    wall = _clip(wall, end)
    solver = cp_model.CpSolver()
    p = solver.parameters
    p.num_workers = pb.threads
    p.random_seed = pb.seed
    _limits(p, pb, wall)
    status = solver.Solve(m)
    out = {"exact_model": exact, "cp_status": solver.StatusName(status)}
    found = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    if found:
        ys = np.zeros((G, E), dtype=np.int64)
        for e in range(E):
            for g in range(G):
                ys[g, e] = sum(solver.Value(v) for v in exp_gpu[e][g])
        out["slots"] = np.concatenate([np.repeat(np.arange(E), ys[g]) for g in range(G)])
    const = pb.rdma_weight * float(w.sum()) / G if pb.rdma_weight else 0.0
    out["cp_bound"] = solver.BestObjectiveBound() / scale + const if found else None
    out["stopped"] = _stopped(
        status in (cp_model.OPTIMAL, cp_model.INFEASIBLE), solver.WallTime(), wall, pb
    )
    return out


def _stopped(done: bool, wall_used: float, wall: float | None, pb: LayerProblem) -> str | None:
    """``"wall"`` when the search ended by the wall limit (not proven, limit reached)."""
    if done or wall is None:
        return None
    return "wall" if wall_used >= 0.95 * wall else None


# ----------------------------------------------------------------------------- MIP (shares)
def weighted_unit(w: np.ndarray, num_gpus: int) -> float:
    """The MIP's load unit for ``w: float[E]``: the mean GPU load (1 for an all-zero layer)."""
    mean = float(w.sum()) / num_gpus
    return mean if mean > 0 else 1.0


def _solve_weighted(
    pb: LayerProblem, warm: np.ndarray, wall: float | None, end: float | None = None
) -> dict:
    """SCIP on the shares model, within ``wall`` and done by ``end`` as `_solve_cpsat`."""
    try:
        return _weighted(pb, warm, wall, end)
    except _OutOfTime:
        return _skipped(True)


def _weighted(pb: LayerProblem, warm: np.ndarray, wall: float | None, end: float | None) -> dict:
    from ortools.linear_solver import pywraplp  # lazy: OR-Tools is heavy; start-up avoids it

    G, S, N, gpn, P = pb.G, pb.S, pb.N, pb.gpn, pb.P
    E = pb.E
    # the model in units of the mean GPU load: SCIP's tolerances are absolute (feasibility
    # 1e-6, integrality 1e-6 against big-M rows ``f <= w z``), so loads of 1e11 certified false
    # optima and loads of 1e-9 are noise; in these units every coefficient is O(1) .. O(G)
    unit = weighted_unit(pb.w, G)
    w = pb.w / unit
    solver = pywraplp.Solver.CreateSolver("SCIP")
    inf = solver.infinity()
    # one replica per GPU suffices when every GPU can be filled with distinct experts (a
    # duplicate merges into its twin, and the freed slot takes any absent expert with share
    # 0); a node of the group contract holds only its groups' experts, so with groups smaller
    # than S a GPU may need two replicas of one expert
    small = E < S or (pb.hierarchical and E // pb.num_groups < S)
    zmax = S if small else 1
    z = [[solver.IntVar(0, zmax, f"z{e}_{g}") for g in range(G)] for e in range(E)]
    f = [[solver.NumVar(0, float(w[e]), f"f{e}_{g}") for g in range(G)] for e in range(E)]
    t = solver.NumVar(0, inf, "T")
    for e in range(E):
        _check_end(end)
        solver.Add(sum(z[e]) >= 1)
        solver.Add(sum(f[e]) == float(w[e]))
        for g in range(G):
            solver.Add(f[e][g] <= float(w[e]) * z[e][g])
    for g in range(G):
        solver.Add(sum(z[e][g] for e in range(E)) == S)
        solver.Add(sum(f[e][g] for e in range(E)) <= t)
    obj = t
    const = 0.0
    if pb.rdma_weight:
        lam = pb.rdma_weight
        const = lam * float(w.sum()) / G
        for e in range(E):
            for n in range(N):
                h = solver.BoolVar(f"h{e}_{n}")
                solver.Add(h <= sum(z[e][g] for g in range(n * gpn, (n + 1) * gpn)))
                obj = obj - lam * float(w[e]) / (G * N) * h
    if pb.hierarchical:
        ng = pb.num_groups
        M = E // ng
        a = [[solver.BoolVar(f"a{k}_{n}") for n in range(N)] for k in range(ng)]
        for k in range(ng):
            solver.Add(sum(a[k]) == 1)
        for n in range(N):
            solver.Add(sum(a[k][n] for k in range(ng)) >= 1)
        for e in range(E):
            for g in range(G):
                solver.Add(z[e][g] <= zmax * a[e // M][g // gpn])
    solver.Minimize(obj)
    warm_y = np.bincount(np.arange(P) // S * E + warm, minlength=G * E).reshape(G, E)
    hint_vars = [z[e][g] for e in range(E) for g in range(G)]
    hint_vals = [float(min(warm_y[g, e], zmax)) for e in range(E) for g in range(G)]
    solver.SetHint(hint_vars, hint_vals)
    _check_end(end)
    wall = _clip(wall, end)
    limit = wall if wall is not None else (pb.deterministic_time or DEFAULT_DETERMINISTIC)
    solver.SetTimeLimit(max(1, int(1000 * limit)))
    solver.SetNumThreads(pb.threads)
    t0 = time.perf_counter()
    status = solver.Solve()
    used = time.perf_counter() - t0
    out = {"exact_model": True, "cp_status": {0: "OPTIMAL", 1: "FEASIBLE"}.get(status, str(status))}
    out["stopped"] = _stopped(status == pywraplp.Solver.OPTIMAL, used, wall, pb)
    if status in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
        zs = np.array([[round(z[e][g].solution_value()) for e in range(E)] for g in range(G)])
        if (zs.sum(1) == S).all() and (zs.sum(0) >= 1).all():
            out["slots"] = np.concatenate([np.repeat(np.arange(E), zs[g]) for g in range(G)])
        out["cp_bound"] = (solver.Objective().BestBound() + const) * unit
    else:
        out["cp_bound"] = None
    return out


def _partial(pb: LayerProblem) -> bool:
    """The live layer leaves slots empty: it is a candidate the model (every slot used) does
    not hold, so the model's bound proves nothing about it (the analytic bound does)."""
    return pb.migration and bool((pb.previous < 0).any())


# ----------------------------------------------------------------------------- one layer
def solve_layer(
    pb: LayerProblem, wall: float | None = None, deadline: float | None = None
) -> LayerResult:
    """Solve one layer within ``wall`` seconds (None: only ``pb.deterministic_time``), ending
    by ``deadline`` (``time.time()``; the whole solve's) however long the model takes to build;
    see the docs/solvers.md ("ilp") for what is certified."""
    t0 = time.perf_counter()
    if deadline is not None:
        left = max(0.0, deadline - time.time())
        wall = left if wall is None else min(wall, left)
    w, S = pb.w, pb.S
    warm, warm_share = pb.warm, pb.warm_share
    fallback = (warm, warm_share)
    best_slots, best_share = warm, warm_share
    best = objective(pb, warm, warm_share) if admissible(pb, warm) else np.inf
    if pb.migration:
        # the live placement itself moves nothing: an incumbent that always meets the budget
        if (
            pb.migration_budget is not None
            and _moved_row(warm, pb.previous, S, pb.E) > pb.migration_budget
        ):
            best = np.inf
        val = objective(pb, pb.previous) if admissible(pb, pb.previous) else np.inf
        if val < best:
            best_slots, best_share, best = pb.previous, None, val
        if (best_slots >= 0).all():  # the model's hints need every slot used
            warm, warm_share = best_slots, best_share
    bound = pb.bound
    method, stopped = "cpsat", None
    if np.isfinite(best) and not better(bound, best):
        method = "bound"
    elif wall is not None and wall <= 0:
        method, stopped = "skipped", "wall"
    elif pb.pairing:
        method = "pairing"
        start = np.bincount(warm, minlength=pb.E)
        cert = pairing_exact.certify(
            w, pb.P, start, time_limit=pb.deterministic_time, wall_limit=wall
        )
        stopped = cert.stopped
        bound = max(bound, cert.bound)
        if better(cert.objective, best):
            packed = pairing.pair_layout(w[None], cert.counts[None], repair=False)
            slots = packed.slot_e.reshape(-1)
            val = objective(pb, slots)
            if better(val, best):
                best_slots, best = slots, val
    else:
        if pb.weighted:  # the MIP has its own unit (`weighted_unit`)
            res = _solve_weighted(pb, _order_warm(pb, warm), wall, deadline)
        else:  # the integer model on scale-free loads (`canonical`)
            cpb, unit = canonical(pb)
            res = _solve_cpsat(cpb, _order_warm(cpb, warm), wall, deadline)
            if res["cp_bound"] is not None:
                res["cp_bound"] *= unit
        method = res.get("method", "mip" if pb.weighted else "cpsat")
        stopped = res["stopped"]
        if "slots" in res:
            slots = res["slots"]
            share = None
            if pb.weighted:
                share = optimal_shares(w[None], slots[None], pb.topology)[0][0]
            val = objective(pb, slots, share)
            if better(val, best) and admissible(pb, slots):
                best_slots, best_share, best = slots, share, val
        if res["exact_model"] and res["cp_bound"] is not None and not _partial(pb):
            bound = max(bound, float(res["cp_bound"]))
    if not np.isfinite(best):  # nothing of the requested class found: the start, uncertified
        best_slots, best_share = fallback
        best = objective(pb, best_slots, best_share)
        bound = pb.bound
    refuted = False
    if pb.weighted and proven(bound, best) and not proven(pb.bound, best):
        # the certificate rests on the MIP's bound alone: test it by independent constructions
        found = _refute(pb, best_slots, bound)
        if found is not None:
            refuted = True
            bound = pb.bound  # the MIP's bound is false: keep the analytic one
            if better(found[2], best):
                best_slots, best_share, best = found
    # an objective below the analytic bound means one of them is wrong: certify nothing
    consistent = best >= pb.bound * (1 - PROOF_TOL) or best <= 0
    status = "optimal" if consistent and proven(bound, best) else "feasible"
    bound = min(bound, best)
    return LayerResult(
        slots=np.asarray(best_slots, dtype=np.int64),
        share=best_share,
        objective=best,
        bound=bound,
        gap=0.0 if best <= 0 else max(0.0, 1 - bound / best),
        status=status,
        method=method,
        seconds=time.perf_counter() - t0,
        stopped=stopped,
        refuted=refuted,
    )


def _refute(pb: LayerProblem, slots: np.ndarray, bound: float):
    """``(slots, share, objective)`` of a weighted placement found by the wrap-around rule
    (`shares.wrap_layout`, per node on the nodes of ``slots`` with the group contract) whose
    objective is below ``bound``, or None. Independent of the MIP: a certificate it beats
    was false."""
    if pb.rdma_weight:
        return None
    w, S, gpn = pb.w, pb.S, pb.gpn
    if pb.hierarchical:
        M = pb.E // pb.num_groups
        node_of = np.full(pb.num_groups, -1)
        node_of[slots // M] = np.arange(slots.size) // (gpn * S)
        members = [np.nonzero(np.repeat(node_of, M) == n)[0] for n in range(pb.N)]
        parts = []
        for mine in members:
            sub = None
            for order in wrap_orders(w[mine]):
                sub = wrap_layout(w[mine], gpn, S, order)
                if sub is not None:
                    break
            if sub is None:
                return None
            parts.append(mine[sub])
        candidates = [np.concatenate(parts)]
    else:
        candidates = [wrap_layout(w, pb.G, S, o) for o in wrap_orders(w)]
    best = None
    for cand in candidates:
        if cand is None:
            continue
        share = optimal_shares(w[None], cand[None], pb.topology)[0][0]
        val = objective(pb, cand, share)
        if better(val, bound) and (best is None or val < best[2]):
            best = (cand, share, val)
    return best


def _order_warm(pb: LayerProblem, slots: np.ndarray) -> np.ndarray:
    """Reorder the warm start's GPUs to satisfy the symmetry-breaking constraints."""
    if pb.migration:
        return slots
    S, gpn, w = pb.S, pb.gpn, pb.w
    gpus = slots.reshape(-1, S)
    cands, _ = _candidates(pb, slots, objective(pb, slots))
    scale = _scale(pb, cands, float(gpu_load_row(w, slots, S).max()))
    if not np.isfinite(scale):  # a subnormal load: order by the loads themselves
        scale = 1.0
    cnt = np.bincount(slots, minlength=w.size)
    r = np.floor(scale * w / np.maximum(cnt, 1))
    key = r[gpus].sum(1)  # the model's (rounded) loads
    if pb.hierarchical or pb.rdma_weight:
        blocks = gpus.reshape(-1, gpn, S)
        kb = key.reshape(-1, gpn)
        order = np.argsort(-kb, axis=1, kind="stable")
        return np.take_along_axis(blocks, order[:, :, None], 1).reshape(-1)
    return gpus[np.argsort(-key, kind="stable")].reshape(-1)
