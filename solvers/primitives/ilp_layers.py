"""Running the exact model over layers: the layers whose start already meets the bound are done
at once, the others are searched in worker processes (`eplb.runners`) that share the wall
limit as they go; progress; the summary in ``meta["solver"]``. docs/solvers.md, "ilp".
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from eplb import runners as pool
from eplb.progress import Progress
from eplb.solvers.primitives.ilp_model import (
    LayerProblem,
    LayerResult,
    admissible,
    objective,
    solve_layer,
)
from eplb.tolerance import better


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


class _Counter:
    """The layers started, in one process (`pool.shared_value`'s interface)."""

    value = 0

    def get_lock(self) -> contextlib.nullcontext:
        return contextlib.nullcontext()


def _layer_job(pb: LayerProblem) -> LayerResult:
    sched = pool.context()
    return solve_layer(pb, sched.next_budget(), sched.deadline)


_IMPORT: list[threading.Thread] = []  # the import of OR-Tools in flight (at most one)


def _import_solvers(deadline: float | None) -> bool:
    """Import OR-Tools (seconds on a busy machine, more than a short limit) before the
    layers start, waiting at most until ``deadline``: whether it is ready. A late import
    finishes in a daemon thread (a later solve waits for that one)."""

    def load() -> None:
        import ortools.linear_solver.pywraplp
        import ortools.sat.python.cp_model  # noqa: F401

    if not _IMPORT:
        if "ortools.sat.python.cp_model" in sys.modules and (
            "ortools.linear_solver.pywraplp" in sys.modules
        ):
            return True
        if deadline is None:
            load()
            return True
        _IMPORT.append(threading.Thread(target=load, name="eplb-ortools-import", daemon=True))
        _IMPORT[0].start()
    t = _IMPORT[0]
    t.join(None if deadline is None else max(0.0, deadline - time.time()))
    if t.is_alive():
        return False
    _IMPORT.clear()
    return True


def solve_layers(
    problems: list[LayerProblem],
    *,
    start: float,
    time_limit: float | None,
    workers: int | None,
    progress: bool | None,
    desc: str,
) -> list[LayerResult]:
    """`solve_layer` on every problem within the wall limit: layers whose start meets the
    bound inline, the others in ``workers`` processes sharing the time left (module
    docstring)."""
    todo = [i for i, pb in enumerate(problems) if _needs_search(pb)]
    results: list[Any] = [None] * len(problems)
    for i in set(range(len(problems))) - set(todo):
        results[i] = solve_layer(problems[i])  # the start meets the bound: no search
    W = (os.cpu_count() or 1) if workers is None else int(workers)
    W = max(1, min(W, len(todo)))
    deadline = None if time_limit is None else start + time_limit
    if todo and not _import_solvers(deadline):  # the limit passed while importing
        for i in todo:
            results[i] = solve_layer(problems[i], 0.0)  # the start, uncertified
        todo = []
    # a process-shared counter only for worker processes (it starts multiprocessing's
    # resource tracker, a subprocess: a tenth of a second of a short limit)
    counter = pool.shared_value("i", 0) if W > 1 else _Counter()
    sched = _Schedule(deadline, len(todo), W, counter)
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


def summary(
    results: list[LayerResult],
    hierarchical: bool,
    warm_name: str,
    time_limit: float | None,
    deterministic_time: float | None,
) -> dict:
    """``meta["solver"]`` of an exact solve: per layer and aggregated (docs/solvers.md)."""
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
        "refuted_bounds": int(sum(r.refuted for r in results)),
        "time_limit": time_limit,
        "deterministic_time": deterministic_time,
        "warm_start": warm_name,
    }
