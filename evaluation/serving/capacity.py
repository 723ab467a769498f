"""Capacity search: the largest request rate at which a goodput target holds (DistServe's
search: bracket by doubling or halving, then bisect), and the unit-mix question (which
prefill:decode unit counts within a node budget serve the most). docs/serving.md,
"Capacity"."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from eplb import runners
from eplb.errors import InputError
from eplb.evaluation.serving import metrics
from eplb.evaluation.serving.config import ClusterConfig, SLOConfig, UnitConfig
from eplb.evaluation.serving.intervals import mean_ci
from eplb.evaluation.serving.simulator.loop import check_args, simulate
from eplb.evaluation.serving.workload.model import Workload
from eplb.evaluation.serving.workload.synth import rescale
from eplb.tolerance import check_stop_tol

__all__ = ["capacity", "capacity_mix", "capacity_table", "mean_rate"]

MAX_BRACKET = 16  # doublings (or halvings) tried before giving up


def mean_rate(workload: Workload) -> float:
    """The workload's mean rate in req/s, ``(n - 1) / span`` (as `rescale` counts it)."""
    a = workload.requests["arrival_s"].to_numpy()
    span = float(a[-1] - a[0]) if len(a) > 1 else 0.0
    if span <= 0:
        raise InputError("capacity needs a workload with at least two distinct arrival times")
    return (len(a) - 1) / span


def _run(task: Mapping[str, Any]) -> float:
    wl = rescale(task["workload"], rate=task["rate"])
    res = simulate(task["config"], wl, seed=task["seed"], duration_s=task["duration_s"],
                   progress=False)
    return metrics.row(res.summary())["goodput"]


def _with_slo(config: ClusterConfig, slo) -> ClusterConfig:
    if slo is None:
        return config
    if isinstance(slo, SLOConfig):
        return config.replace(slo=slo)
    if isinstance(slo, Mapping):
        bad = sorted(set(slo) - {"ttft_s", "tpot_s"})
        if bad:
            raise InputError(f"slo takes ttft_s and tpot_s (seconds), not {', '.join(bad)}")
        return config.replace(slo=SLOConfig(**{**config.slo.__dict__, **slo}))
    raise InputError(f"slo must be an SLOConfig or {{'ttft_s': s, 'tpot_s': s}}, got {slo!r}")


def capacity(
    config: ClusterConfig,
    workload: Workload,
    *,
    slo: SLOConfig | Mapping[str, float] | None = None,
    goodput: float = 0.9,
    seeds: Sequence[int] = (0,),
    rel_tol: float = 0.05,
    start_rate: float | None = None,
    duration_s: float | None = None,
    per_seed: bool = False,
    workers: int = 1,
    scheduler: Any = None,
    progress: bool = True,
) -> dict[str, Any]:
    """The largest request rate (req/s; ``workload`` rescaled by `rescale`, order within
    sessions kept) at which the mean goodput over ``seeds`` (paired: the same seeds at every
    rate) is at least ``goodput``.

    Brackets from ``start_rate`` (default the workload's own rate) by doubling or halving,
    then bisects geometrically until ``hi / lo <= 1 + rel_tol``. ``slo``: overrides
    ``config.slo`` (an `SLOConfig` or ``{"ttft_s", "tpot_s"}`` seconds). Returns ``rate``
    (= ``interval[0]``, the largest rate tried where the target held), ``interval`` ``(lo,
    hi)`` (held at ``lo``, failed at ``hi``: the search's bracket, assuming goodput falls with
    rate), ``goodput`` / ``goodput_hi`` (mean goodput at ``lo`` / ``hi``), ``target``,
    ``seeds``, ``runs`` (every rate tried with its per-seed goodputs) and ``wall_s``.
    ``per_seed=True`` (two seeds or more) also searches each seed alone: ``seed_intervals``
    (each seed's bracket) and ``ci``: from the lower 95% Student-t bound of the seeds' ``lo``
    to the upper bound of their ``hi`` (sampling spread and search resolution together).
    """
    if isinstance(goodput, bool) or not isinstance(goodput, (int, float)) or not (
        0 < goodput <= 1
    ):
        raise InputError(f"goodput must be a fraction in (0, 1], got {goodput!r}")
    rel_tol = check_stop_tol("rel_tol", rel_tol)  # >= float noise: the bisection ends
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise InputError("capacity needs at least one seed")
    config = _with_slo(config, slo)
    check_args(config, workload, seeds[0], duration_s, 1.0)
    r0 = mean_rate(workload) if start_rate is None else float(start_rate)
    if not (r0 > 0 and math.isfinite(r0)):
        raise InputError(f"start_rate must be req/s > 0, got {start_rate!r}")
    start = time.perf_counter()
    runs: list[dict[str, Any]] = []

    def holds(rate: float) -> tuple[bool, float]:
        tasks = [{"config": config, "workload": workload, "rate": rate, "seed": s,
                  "duration_s": duration_s} for s in seeds]
        g = runners.run(_run, tasks, workers=workers, scheduler=scheduler, progress=progress,
                        desc=f"capacity {rate:.4g} req/s", unit="seed")
        mean = float(np.nanmean(g)) if not np.isnan(g).all() else 0.0
        runs.append({"rate": rate, "goodput": mean, **{f"goodput_seed{s}": v
                                                       for s, v in zip(seeds, g, strict=True)}})
        return mean >= goodput, mean

    ok, g0 = holds(r0)
    if ok:
        lo, g_lo, hi, g_hi = r0, g0, math.nan, math.nan
        for _ in range(MAX_BRACKET):
            r = lo * 2
            ok, g = holds(r)
            if not ok:
                hi, g_hi = r, g
                break
            lo, g_lo = r, g
        else:
            raise InputError(
                f"goodput {goodput} still holds at {lo:.4g} req/s ({2 ** MAX_BRACKET}x the "
                "start); the workload is too short to load the cluster (use more requests)"
            )
    else:
        hi, g_hi, lo, g_lo = r0, g0, math.nan, math.nan
        for _ in range(MAX_BRACKET):
            r = hi / 2
            ok, g = holds(r)
            if ok:
                lo, g_lo = r, g
                break
            hi, g_hi = r, g
        else:
            raise InputError(
                f"goodput {goodput} fails even at {hi:.4g} req/s; the SLO "
                f"(ttft {config.slo.ttft_s} s, tpot {config.slo.tpot_s} s) is out of reach"
            )
    while hi / lo > 1 + rel_tol:
        mid = math.sqrt(lo * hi)
        ok, g = holds(mid)
        if ok:
            lo, g_lo = mid, g
        else:
            hi, g_hi = mid, g
    extra: dict[str, Any] = {}
    if per_seed and len(seeds) > 1:
        kw = dict(slo=None, goodput=goodput, rel_tol=rel_tol, start_rate=lo,
                  duration_s=duration_s, workers=workers, scheduler=scheduler,
                  progress=progress)
        found = [capacity(config, workload, seeds=(s,), **kw)["interval"] for s in seeds]
        los, his = [f[0] for f in found], [f[1] for f in found]
        extra = {"seed_intervals": found, "ci": (mean_ci(los)[1], mean_ci(his)[2])}
    return {
        **extra,
        "rate": lo,
        "interval": (lo, hi),
        "goodput": g_lo,
        "goodput_hi": g_hi,
        "target": float(goodput),
        "seeds": seeds,
        "slo": {"ttft_s": config.slo.ttft_s, "tpot_s": config.slo.tpot_s},
        "runs": pd.DataFrame(runs),
        "wall_s": time.perf_counter() - start,
    }


