"""`compare`: paired simulations of several configs on one workload, over seeds (same arrivals,
popularity and noise banks per seed), one summary row per ``(config, seed)`` with ``d_`` /
``r_`` columns against the first config; `paired_table` averages them (docs/serving.md)."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from eplb import runners
from eplb.errors import InputError
from eplb.evaluation.serving.config import ClusterConfig
from eplb.evaluation.serving.counterfactual import counterfactual
from eplb.evaluation.serving.simulator.loop import check_args, simulate
from eplb.evaluation.serving.workload.model import Workload

__all__ = ["PAIRED", "compare", "paired_table", "run_task"]

PAIRED = (
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "tpot_p90_s",
    "tpot_p99_s",
    "input_tok_s_per_node",
    "output_tok_s_per_node",
    "goodput",
)


def run_task(task: Mapping[str, Any]) -> dict[str, Any]:
    """One simulation: ``task`` holds ``name``, ``config``, ``workload``, ``seed``,
    ``duration_s``, ``window`` (and optionally ``drain_s``); returns the summary row (with
    ``wall_s``)."""
    start = time.perf_counter()
    res = simulate(
        task["config"],
        task["workload"],
        seed=task["seed"],
        duration_s=task["duration_s"],
        drain_s=task.get("drain_s"),
        progress=False,
    )
    row = {"config": task["name"], "seed": task["seed"], **res.summary(task["window"])}
    row["wall_s"] = time.perf_counter() - start
    return row


def _named(configs) -> dict[str, ClusterConfig]:
    if isinstance(configs, ClusterConfig):
        configs = [configs]
    if isinstance(configs, Mapping):
        items = list(configs.items())
    else:
        items = []
        seen: dict[str, int] = {}
        for cfg in configs:
            name = getattr(cfg, "name", None) or "config"
            seen[name] = seen.get(name, 0) + 1
            items.append((name if seen[name] == 1 else f"{name}#{seen[name]}", cfg))
    if not items:
        raise InputError("compare needs at least one config")
    out = {}
    for name, cfg in items:
        if not isinstance(cfg, ClusterConfig):
            raise InputError(f"config {name!r} is a {type(cfg).__name__}, not a ClusterConfig")
        out[str(name)] = cfg
    return out


def compare(
    configs: Mapping[str, ClusterConfig] | Sequence[ClusterConfig],
    workload: Workload,
    seeds: Sequence[int] = (0,),
    *,
    duration_s: float | None = None,
    window: tuple[float, float] | None = None,
    workers: int = 1,
    scheduler: Any = None,
    progress: bool = True,
    mode: str = "closed_loop",
    driver: str | None = None,
    drain_s: float | None = None,
) -> pd.DataFrame:
    """Simulate every config on ``workload`` with every seed (paired: the same arrivals,
    popularity and noise banks per seed).

    ``mode="closed_loop"`` (default): every config runs its own simulation, queues free to
    diverge (what a deployment would see). ``mode="counterfactual"``: one step sequence (that
    of ``driver``, default the first config) replayed under each config's placement policy
    (the expert effect alone; `counterfactual.counterfactual`, docs/serving.md).

    ``configs``: ``{name: ClusterConfig}`` or a list (named by ``config.name``; the first is
    the baseline of the ``d_`` / ``r_`` columns). ``duration_s``, ``drain_s``: as in
    `simulate`.
    ``window``: the summary window (default the whole run). ``workers > 1``: a local process
    pool; ``scheduler``: a Dask address or ``distributed.Client`` (wins).
    """
    named = _named(configs)
    if mode not in ("closed_loop", "counterfactual"):
        raise InputError(f"mode must be 'closed_loop' or 'counterfactual', got {mode!r}")
    if not isinstance(workload, Workload):
        raise InputError(f"workload must be a Workload, got {type(workload).__name__}")
    seeds = list(seeds)
    if not seeds:
        raise InputError("compare needs at least one seed")
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0:
            raise InputError(f"seeds must be whole numbers >= 0, got {s!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise InputError(f"workers must be a positive integer, got {workers!r}")
    if mode == "counterfactual":
        return counterfactual(named, workload, seeds, duration_s=duration_s, window=window,
                              driver=driver, drain_s=drain_s,
                              workers=workers, scheduler=scheduler, progress=progress)
    if driver is not None:
        raise InputError("driver= is for mode='counterfactual' only")
    for cfg in named.values():
        check_args(cfg, workload, 0, duration_s, 1.0, drain_s)
    tasks = [
        {
            "name": name,
            "config": cfg,
            "workload": workload,
            "seed": int(seed),
            "duration_s": duration_s,
            "drain_s": drain_s,
            "window": window,
        }
        for seed in seeds
        for name, cfg in named.items()
    ]
    rows = runners.run(run_task, tasks, workers=workers, scheduler=scheduler,
                       progress=progress, desc="simulate")
    frame = pd.DataFrame(rows)
    base = next(iter(named))
    ref = frame[frame["config"] == base].set_index("seed")
    for metric in PAIRED:
        b = frame["seed"].map(ref[metric])
        frame[f"d_{metric}"] = frame[metric] - b
        with np.errstate(divide="ignore", invalid="ignore"):
            frame[f"r_{metric}"] = np.where(b != 0, frame[metric] / b - 1.0, math.nan)
    frame.attrs["baseline"] = base
    return frame


def paired_table(frame: pd.DataFrame, metrics: Sequence[str] = PAIRED) -> pd.DataFrame:
    """Per config: mean and standard deviation over seeds of each metric and of its paired
    relative difference to the baseline (``r_``), in config order."""
    order = list(dict.fromkeys(frame["config"]))
    cols = {}
    for m in metrics:
        g = frame.groupby("config", sort=False)
        cols[(m, "mean")] = g[m].mean()
        cols[(m, "std")] = g[m].std(ddof=1)
        if f"r_{m}" in frame:
            cols[(f"r_{m}", "mean")] = g[f"r_{m}"].mean()
            cols[(f"r_{m}", "std")] = g[f"r_{m}"].std(ddof=1)
    out = pd.DataFrame(cols).loc[order]
    out.columns = pd.MultiIndex.from_tuples(out.columns)
    return out
