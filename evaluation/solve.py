"""A trace solved and scored as ``eplb solve`` does: `solve_trace` places the chosen windows' load
(or hands a windowed policy the windows themselves), records where the load came from and the
placement's balance in its metadata, and scores it against the closed-form lower bound.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from eplb import solvers
from eplb.errors import InputError
from eplb.evaluation.align import align, check_placement, check_trace
from eplb.evaluation.balance import balance_summary, closed_bound, group_layer_bound
from eplb.placement import Placement
from eplb.topology import Topology
from eplb.traces.model import Trace
from eplb.traces.windows import parse_windows


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file, or of every file under a directory (sorted by path, names included)."""
    path = Path(path)
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        h.update(str(f.relative_to(path)).encode() if path.is_dir() else b"")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


@dataclass(frozen=True, eq=False)
class SolveResult:
    """What `solve_trace` returns.

    - ``placement``: carries the trace's model ``layer_ids`` and, in ``meta``, ``source`` (where
      the load came from) and ``metrics`` (balance on ``load``).
    - ``load: float64[L, E]``: the load placed and scored (sum or EMA over ``windows``).
    - ``windows: int64[T']``: the window positions used, of ``num_windows``.
    - ``forecast``: the policy placed for the next window from the windows themselves
      (`solvers.takes_windows`); the figures still score their sum.
    - ``balance``: `metrics.summarize`'s figures (`balance.balance_summary`, no pandas) against
      `balance.BOUND_NAME` (and the group bound where the group-to-node contract can hold).
    """

    placement: Placement
    load: np.ndarray
    windows: np.ndarray
    num_windows: int
    ema: float | None
    forecast: bool
    balance: dict[str, float]


def solve_trace(
    solver: str,
    trace: Trace,
    topology: Topology,
    *,
    windows: Any = None,
    ema: float | None = None,
    num_groups: int | None = None,
    seed: int = 0,
    time_limit: float | None = None,
    path: str | os.PathLike | None = None,
    previous: Placement | None = None,
    **options: Any,
) -> SolveResult:
    """Place ``trace``'s load on ``topology`` with ``solver`` (`solvers.solve`) and score it.

    ``windows``: a `Trace.window_index` selection or its text (``"0:4"``, `traces.windows`);
    ``ema``: exponential average over them instead of the sum (refused for a policy that takes
    windows: it weights them itself). ``path``: the trace's file, recorded with its SHA-256 in
    ``meta["source"]`` (with the windows as given, ``ema`` and the trace's
    ``num_model_layers``). ``previous``: the live placement (its rows matched to the trace's
    layers by layer id, `align`): a policy that takes it (`solvers.takes_previous`) places for
    few moves from it; any other's result is relabeled to keep as many replicas in place.
    ``num_groups`` (default: the trace's ``meta["num_groups"]``, the groups its dump or
    model records), ``seed``, ``time_limit``, ``options``: the solver's.
    """
    check_trace(trace)
    if num_groups is None:
        num_groups = trace.meta.get("num_groups")
    if previous is not None:
        check_placement(previous, "previous")
        previous = align(previous, trace)  # any solver: relabeled to it (`solvers.solve`)
    elif solvers.needs_previous(solver):
        raise InputError(f"solver {solver} repairs a live placement: give the previous "
                         "placement (CLI: --previous PLACEMENT)")
    label = windows
    if isinstance(windows, str):
        windows = parse_windows(windows)
    chosen = trace.window_index(windows)
    load = trace.load(windows, ema=ema)
    forecast = solvers.takes_windows(solver)
    solver_load = load
    if forecast:  # a windowed policy gets the windows themselves
        if ema:
            raise InputError(f"solver {solver} weights the windows itself; drop ema")
        solver_load = trace.counts[np.sort(chosen)]
    placement = solvers.solve(solver, solver_load, topology, num_groups=num_groups, seed=seed,
                              time_limit=time_limit, previous=previous, **options)
    if label is not None and not isinstance(label, str):
        label = [int(i) for i in chosen]
    source = {"path": str(path), "sha256": file_sha256(path)} if path is not None else {}
    source.update(num_model_layers=trace.meta.get("num_model_layers"), windows=label, ema=ema)
    placement = Placement(placement.phy2log, placement.num_experts, topology,
                          placement.replica_share, {**placement.meta, "source": source},
                          trace.layer_ids)
    gpu = placement.gpu_load(load)
    # the one bound of every table (balance.BOUND_NAME); groups that do not divide the
    # experts (a policy that fell back to its global variant) have no group bound
    groups = num_groups if num_groups is not None and load.shape[1] % num_groups == 0 else None
    balance = balance_summary(gpu, placement.topology, closed_bound(load, topology, groups),
                              group_layer_bound(load, topology, groups))
    placement = placement.with_meta(metrics={k: balance[k] for k in (
        "balancedness_mean", "balancedness_min", "max_over_mean_mean", "max_over_mean_worst")})
    return SolveResult(placement, load, chosen, trace.num_windows, ema, forecast, balance)
