"""``ilp``: exact placement by integer programming, warm-started, one layer per process.

Even split (the default) is modelled for OR-Tools CP-SAT, per layer:

- ``x[e, c]`` boolean: expert ``e`` has ``c`` replicas, for ``c`` in a candidate set ``C_e``
  (exactly one per expert); every replica of ``e`` then weighs ``w_e / c``;
- ``y[e, c, g]`` integer in ``0..min(c, S)``: replicas of ``e`` on GPU ``g`` when it has ``c``
  (boolean with ``duplicates=False``); ``sum_g y[e, c, g] = c x[e, c]``;
- every GPU holds exactly ``S`` replicas; ``load_g = sum r[e, c] y[e, c, g] <= Z``; minimise
  ``Z`` (plus the traffic and migration terms below).

The per-replica loads are scaled to integers and rounded down, so the model's optimum is a
valid lower bound of the true one (bounds are reported after dividing the scale back out;
objectives are always recomputed exactly from the placement). ``C_e`` is sound: a solution
better than the warm start ``U`` needs ``w_e / c <= U``, and counts sum to ``P``. When the
candidate sets are too large (``counts="auto"`` and more than ``max_vars`` ``y`` variables)
the counts are fixed to the warm start's (the issue's trick: such models close the gap fast)
and the reported bound is then the analytic one (`solvers.bounds`), never the restricted
model's. GPUs are interchangeable, so GPU loads are ordered (within nodes when node identity
matters) to break symmetry.

Options: ``hierarchical=True`` adds ``a[group, node]`` (each group on one node, every node at
least one group, replicas only on their group's node). ``rdma_weight`` adds
``rdma_weight / G * sum_e w_e (1 - sum_n h[e, n] / N)`` with ``h[e, n] <= replicas on n``
(`traffic_cost`). ``migration_weight`` (tokens per moved replica) and ``migration_budget``
(max moved replicas per layer) use ``previous``. ``weighted=True`` solves a MIP through
OR-Tools (SCIP): boolean ``z[e, g]``, continuous tokens ``f[e, g] <= w_e z[e, g]``, and the
shares are polished by the exact LP (`shares.optimal_shares`).

With two slots per GPU and plain even split the exact pairing method (`pairing.certify`) is
used instead: it certifies the optimum where CP-SAT proves little.

Every layer starts from the greedy placement (``hierarchical``, weighted or traffic-aware
variant as requested) and the result is never worse than it. ``time_limit`` (default 10 s) is
per layer, in CP-SAT deterministic seconds (roughly wall seconds; results do not depend on
machine speed) with a wall-clock safety net at 5x + 5 s. Layers run in a process pool
(``workers``, default the CPU count; results keep layer order).
``meta["solver"]``: per layer ``objective``, ``bound``, ``gap``, ``status``, and aggregates.
"""

from __future__ import annotations

import math
import os
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Literal

import numpy as np

from eplb.errors import InputError
from eplb.placement import Placement
from eplb.topology import Topology
from solvers.registry import register
from solvers.tolerance import better, proven
from solvers.traffic_cost import check_rdma_weight
from solvers.validation import NonNegFloat, NonNegInt, PositiveInt

SCALE_TARGET = 1e8  # scaled max GPU load ~ this many integer units
EXACT_SCALE_LIMIT = 1e13  # largest scaled total load for the exact integer scale
DEFAULT_TIME = 10.0


# ----------------------------------------------------------------------------- helpers
def _gpu_load_row(w: np.ndarray, slots: np.ndarray, S: int, share=None) -> np.ndarray:
    cnt = np.bincount(slots, minlength=w.size)
    per = w[slots] * (1.0 / cnt[slots] if share is None else share)
    return per.reshape(-1, S).sum(1)