def _mixes(config: ClusterConfig, nodes: int) -> list[tuple[int, int]]:
    pn, dn = config.prefill.nodes, config.decode.nodes
    out = []
    for p in range(1, nodes // pn + 1):
        left = nodes - p * pn
        d = left // dn
        if d >= 1 and left - d * dn < pn:  # maximal: no room for another unit of either kind
            out.append((p, d))
    return out


def capacity_mix(
    config: ClusterConfig,
    workload: Workload,
    *,
    nodes: int,
    **kw: Any,
) -> pd.DataFrame:
    """`capacity` of every maximal prefill:decode unit mix within ``nodes`` nodes (units of
    ``config``'s sizes; no unit of either kind fits beside it): one row per mix with
    ``prefill_units``, ``decode_units``, ``nodes_used``, ``rate``, ``lo``, ``hi``, ``goodput``
    and ``rate_per_node``, best first. ``kw`` go to `capacity`."""
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise InputError(f"nodes must be a whole number >= 1, got {nodes!r}")
    mixes = _mixes(config, nodes)
    if not mixes:
        raise InputError(
            f"{nodes} nodes cannot hold one prefill unit ({config.prefill.nodes} nodes) and "
            f"one decode unit ({config.decode.nodes} nodes)"
        )
    rows = []
    for p, d in mixes:
        cfg = config.replace(
            prefill=UnitConfig(**{**config.prefill.__dict__, "count": p}),
            decode=UnitConfig(**{**config.decode.__dict__, "count": d}),
        )
        res = capacity(cfg, workload, **kw)
        used = p * config.prefill.nodes + d * config.decode.nodes
        rows.append({"prefill_units": p, "decode_units": d, "nodes_used": used,
                     "rate": res["rate"], "lo": res["interval"][0], "hi": res["interval"][1],
                     "goodput": res["goodput"], "rate_per_node": res["rate"] / used})
    return pd.DataFrame(rows).sort_values("rate", ascending=False, ignore_index=True)


def capacity_table(
    configs: Mapping[str, ClusterConfig], workload: Workload, **kw: Any
) -> pd.DataFrame:
    """`capacity` of each config (``kw`` go to it): one row per config with ``rate``, ``lo``,
    ``hi`` (req/s: the target holds at ``lo``, fails at ``hi``), ``goodput`` and
    ``goodput_hi`` at them, ``target`` and ``runs`` (rates simulated)."""
    rows = []
    for name, cfg in configs.items():
        res = capacity(cfg, workload, **kw)
        lo, hi = res["interval"]
        rows.append({"config": name, "rate": res["rate"], "lo": lo, "hi": hi,
                     "goodput": res["goodput"], "goodput_hi": res["goodput_hi"],
                     "target": res["target"], "runs": len(res["runs"])})
    return pd.DataFrame(rows)
