"""``ilp`` and ``ilp_weighted``: exact placement per layer, warm-started, with a proven bound.

``ilp`` solves the even-split problem exactly per layer with OR-Tools CP-SAT (and the exact
pairing method for two slots per GPU); ``ilp_weighted`` also chooses ``replica_share`` (a MIP
through SCIP). Models, soundness and what "optimal" means: `solvers.ilp_model`.

Every layer starts from a greedy placement (``greedy``, ``hierarchical``,
``greedy_traffic`` or ``greedy_weighted`` as the options ask) and the result is never worse
than it. Layers with the start already meeting the analytic lower bound
(`solvers.bounds.lower_bound`) are done at once; the others are searched.

Time: ``time_limit`` is **wall seconds for the whole solve** (warm start, bounds and every
layer's search), shared among the layers still to search and the worker processes as they
go; layers whose search the wall limit cut are counted in ``meta["solver"]["wall_limited"]``
(their result depends on machine speed). For reproducible runs give ``deterministic_time``
(CP-SAT deterministic seconds per layer; ``ilp`` only): without ``time_limit`` the result
then does not depend on machine speed or load. With neither, each layer gets
``deterministic_time=10`` (``ilp``) or 10 wall seconds (``ilp_weighted``, SCIP has no
deterministic clock).

Layers run in ``workers`` processes (default: the CPU count; 1 runs inline), which die with
the parent and are stopped at once on Ctrl-C or any error (`eplb.runners`). Progress: a
bar on a terminal, a line per 10 layers on stderr otherwise (``progress=False``: none).

``meta["solver"]``: per layer ``objective``, ``bound``, ``gap`` (``1 - bound / objective``),
``status`` (``optimal`` only when proven), ``method``; aggregates ``objective_max``,
``bound_min``, ``gap_max``, ``gap_mean``, ``optimal_layers``, ``wall_limited``, ``seconds``
of the search.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np

from eplb import runners as pool
from eplb.errors import InputError
from eplb.placement import Placement
from eplb.progress import Progress
from eplb.solvers.bounds import lower_bound
from eplb.solvers.even_split import place_even
from eplb.solvers.greedy_weighted import greedy_weighted
from eplb.solvers.hierarchical import hierarchical as hierarchical_policy
from eplb.solvers.ilp_model import (
    DEFAULT_DETERMINISTIC,
    LayerProblem,
    LayerResult,
    admissible,
    objective,
    solve_layer,
)
from eplb.solvers.migration import relabel
from eplb.solvers.registry import register
from eplb.solvers.shares import optimal_shares
from eplb.solvers.traffic_packing import pack_traffic
from eplb.solvers.validation import (
    NonNegFloat,
    NonNegInt,
    PositiveFloat,
    PositiveInt,
    Range,
    check_groups,
    check_seed,
)
from eplb.tolerance import better
from eplb.topology import Topology

CPSAT_MAX_SEED = 2**31 - 1  # CP-SAT's random_seed is a 32-bit integer
# threads per layer: CP-SAT's num_workers and SCIP's thread count are 32-bit integers
Threads = Annotated[int, Range(1, 2**31 - 1)]


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
    rdma_weight: NonNegFloat = 0.0,
    duplicates: bool = True,
    counts: Literal["auto", "free", "fixed"] = "auto",
    max_vars: PositiveInt = 40_000,
    migration_weight: NonNegFloat = 0.0,
    migration_budget: NonNegInt | None = None,
    deterministic_time: PositiveFloat | None = None,
    workers: PositiveInt | None = None,
    threads: Threads = 1,
    progress: bool | None = None,
) -> Placement:
    """Exact even-split model per layer of ``load: float64[L, E]`` (module docstring).

    ``time_limit``: wall seconds for the whole solve. ``deterministic_time``: CP-SAT
    deterministic seconds per layer (reproducible; default 10 without ``time_limit``).
    ``hierarchical``: keep every group of ``num_groups`` on one node. ``rdma_weight``: add
    the traffic term (`traffic_cost`). ``duplicates``: allow two replicas of an expert on a
    GPU (the exact problem; ``False`` restricts to distinct replicas). ``counts``: ``"auto"``,
    ``"free"`` (always the full count model) or ``"fixed"`` (the start's counts).
    ``migration_weight`` (tokens per moved replica) / ``migration_budget`` (moved replicas
    per layer): price or cap moves against ``previous`` (then the result is placed against
    it, not relabeled). ``workers``: processes; ``threads``: CP-SAT workers per layer.
    """
    start = time.time()
    L, E = load.shape
    S, N = topology.slots_per_gpu, topology.num_nodes
    seed = check_seed(seed, hi=CPSAT_MAX_SEED)
    migration = bool(migration_weight or migration_budget is not None)
    if migration and previous is None:
        raise InputError("migration_weight / migration_budget need previous= (the live placement)")
    groups = check_groups(num_groups, E, N) if hierarchical else None
    det = deterministic_time
    if det is None and time_limit is None:
        det = DEFAULT_DETERMINISTIC
    warm, warm_name = _warm_start(load, topology, groups, rdma_weight, weighted=False)
    if migration:  # the model prices moves: start from the warm start closest to previous
        warm = relabel(warm, previous)
    # without migration terms previous is not used here: solve() relabels the result, so
    # previous changes nothing but labels
    duplicates = bool(duplicates) or E < S  # fewer experts than slots: duplicates are forced
    pairing_ok = S == 2 and duplicates and not (hierarchical or rdma_weight or migration)
    # the pairing method certifies with its own LP; the analytic bound needs no LP then
    lb = lower_bound(
        load,
        topology,
        num_groups=groups,
        hierarchical=hierarchical,
        lp=False if pairing_ok else "auto",
    )
    problems = [
        LayerProblem(
            load[layer],
            topology,
            warm.phy2log[layer],
            bound=float(lb[layer]),
            hierarchical=hierarchical,
            num_groups=groups,
            rdma_weight=rdma_weight,
            duplicates=duplicates,
            counts=counts,
            max_vars=max_vars,
            migration_weight=migration_weight,
            migration_budget=migration_budget,
            previous=previous.phy2log[layer] if migration else None,
            pairing=pairing_ok,
            deterministic_time=det,
            seed=seed,
            threads=threads,
        )
        for layer in range(L)
    ]
    results = _solve_layers(
        problems, start=start, time_limit=time_limit, workers=workers, progress=progress, desc="ilp"
    )
    info = _summary(results, hierarchical, warm_name, time_limit, det)
    if rdma_weight:
        info["rdma_weight"] = rdma_weight
    if migration:
        info["relabeled"] = True  # placed against previous: solve() must not relabel
    phy2log = np.stack([r.slots for r in results])
    return Placement(phy2log, E, topology, meta={"solver": info})


@register("ilp_weighted")
def ilp_weighted(
    load: np.ndarray,
    topology: Topology,
    *,
    num_groups: int | None = None,
    seed: int = 0,
    time_limit: float | None = None,
    hierarchical: bool = False,
    rdma_weight: NonNegFloat = 0.0,
    workers: PositiveInt | None = None,
    threads: Threads = 1,
    progress: bool | None = None,
) -> Placement:
    """Exact weighted model (slots and ``replica_share``) per layer of ``load: float64[L,
    E]`` (module docstring). ``time_limit``: wall seconds for the whole solve (default: 10
    wall seconds per layer). ``hierarchical``, ``rdma_weight``, ``workers``, ``threads`` as
    for ``ilp``. ``previous=`` is applied by `solvers.solve` (relabeling)."""
    start = time.time()
    L, E = load.shape
    seed = check_seed(seed, hi=CPSAT_MAX_SEED)
    groups = check_groups(num_groups, E, topology.num_nodes) if hierarchical else None
    det = DEFAULT_DETERMINISTIC if time_limit is None else None
    warm, warm_name = _warm_start(load, topology, groups, rdma_weight, weighted=True)
    lb = lower_bound(load, topology, num_groups=groups, hierarchical=hierarchical, weighted=True)
    problems = [
        LayerProblem(
            load[layer],
            topology,
            warm.phy2log[layer],
            warm_share=warm.replica_share[layer],
            bound=float(lb[layer]),
            hierarchical=hierarchical,
            num_groups=groups,
            weighted=True,
            rdma_weight=rdma_weight,
            deterministic_time=det,
            seed=seed,
            threads=threads,
        )
        for layer in range(L)
    ]
    results = _solve_layers(
        problems,
        start=start,
        time_limit=time_limit,
        workers=workers,
        progress=progress,
        desc="ilp_weighted",
    )
    phy2log = np.stack([r.slots for r in results])
    share = np.stack(
        [r.share if r.share is not None else np.full(topology.num_slots, np.nan) for r in results]
    )
    if np.isnan(share).any():
        share, _ = optimal_shares(load, phy2log, topology)
    info = _summary(results, hierarchical, warm_name, time_limit, None)
    info["weighted"] = True
    if rdma_weight:
        info["rdma_weight"] = rdma_weight
    return Placement(phy2log, E, topology, share, meta={"solver": info})


# ----------------------------------------------------------------------------- helpers
def _warm_start(load, topology, groups, rdma_weight, *, weighted) -> tuple[Placement, str]:
    """The start of every layer: hierarchical (with optimal shares when weighted), else the
    even, traffic-aware or weighted greedy."""
    E = load.shape[1]
    if groups is not None:
        p = hierarchical_policy(load, topology, num_groups=groups)
        if weighted:
            share, _ = optimal_shares(load, p.phy2log, topology)
            p = Placement(p.phy2log, E, topology, share, p.meta)
        return p, "hierarchical"
    if weighted:
        return greedy_weighted(load, topology, rdma_weight=rdma_weight), "greedy"
    if rdma_weight:
        packed, _ = pack_traffic(load, topology, rdma_weight)
        return Placement(packed.phy2log(), E, topology), "greedy"
    phy2log, _ = place_even(load, topology)
    return Placement(phy2log, E, topology), "greedy"


@dataclass(frozen=True)
class _Schedule:
    """Wall budget of the layers, shared by the workers (``started``: a shared counter)."""

    deadline: float | None  # time.time() at which the whole solve must end
    total: int
    workers: int
    started: Any

    def next_budget(self) -> float | None:
        """Wall seconds for the layer starting now: the time left, spread over the layers
        still to start and the workers running them."""
        if self.deadline is None:
            return None
        with self.started.get_lock():
            self.started.value += 1
            remaining = self.total - self.started.value + 1
        left = self.deadline - time.time()
        return max(0.0, left * min(1.0, self.workers / max(remaining, 1)))


def _layer_job(pb: LayerProblem) -> LayerResult:
    return solve_layer(pb, pool.context().next_budget())


def _solve_layers(
    problems: list[LayerProblem],
    *,
    start: float,
    time_limit: float | None,
    workers: int | None,
    progress: bool | None,
    desc: str,
) -> list[LayerResult]:
    """Run `solve_layer` on every problem within the wall limit (module docstring)."""
    todo = [i for i, pb in enumerate(problems) if _needs_search(pb)]
    results: list[Any] = [None] * len(problems)
    for i in set(range(len(problems))) - set(todo):
        results[i] = solve_layer(problems[i])  # the start meets the bound: no search
    W = (os.cpu_count() or 1) if workers is None else int(workers)
    W = max(1, min(W, len(todo)))
    deadline = None if time_limit is None else start + time_limit
    sched = _Schedule(deadline, len(todo), W, pool.shared_value("i", 0))
    optimal = sum(r.status == "optimal" for r in results if r is not None)
    ready = len(problems) - len(todo)  # reported with the first searched layer
    with Progress(len(problems), f"{desc} layers", progress) as bar:

        def done(_i: int, r: LayerResult) -> None:
            nonlocal optimal, ready
            optimal += r.status == "optimal"
            bar.update(1 + ready, f"{optimal} optimal")
            ready = 0

        found = pool.run(
            _layer_job, [problems[i] for i in todo], workers=W, context=sched, on_result=done
        )
        if ready:
            bar.update(ready, f"{optimal} optimal")
    for i, r in zip(todo, found, strict=True):
        results[i] = r
    return results


def _needs_search(pb: LayerProblem) -> bool:
    """The start does not meet the layer's bound (or moves are priced): a search is due."""
    if pb.migration or not admissible(pb, pb.warm):
        return True
    return better(pb.bound, objective(pb, pb.warm, pb.warm_share))


def _summary(
    results: list[LayerResult],
    hierarchical: bool,
    warm_name: str,
    time_limit: float | None,
    deterministic_time: float | None,
) -> dict:
    obj = np.array([r.objective for r in results])
    bound = np.array([r.bound for r in results])
    gap = np.array([r.gap for r in results])
    return {
        "policy": "hierarchical" if hierarchical else "global",
        "objective": obj.tolist(),
        "bound": bound.tolist(),
        "gap": gap.tolist(),
        "status": [r.status for r in results],
        "method": [r.method for r in results],
        "layer_seconds": [r.seconds for r in results],
        "objective_max": float(obj.max()),
        "bound_min": float(bound.min()),
        "gap_max": float(gap.max()),
        "gap_mean": float(gap.mean()),
        "optimal_layers": int(sum(r.status == "optimal" for r in results)),
        "wall_limited": int(sum(r.stopped == "wall" for r in results)),
        "time_limit": time_limit,
        "deterministic_time": deterministic_time,
        "warm_start": warm_name,
    }