def _rdma_row(w: np.ndarray, slots: np.ndarray, N: int) -> float:
    node = np.repeat(np.arange(N), slots.size // N)
    held = np.zeros((w.size, N), dtype=bool)
    held[slots, node] = True
    return float((w * (1 - held.sum(1) / N)).sum())


def _moved_row(slots: np.ndarray, prev: np.ndarray | None, S: int, E: int) -> int:
    if prev is None:
        return 0
    G = slots.size // S
    key = np.arange(slots.size) // S * E
    a = np.bincount(key + prev, minlength=G * E)
    b = np.bincount(key + slots, minlength=G * E)
    return int(np.maximum(b - a, 0).sum())


def layer_objective(task: dict, slots: np.ndarray, share=None) -> float:
    """Exact objective of one layer's slots (max load + traffic + migration terms)."""
    w, S, G, N = task["w"], task["S"], task["G"], task["N"]
    val = float(_gpu_load_row(w, slots, S, share).max())
    if task["rdma_weight"]:
        val += task["rdma_weight"] * _rdma_row(w, slots, N) / G
    if task["migration_weight"]:
        val += task["migration_weight"] * _moved_row(slots, task["previous"], S, w.size)
    return val


# ----------------------------------------------------------------------------- CP-SAT
def _candidates(task: dict, warm: np.ndarray, upper: float):
    """Count candidates per expert and whether they are complete (sound)."""
    w, P, E = task["w"], task["P"], task["w"].size
    cap = P - E + 1 if task["duplicates"] else min(task["G"], P - E + 1)
    if task["hierarchical"]:
        cap = min(cap, task["gpn"] * task["S"] if task["duplicates"] else task["gpn"])
    warm_c = np.bincount(warm, minlength=E)
    mode = task["counts"]
    if mode == "fixed":
        return [[int(c)] for c in warm_c], False
    with np.errstate(divide="ignore", invalid="ignore"):
        lo = np.where(upper > 0, np.ceil(w / upper * (1 - 1e-12)), 1)
    lo = np.clip(lo, 1, cap).astype(np.int64)
    lo = np.minimum(lo, warm_c)  # keep the warm start feasible under round-off
    F = P - int(lo.sum())
    hi = np.minimum(cap, lo + F)
    size = int((hi - lo + 1).sum()) * task["G"]
    if mode == "auto" and size > task["max_vars"]:
        return [[int(c)] for c in warm_c], False
    return [list(range(int(a), int(b) + 1)) for a, b in zip(lo, hi, strict=True)], True


def _scale(w: np.ndarray, cands: list[list[int]], max_load: float) -> float:
    """Integer scale of the per-replica loads: exact (every ``scale * w_e / c`` an integer,
    so the model's optimum and bound are the true ones) for integer loads whose candidate
    counts have a small common multiple; else ``SCALE_TARGET / max_load`` (rounded down:
    the model's bound stays a valid lower bound, within ``S / SCALE_TARGET`` relative)."""
    if np.all(w == np.round(w)):
        lcm = 1
        for c in {c for cs in cands for c in cs}:
            lcm = math.lcm(lcm, c)
        if lcm * float(w.max(initial=0.0)) * max(len(cands), 1) <= EXACT_SCALE_LIMIT:
            return float(lcm)
    return SCALE_TARGET / max_load if max_load > 0 else 1.0


def _solve_cpsat(task: dict, warm: np.ndarray) -> dict:
    from ortools.sat.python import cp_model

    w, G, S, N, gpn, P = task["w"], task["G"], task["S"], task["N"], task["gpn"], task["P"]
    E = w.size
    # an optimum's max GPU load is at most its objective, which is at most the warm start's
    # (the traffic and migration terms are >= 0): the candidate counts keep every such optimum
    upper = layer_objective(task, warm)
    cands, exact = _candidates(task, warm, upper)
    scale = _scale(w, cands, float(_gpu_load_row(w, warm, S).max()))
    m = cp_model.CpModel()
    warm_c = np.bincount(warm, minlength=E)
    warm_y = np.bincount(np.arange(P) // S * E + warm, minlength=G * E).reshape(G, E)
    gpu_terms = [[] for _ in range(G)]
    gpu_count = [[] for _ in range(G)]
    per_node = [[[] for _ in range(N)] for _ in range(E)]
    exp_gpu = [[[] for _ in range(G)] for _ in range(E)]
    hints = []
    group = None
    if task["hierarchical"]:
        ng = task["num_groups"]
        group = np.arange(E) // (E // ng)
        a = [[m.NewBoolVar(f"a{k}_{n}") for n in range(N)] for k in range(ng)]
        for k in range(ng):
            m.AddExactlyOne(a[k])
        for n in range(N):
            m.AddBoolOr([a[k][n] for k in range(ng)])
            cap_n = gpn * S
            m.Add(sum((E // ng) * a[k][n] for k in range(ng)) <= cap_n)
        warm_node = warm.reshape(N, -1)
        for k in range(ng):
            node_k = int(np.nonzero((group[warm_node] == k).any(1))[0][0])
            for n in range(N):
                hints.append((a[k][n], int(n == node_k)))
    for e in range(E):
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
            ub = min(c, S) if task["duplicates"] else 1
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
    free_labels = task["previous"] is None or not (task["migration_weight"]
                                                   or task["migration_budget"] is not None)
    if free_labels:  # symmetry: GPUs ordered by load (inside each node if nodes matter)
        global_sym = not (task["hierarchical"] or task["rdma_weight"])
        for g in range(G - 1):
            if global_sym or (g + 1) % gpn:
                m.Add(loads[g] >= loads[g + 1])
    objective = [z]
    if task["rdma_weight"]:
        lam = task["rdma_weight"]
        for e in range(E):
            coef = int(math.ceil(scale * lam * w[e] / (G * N)))
            if coef == 0:
                continue
            for n in range(N):
                h = m.NewBoolVar(f"h{e}_{n}")
                m.Add(h <= sum(per_node[e][n]))
                objective.append(-coef * h)
                hints.append((h, int((warm.reshape(N, -1)[n] == e).any())))
    moved_terms = []
    if task["previous"] is not None and (task["migration_weight"]
                                         or task["migration_budget"] is not None):
        prev = task["previous"]
        old = np.bincount(np.arange(P) // S * E + prev, minlength=G * E).reshape(G, E)
        for e in range(E):
            for g in range(G):
                tot = sum(exp_gpu[e][g])
                if old[g, e] == 0:
                    moved_terms.append(tot)
                else:
                    mv = m.NewIntVar(0, S, f"mv{e}_{g}")
                    m.Add(mv >= tot - int(old[g, e]))
                    moved_terms.append(mv)
                    hints.append((mv, max(0, int(warm_y[g, e]) - int(old[g, e]))))
        if task["migration_budget"] is not None:
            m.Add(sum(moved_terms) <= int(task["migration_budget"]))
        if task["migration_weight"]:
            coef = int(math.floor(scale * task["migration_weight"]))
            objective.append(coef * sum(moved_terms))
    m.Minimize(sum(objective))
    # hint: loads of the warm start (already ordered by the caller)
    for g in range(G):
        held = np.nonzero(warm_y[g])[0]
        val = sum(int(math.floor(scale * w[e] / warm_c[e])) * int(warm_y[g, e]) for e in held)
        hints.append((loads[g], val))
    for var, val in hints:
        m.AddHint(var, val)
    solver = cp_model.CpSolver()
    p = solver.parameters
    p.num_workers = task["threads"]
    p.random_seed = task["seed"]
    p.max_deterministic_time = task["time_limit"]
    p.max_time_in_seconds = 5 * task["time_limit"] + 5  # safety net only
    status = solver.Solve(m)
    out = {"exact_model": exact}
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        ys = np.zeros((G, E), dtype=np.int64)
        for e in range(E):
            for g in range(G):
                ys[g, e] = sum(solver.Value(v) for v in exp_gpu[e][g])
        slots = np.concatenate([np.repeat(np.arange(E), ys[g]) for g in range(G)])
        out["slots"] = slots
    out["cp_status"] = solver.StatusName(status)
    const = 0.0
    if task["rdma_weight"]:
        const = task["rdma_weight"] * float(w.sum()) / G
    found = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    out["cp_bound"] = solver.BestObjectiveBound() / scale + const if found else None
    out["optimal"] = status == cp_model.OPTIMAL
    return out


# ----------------------------------------------------------------------------- MIP (shares)
def _solve_weighted(task: dict, warm: np.ndarray) -> dict:
    from ortools.linear_solver import pywraplp

    w, G, S, N, gpn, P = task["w"], task["G"], task["S"], task["N"], task["gpn"], task["P"]
    E = w.size
    solver = pywraplp.Solver.CreateSolver("SCIP")
    inf = solver.infinity()
    # one replica per GPU suffices when every GPU can be filled with distinct experts (a
    # duplicate merges into its twin, and the freed slot takes any absent expert with share
    # 0); a node of the group contract holds only its groups' experts, so with groups smaller
    # than S a GPU may need two replicas of one expert
    small = E < S or (task["hierarchical"] and E // task["num_groups"] < S)
    zmax = S if small else 1
    z = [[solver.IntVar(0, zmax, f"z{e}_{g}") for g in range(G)] for e in range(E)]
    f = [[solver.NumVar(0, float(w[e]), f"f{e}_{g}") for g in range(G)] for e in range(E)]
    t = solver.NumVar(0, inf, "T")
    for e in range(E):
        solver.Add(sum(z[e]) >= 1)
        solver.Add(sum(f[e]) == float(w[e]))
        for g in range(G):
            solver.Add(f[e][g] <= float(w[e]) * z[e][g])
    for g in range(G):
        solver.Add(sum(z[e][g] for e in range(E)) == S)
        solver.Add(sum(f[e][g] for e in range(E)) <= t)
    obj = t
    const = 0.0
    if task["rdma_weight"]:
        lam = task["rdma_weight"]
        const = lam * float(w.sum()) / G
        for e in range(E):
            for n in range(N):
                h = solver.BoolVar(f"h{e}_{n}")
                solver.Add(h <= sum(z[e][g] for g in range(n * gpn, (n + 1) * gpn)))
                obj = obj - lam * float(w[e]) / (G * N) * h
    if task["hierarchical"]:
        ng = task["num_groups"]
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
    solver.SetTimeLimit(int(1000 * task["time_limit"]))
    solver.SetNumThreads(task["threads"])
    status = solver.Solve()
    out = {"exact_model": True, "cp_status": {0: "OPTIMAL", 1: "FEASIBLE"}.get(status, str(status))}
    if status in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
        zs = np.array([[round(z[e][g].solution_value()) for e in range(E)] for g in range(G)])
        if (zs.sum(1) == S).all() and (zs.sum(0) >= 1).all():
            out["slots"] = np.concatenate([np.repeat(np.arange(E), zs[g]) for g in range(G)])
        out["cp_bound"] = solver.Objective().BestBound() + const
        out["optimal"] = status == pywraplp.Solver.OPTIMAL
    else:
        out["cp_bound"] = None
        out["optimal"] = False
    return out


# ----------------------------------------------------------------------------- one layer
def solve_layer(task: dict) -> dict:
    """Solve one layer; returns slots, shares, objective, bound, status, seconds.

    ``status`` is ``"optimal"`` only when a proven lower bound meets the exact objective of
    the returned slots (`tolerance.proven`); the bound is the best of the analytic one
    (``task["bound"]``), the exact model's and the pairing certificate, each used only for
    placements of the class it holds for.
    """
    t0 = time.perf_counter()
    w, S = task["w"], task["S"]
    warm = task["warm"]
    warm_share = task.get("warm_share")
    fallback = (warm, warm_share)
    best_slots, best_share = warm, warm_share
    best = layer_objective(task, warm, warm_share) if _admissible(task, warm) else np.inf
    prev = task["previous"]
    if prev is not None and (task["migration_weight"] or task["migration_budget"] is not None):
        # the live placement itself moves nothing: an incumbent that always meets the budget
        if task["migration_budget"] is not None and _moved_row(
                warm, prev, S, w.size) > task["migration_budget"]:
            best = np.inf
        val = layer_objective(task, prev) if _admissible(task, prev) else np.inf
        if val < best:
            best_slots, best_share, best = prev, None, val
        warm, warm_share = best_slots, best_share
    bound = task["bound"]
    method = "cpsat"
    if np.isfinite(best) and not better(bound, best):
        method = "bound"
    elif task["pairing"]:
        from solvers import pairing

        method = "pairing"
        start = np.bincount(warm, minlength=w.size)
        cert = pairing.certify(w, task["P"], start, time_limit=task["time_limit"])
        bound = max(bound, cert.bound)
        if better(cert.objective, best):
            from solvers.pairing import pair_layout

            packed = pair_layout(w[None], cert.counts[None], repair=False)
            slots = packed.slot_e.reshape(-1)
            val = layer_objective(task, slots)
            if better(val, best):
                best_slots, best = slots, val
    else:
        order_warm = _order_warm(task, warm)
        res = _solve_weighted(task, order_warm) if task["weighted"] else _solve_cpsat(
            task, order_warm)
        method = "mip" if task["weighted"] else "cpsat"
        if "slots" in res:
            slots = res["slots"]
            share = None
            if task["weighted"]:
                from solvers.shares import optimal_shares

                topo = Topology(task["N"], task["gpn"], S)
                sh, _ = optimal_shares(w[None], slots[None], topo)
                share = sh[0]
            val = layer_objective(task, slots, share)
            if better(val, best) and _admissible(task, slots):
                best_slots, best_share, best = slots, share, val
        if res["exact_model"] and res["cp_bound"] is not None:
            bound = max(bound, float(res["cp_bound"]))
    if not np.isfinite(best):  # nothing of the requested class found: the warm start, uncertified
        best_slots, best_share = fallback
        best = layer_objective(task, best_slots, best_share)
        bound = task["bound"]
    status = "optimal" if proven(bound, best) else "feasible"
    bound = min(bound, best)
    return {
        "slots": np.asarray(best_slots, dtype=np.int64),
        "share": best_share,
        "objective": best,
        "bound": bound,
        "gap": 0.0 if best <= 0 else max(0.0, 1 - bound / best),
        "status": status,
        "method": method,
        "seconds": time.perf_counter() - t0,
    }


def _admissible(task: dict, slots: np.ndarray) -> bool:
    """``slots`` belong to the problem class the model solves (``duplicates=False``: no two
    replicas of an expert on one GPU)."""
    if task["duplicates"]:
        return True
    e = np.sort(np.asarray(slots).reshape(-1, task["S"]), axis=1)
    return not (e[:, 1:] == e[:, :-1]).any()


def _order_warm(task: dict, slots: np.ndarray) -> np.ndarray:
    """Reorder the warm start's GPUs to satisfy the symmetry-breaking constraints."""
    if task["previous"] is not None and (task["migration_weight"]
                                         or task["migration_budget"] is not None):
        return slots
    S, gpn, w = task["S"], task["gpn"], task["w"]
    gpus = slots.reshape(-1, S)
    cands, _ = _candidates(task, slots, layer_objective(task, slots))
    scale = _scale(w, cands, float(_gpu_load_row(w, slots, S).max()))
    cnt = np.bincount(slots, minlength=w.size)
    r = np.floor(scale * w / np.maximum(cnt, 1))
    key = r[gpus].sum(1)  # the model's (rounded) loads
    if task["hierarchical"] or task["rdma_weight"]:
        blocks = gpus.reshape(-1, gpn, S)
        kb = key.reshape(-1, gpn)
        order = np.argsort(-kb, axis=1, kind="stable")
        return np.take_along_axis(blocks, order[:, :, None], 1).reshape(-1)
    return gpus[np.argsort(-key, kind="stable")].reshape(-1)


# ----------------------------------------------------------------------------- solver
def layer_task(w, topology: Topology, warm, **options) -> dict:
    """One layer's problem for `solve_layer`: ``w: float[E]`` loads, ``warm: int64[P]`` a
    valid starting placement; options as `ilp` (``bound``: a known lower bound, default 0;
    ``pairing``: use the exact ``S = 2`` method)."""
    task = {
        "w": np.asarray(w, dtype=np.float64), "G": topology.num_gpus,
        "S": topology.slots_per_gpu, "N": topology.num_nodes, "gpn": topology.gpus_per_node,
        "P": topology.num_slots, "warm": np.asarray(warm, dtype=np.int64), "warm_share": None,
        "bound": 0.0, "hierarchical": False, "num_groups": None, "weighted": False,
        "rdma_weight": 0.0, "duplicates": True, "counts": "auto", "max_vars": 40_000,
        "migration_weight": 0.0, "migration_budget": None, "previous": None,
        "time_limit": DEFAULT_TIME, "seed": 0, "threads": 1, "pairing": False,
    }
    unknown = set(options) - set(task)
    if unknown:
        raise InputError(f"unknown ilp layer options {sorted(unknown)}")
    task.update(options)
    return task


@register("ilp")
def ilp(
    load: np.ndarray,
    topology: Topology,
    *,
    num_groups: int | None = None,
    previous: Placement | None = None,
    seed: int = 0,
    time_limit: float | None = None,
    hierarchical: bool = False,
    weighted: bool = False,
    rdma_weight: NonNegFloat = 0.0,
    duplicates: bool = True,
    counts: Literal["auto", "free", "fixed"] = "auto",
    max_vars: PositiveInt = 40_000,
    migration_weight: NonNegFloat = 0.0,
    migration_budget: NonNegInt | None = None,
    workers: PositiveInt | None = None,
    threads: PositiveInt = 1,
    progress: bool | None = None,
) -> Placement:
    """Exact model per layer of ``load: float64[L, E]`` (see module docstring).

    ``time_limit``: seconds per layer (default 10). ``duplicates``: allow two replicas of an
    expert on one GPU (the exact problem; ``False`` restricts to distinct replicas).
    ``counts``: ``"auto"``, ``"free"`` (always the exact count model) or ``"fixed"`` (warm
    start's counts). ``workers``: processes (default CPU count; 1 runs inline); ``threads``:
    CP-SAT workers per layer. ``progress``: tqdm bar (default: when stderr is a terminal).
    """
    L, E = load.shape
    S, N, P = topology.slots_per_gpu, topology.num_nodes, topology.num_slots
    lam = check_rdma_weight(rdma_weight)
    if counts not in ("auto", "free", "fixed"):
        raise InputError(f"counts must be 'auto', 'free' or 'fixed', got {counts!r}")
    mig_w = float(migration_weight)
    if not math.isfinite(mig_w) or mig_w < 0:
        raise InputError(
            f"migration_weight must be >= 0 tokens per moved replica, got {migration_weight!r}")
    if migration_budget is not None and (not isinstance(migration_budget, (int, np.integer))
                                         or migration_budget < 0):
        raise InputError(f"migration_budget must be an integer >= 0, got {migration_budget!r}")
    migration = bool(mig_w or migration_budget is not None)
    if migration and previous is None:
        raise InputError("migration_weight / migration_budget need previous= (the live placement)")
    if migration and weighted:
        raise InputError(
            "migration_weight / migration_budget are not modelled with weighted=True; drop them "
            "(the result is then relabeled against previous) or drop weighted")
    workers = (os.cpu_count() or 1) if workers is None else int(workers)
    if workers < 1:
        raise InputError(f"workers must be >= 1, got {workers}")
    limit = DEFAULT_TIME if time_limit is None else float(time_limit)
    groups = None
    if hierarchical:
        from solvers.bounds import check_groups

        groups = check_groups(num_groups, E, N)
    warm_p = _warm_start(load, topology, groups, hierarchical, weighted, lam, seed)
    warm = warm_p.phy2log
    if migration:  # the model prices moves: start from the warm start closest to previous
        from solvers.migration import relabel

        warm_p = relabel(warm_p, previous)
        warm = warm_p.phy2log
    # without migration terms previous is not used here: solve() relabels the result, so
    # previous changes nothing but labels
    from solvers.bounds import lower_bound

    lb = lower_bound(load, topology, num_groups=groups, hierarchical=hierarchical,
                     weighted=weighted)
    duplicates = bool(duplicates) or E < S  # fewer experts than slots: duplicates are forced
    pairing_ok = (S == 2 and duplicates and not (hierarchical or weighted or lam or mig_w
                                                 or migration_budget is not None))
    tasks = [
        layer_task(
            load[layer], topology, warm[layer],
            warm_share=None if warm_p.replica_share is None else warm_p.replica_share[layer],
            bound=float(lb[layer]), hierarchical=hierarchical, num_groups=groups,
            weighted=weighted, rdma_weight=lam, duplicates=bool(duplicates), counts=counts,
            max_vars=int(max_vars), migration_weight=mig_w, migration_budget=migration_budget,
            previous=previous.phy2log[layer] if migration else None, time_limit=limit,
            seed=int(seed), threads=int(threads), pairing=pairing_ok,
        )
        for layer in range(L)
    ]
    results = _run(tasks, workers, progress)
    phy2log = np.stack([r["slots"] for r in results])
    share = None
    if weighted:
        share = np.stack([r["share"] if r["share"] is not None else
                          np.full(P, np.nan) for r in results])
        if np.isnan(share).any():
            from solvers.shares import optimal_shares

            share, _ = optimal_shares(load, phy2log, topology)
    obj = np.array([r["objective"] for r in results])
    bound = np.array([r["bound"] for r in results])
    gap = np.array([r["gap"] for r in results])
    info = {
        "policy": "hierarchical" if hierarchical else "global",
        "objective": obj.tolist(), "bound": bound.tolist(), "gap": gap.tolist(),
        "status": [r["status"] for r in results], "method": [r["method"] for r in results],
        "layer_seconds": [r["seconds"] for r in results],
        "objective_max": float(obj.max()), "gap_max": float(gap.max()),
        "gap_mean": float(gap.mean()),
        "optimal_layers": int(sum(r["status"] == "optimal" for r in results)),
        "warm_start": warm_p.meta.get("solver", {}).get("name", "greedy"),
    }
    if weighted:
        info["weighted"] = True
    if lam:
        info["rdma_weight"] = lam
    if migration:
        info["relabeled"] = True  # placed against previous: solve() must not relabel
    return Placement(phy2log, E, topology, share, meta={"solver": info})


def _warm_start(load, topology, groups, hierarchical, weighted, lam, seed) -> Placement:
    import solvers

    if hierarchical:
        p = solvers.get("hierarchical")(load, topology, num_groups=groups, previous=None,
                                        seed=seed, time_limit=None)
        if weighted:
            from solvers.shares import optimal_shares

            share, _ = optimal_shares(load, p.phy2log, topology)
            p = Placement(p.phy2log, p.num_experts, topology, share, p.meta)
        return p.with_meta(solver={**p.meta.get("solver", {}), "name": "hierarchical"})
    p = solvers.get("greedy")(load, topology, num_groups=None, previous=None, seed=seed,
                              time_limit=None, weighted=weighted, rdma_weight=lam)
    return p.with_meta(solver={**p.meta.get("solver", {}), "name": "greedy"})


def _run(tasks: list[dict], workers: int, progress) -> list[dict]:
    from tqdm.auto import tqdm

    disable = None if progress is None else not progress  # None: only on a terminal
    bar = dict(total=len(tasks), desc="ilp layers", unit="layer", disable=disable, leave=False)
    if workers == 1 or len(tasks) == 1:
        return [solve_layer(t) for t in tqdm(tasks, **bar)]
    with ProcessPoolExecutor(max_workers=min(workers, len(tasks))) as pool:
        return list(tqdm(pool.map(solve_layer, tasks), **bar))
