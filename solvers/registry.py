"""Registry of placement policies and the one entry point, `solve`.

A solver is a function ``fn(load, topology, *, num_groups, previous, seed, time_limit,
**options) -> Placement``; `solve` checks the input, times the call, validates the output and
records ``meta["solver"] = {"name", "params", "seconds", ...}`` (a solver may pre-fill
more keys such as ``objective``, ``bound``, ``gap`` or ``policy`` in ``meta["solver"]``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from eplb.errors import InfeasibleError, InputError
from eplb.loads import check_load
from eplb.placement import Placement
from eplb.topology import Topology
from solvers.failures import expand, solve_surviving

SolverFn = Callable[..., Placement]
_REGISTRY: dict[str, SolverFn] = {}


def register(name: str) -> Callable[[SolverFn], SolverFn]:
    """Decorator adding a solver to the registry under ``name``."""

    def deco(fn: SolverFn) -> SolverFn:
        if name in _REGISTRY and _REGISTRY[name] is not fn:
            raise ValueError(f"solver {name!r} is already registered")
        _REGISTRY[name] = fn
        return fn

    return deco


def available() -> list[str]:
    """Names of the registered solvers, sorted."""
    return sorted(_REGISTRY)


def get(name: str) -> SolverFn:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise InputError(f"unknown solver {name!r}; available: {', '.join(available())}") from None


def check_problem(load, topology: Topology, num_groups: int | None = None) -> np.ndarray:
    """Validate a solver's inputs; return ``load: float64[L, E]`` (read-only)."""
    load = check_load(load)
    if not isinstance(topology, Topology):
        raise InputError(f"topology must be a Topology, got {type(topology).__name__}")
    E, P = load.shape[1], topology.num_slots
    if P < E:
        raise InfeasibleError(
            f"{P} slots cannot hold {E} experts; every expert needs a slot, use >= "
            f"{-(-E // topology.num_gpus) * topology.num_gpus} slots"
        )
    if num_groups is not None:
        if isinstance(num_groups, bool) or not isinstance(num_groups, (int, np.integer)):
            raise InputError(f"num_groups must be an integer, got {num_groups!r}")
        if num_groups < 1:
            raise InputError(f"num_groups must be >= 1, got {num_groups}")
    return load


def solve(
    name: str,
    load,
    topology: Topology,
    *,
    num_groups: int | None = None,
    previous: Placement | None = None,
    seed: int = 0,
    time_limit: float | None = None,
    **options: Any,
) -> Placement:
    """Place ``load: float[L, E]`` on ``topology`` with solver ``name``; a validated `Placement`.

    ``num_groups``: expert groups for group-limited routing (hierarchical policies).
    ``previous``: the live placement; the result's GPUs, nodes and slots are relabeled
    (`solvers.migration.relabel`, loads unchanged) to keep its replicas where they were
    (unless the solver sets ``meta["solver"]["relabeled"]``: it placed against ``previous``
    itself, e.g. greedy's incremental repair), and
    ``meta["solver"]["replicas_moved"]`` (per layer) / ``replicas_moved_total`` count the rest.
    ``seed``: every random choice is drawn from it. ``time_limit``: seconds, for search solvers.
    ``topology.failed_gpus``: the policy places on the surviving GPUs and their slots stay
    empty (-1); ``replicas_moved`` then counts moves onto surviving GPUs (`solvers.failures`).
    """
    fn = get(name)
    load = check_problem(load, topology, num_groups)
    if previous is not None:
        if not isinstance(previous, Placement):
            raise InputError(f"previous must be a Placement, got {type(previous).__name__}")
        if previous.phy2log.shape != (load.shape[0], topology.num_slots) or (
            previous.num_experts != load.shape[1]
        ):
            raise InputError(
                f"previous placement is [{previous.num_layers} layers, {previous.num_experts} "
                f"experts, {previous.num_slots} slots] but the problem is [{load.shape[0]} layers, "
                f"{load.shape[1]} experts, {topology.num_slots} slots]"
            )
    if time_limit is not None and not (time_limit > 0):
        raise InputError(f"time_limit must be > 0 seconds, got {time_limit!r}")
    start = time.perf_counter()
    kw = dict(num_groups=num_groups, seed=seed, time_limit=time_limit, **options)
    if topology.failed_gpus:  # place on the survivors, expand below (solvers.failures)
        placement, previous, slots = solve_surviving(fn, load, topology, previous=previous, **kw)
    else:
        placement = fn(load, topology, previous=previous, **kw)
    seconds = time.perf_counter() - start
    placement.validate()
    info = dict(placement.meta.get("solver") or {})
    if previous is not None:  # relabeling is part of the solve: timed with it
        from solvers.migration import relabel, replicas_moved

        if not info.get("relabeled"):  # a solver that placed against previous itself is kept
            start = time.perf_counter()
            placement = relabel(placement, previous)
            seconds += time.perf_counter() - start
            placement.validate()
        moved = replicas_moved(previous, placement)
        info.update(replicas_moved=moved.tolist(), replicas_moved_total=int(moved.sum()))
    if topology.failed_gpus:
        placement = expand(placement, topology, slots).validate()
    info.update(
        name=name,
        params={"num_groups": num_groups, "seed": seed, "time_limit": time_limit, **options},
        seconds=seconds,
    )
    return placement.with_meta(solver=info)
