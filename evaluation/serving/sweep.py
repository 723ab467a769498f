"""Sweeps and comparison tables: `rate_sweep` (every config at every offered rate and seed of a
`SweepSpec`, as ``bench_serving --request-rate`` sweeps: latency percentiles, goodput and
served fraction against offered rate), `sweep_table`, `plot_rate_sweep`, and
`comparison_text` (a compared frame as mean, 95% interval and paired difference per metric).
docs/serving.md, "Sweeps"."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from eplb import runners
from eplb.atomic import atomic_write
from eplb.errors import InputError
from eplb.evaluation.serving import metrics
from eplb.evaluation.serving.compare import _named, run_task
from eplb.evaluation.serving.config import ClusterConfig
from eplb.evaluation.serving.counterfactual import OPERATING, REQUEST_METRICS
from eplb.evaluation.serving.intervals import ci_table, fraction_ci, mean_ci
from eplb.evaluation.serving.results.result import SUMMARY_UNITS
from eplb.evaluation.serving.simulator.loop import check_args
from eplb.evaluation.serving.workload.model import Workload
from eplb.evaluation.serving.workload.synth import rescale
from eplb.format import data_size, text_table

__all__ = [
    "SweepSpec",
    "comparison_text",
    "compared_columns",
    "frame_text",
    "plot_rate_sweep",
    "rate_sweep",
    "sweep_table",
]

# the per-phase columns of a counterfactual comparison that its table shows
COUNTERFACTUAL = tuple(
    f"{ph}_{k}"
    for ph in ("prefill", "decode")
    for k in ("step_s", "ep_wait_s", "comm_exposed_s", "moe_s", "stall_s", "busy_s")
) + REQUEST_METRICS + OPERATING  # what a user sees (re-timed), and where the driver ran

TINY_S = 1e-12  # seconds a comparison table prints as 0 (float rounding, not a time)
UNITS = {**SUMMARY_UNITS, "served_fraction": "fraction", "offered_rate": "req/s",
         # capacity_table's columns: the rate found, its interval, goodputs at lo and hi
         "rate": "req/s", "lo": "req/s", "hi": "req/s", "goodput_hi": "fraction",
         "target": "fraction", "runs": "simulations", "overloaded": "yes/no",
         "prefill_tokens_per_rank": "tokens", "decode_requests_per_rank": "requests",
         "decode_kv_fill": "fraction"}


def _rates(rates: Sequence[float]) -> list[float]:
    if isinstance(rates, (str, bytes)) or not isinstance(rates, Sequence | np.ndarray):
        raise InputError(f"rates must be a list of req/s, got {rates!r}")
    out = []
    for r in rates:
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not (
            r > 0 and math.isfinite(r)
        ):
            raise InputError(f"rates must be req/s > 0, got {r!r}")
        out.append(float(r))
    if not out:
        raise InputError("a rate sweep needs at least one rate")
    return out


@dataclass(frozen=True)
class SweepSpec:
    """What a rate sweep runs, checked once when built.

    - ``rates: tuple[float, ...]``: offered rates, req/s (> 0, finite); the workload is
      rescaled to each (order within sessions kept);
    - ``seeds: tuple[int, ...]``: every config runs every rate with every seed (paired);
    - ``duration_s``: seconds requests arrive per run, as in `simulate` (None: the whole
      workload); each run then drains what was admitted for at most ``drain_s`` seconds (as
      in `simulate`);
    - ``window: (t0, t1)``: simulated seconds the summary covers (None: the window in which
      requests arrive at that rate, so throughput is never averaged over a drained tail).
    """

    rates: tuple[float, ...]
    seeds: tuple[int, ...] = (0,)
    duration_s: float | None = None
    window: tuple[float, float] | None = None
    drain_s: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "rates", tuple(_rates(self.rates)))
        try:
            seeds = tuple(int(s) for s in self.seeds)
        except (TypeError, ValueError):
            raise InputError(f"seeds must be integers, got {self.seeds!r}") from None
        if not seeds:
            raise InputError("a rate sweep needs at least one seed")
        object.__setattr__(self, "seeds", seeds)

    def tasks(self, named: Mapping[str, ClusterConfig],
              workload: Workload) -> tuple[list[dict], list[tuple[str, float, int]]]:
        """One `compare.run_task` task per (config, rate, seed), and those keys."""
        for cfg in named.values():
            check_args(cfg, workload, 0, self.duration_s, 1.0, self.drain_s)
        scaled = {r: rescale(workload, rate=r) for r in self.rates}
        tasks, keys = [], []
        for name, cfg in named.items():
            for r in self.rates:
                for s in self.seeds:
                    tasks.append({"name": name, "config": cfg, "workload": scaled[r], "seed": s,
                                  "duration_s": self.duration_s, "drain_s": self.drain_s,
                                  "window": self.window})
                    keys.append((name, r, s))
        return tasks, keys


def rate_sweep(
    configs: Mapping[str, ClusterConfig] | Sequence[ClusterConfig],
    workload: Workload,
    rates: Sequence[float] | SweepSpec,
    seeds: Sequence[int] = (0,),
    *,
    duration_s: float | None = None,
    window: tuple[float, float] | None = None,
    workers: int = 1,
    scheduler: Any = None,
    progress: bool = True,
) -> pd.DataFrame:
    """Simulate every config with ``workload`` at every offered rate and seed of a
    `SweepSpec` (``rates``), or of the spec ``rates, seeds, duration_s, window`` build: one
    row per ``(config, offered_rate, seed)`` with the comparison metrics (`metrics.SOURCE`)
    and ``wall_s``. Runs on `eplb.runners` (``workers`` processes or a Dask ``scheduler``),
    with a progress bar."""
    named = _named(configs)
    if isinstance(rates, SweepSpec):
        if (tuple(seeds), duration_s, window) != ((0,), None, None):
            raise InputError("rate_sweep takes a SweepSpec or rates, seeds, duration_s and "
                             "window, not both")
        spec = rates
    else:
        spec = SweepSpec(rates, seeds, duration_s, window)
    tasks, keys = spec.tasks(named, workload)
    out = runners.run(run_task, tasks, workers=workers, scheduler=scheduler,
                      progress=progress, desc="rate sweep", unit="run")
    rows = [{"config": n, "offered_rate": r, "seed": s, **metrics.row(res),
             "wall_s": res["wall_s"]} for (n, r, s), res in zip(keys, out, strict=True)]
    frame = pd.DataFrame(rows)
    frame.attrs["baseline"] = next(iter(named))
    return frame


def sweep_table(frame: pd.DataFrame, columns: Sequence[str] = metrics.SWEEP) -> str:
    """The sweep as text: per config and offered rate, the mean over seeds of ``columns``
    (units in the header). With two or more seeds each cell is ``mean ± h``, ``h`` the half
    width of the 95% Student-t interval of the mean (`intervals.mean_ci`, the comparison
    table's interval; ``-`` where fewer than two seeds have a value), and a fraction of
    requests (`metrics.FRACTIONS`) is ``p [lo, hi]``, Wilson's interval within [0, 1]
    (`intervals.proportion_ci`), said in a heading line; one seed prints the values alone.
    ``overloaded`` prints ``yes (tier)`` / ``no``, or with several seeds how many were."""
    cols = list(columns)
    seeds = frame["seed"].nunique() if "seed" in frame else 1
    header = ["config", "offered (req/s)", *(f"{c} ({UNITS.get(c, '')})" for c in cols)]
    rows = []
    for (name, rate), part in frame.groupby(["config", "offered_rate"], sort=False):
        cells = []
        for c in cols:
            count = metrics.FRACTIONS.get(c)
            if c == "overloaded":
                cells.append(_overloaded(part))
            elif seeds < 2:
                cells.append(_fmt(mean_ci(part[c])[0]))
            elif count is not None:
                p, lo, hi = fraction_ci(part[c], part[count] if count in part else None)
                cells.append(f"{_fmt(p)} [{_fmt(lo)}, {_fmt(hi)}]")
            else:
                mean, lo, hi = mean_ci(part[c])
                cells.append(f"{_fmt(mean)} ± {_fmt((hi - lo) / 2)}")
        rows.append((name, f"{rate:.4g}", *cells))
    text = text_table(rows, header=header)
    if seeds < 2:
        return text
    return (f"mean ± h over {seeds} seeds: h is the half width of the 95% confidence interval "
            "of the mean (Student t over the seeds; the comparison table's interval); "
            "fractions of requests p [lo, hi]: pooled over the seeds, Wilson's 95% score "
            "interval (widened by the spread between seeds)"
            f"\n\n{text}")


def _overloaded(part: pd.DataFrame) -> str:
    """The ``overloaded`` cell of one (config, rate): ``yes (tier)`` / ``no`` with one seed,
    ``k/n (tier)`` with ``n`` seeds."""
    if "overloaded" not in part or part["overloaded"].isna().all():
        return "-"
    flags = part["overloaded"].fillna(0).astype(bool)
    tiers = sorted({t for t in part.get("bottleneck", pd.Series(dtype=str))[flags] if t})
    where = f" ({', '.join(tiers)})" if tiers else ""
    if len(part) == 1:
        return ("yes" + where) if flags.iloc[0] else "no"
    return f"{int(flags.sum())}/{len(part)}{where}"


def plot_rate_sweep(frame: pd.DataFrame, path: str | Path) -> Path:
    """TTFT / TPOT p50 and p99, goodput and served fraction against offered rate, one line per
    config (means over seeds), as a PNG at ``path``."""
    import matplotlib  # lazy: plots only when asked for

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: plots only when asked for

    panels = (("ttft_p50_s", "ttft_p99_s", "TTFT (s)"), ("tpot_p50_s", "tpot_p99_s", "TPOT (s)"),
              ("goodput", "served_fraction", "fraction"))
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    g = frame.groupby(["config", "offered_rate"], sort=False).mean(numeric_only=True)
    for ax, (a, b, label) in zip(axes, panels, strict=True):
        for name in dict.fromkeys(frame["config"]):
            part = g.loc[name]
            ax.plot(part.index, part[a], marker="o", label=f"{name} {a}")
            ax.plot(part.index, part[b], marker="x", linestyle="--", label=f"{name} {b}")
        ax.set_xlabel("offered rate (req/s)")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    try:
        with atomic_write(path, "wb") as fh:
            fig.savefig(fh, format=path.suffix.lstrip(".").lower() or "png", dpi=110)
    finally:
        plt.close(fig)
    return path


def comparison_text(
    frame: pd.DataFrame, columns: Sequence[str], baseline: str | None = None
) -> str:
    """A compared frame (`compare`, either mode) as text: per metric and config the mean over
    seeds with its 95% interval, and the paired difference to ``baseline`` with its interval
    (seconds below `TINY_S` print as 0: float rounding of a difference of sums); then a line
    with each config's scheduled rebalances per run, where the frame has them."""
    table = ci_table(frame, columns, baseline)
    base = table.attrs["baseline"]
    rows = []
    for m in columns:
        unit = UNITS.get(m, "s" if m.endswith("_s") else "")
        tiny = TINY_S if unit == "s" else 0.0

        def f(x: float, sign: bool = False, tiny: float = tiny, unit: str = unit) -> str:
            if unit == "bytes" and x is not None and math.isfinite(x):
                return ("+" if sign and x >= 0 else "") + data_size(x)
            return _fmt(0.0 if x is not None and abs(x) < tiny else x, sign)

        for name in table.index:
            r = table.loc[name, m]
            rows.append((m, unit, name, f(r["mean"]), f"[{f(r['lo'])}, {f(r['hi'])}]",
                         f(r["d_mean"], True), f"[{f(r['d_lo'], True)}, {f(r['d_hi'], True)}]"))
    text = text_table(rows, header=("metric", "unit", "config", "mean", "95% CI",
                                    f"d vs {base}", "95% CI of d"))
    if "overloaded" in frame and frame["overloaded"].notna().any():
        text += "\noverloaded (seeds): " + ", ".join(
            f"{name} {_overloaded(part)}" for name, part in frame.groupby("config", sort=False))
    if "rebalances" in frame and frame["rebalances"].notna().any():
        per = frame.groupby("config", sort=False)["rebalances"].mean()
        text += "\nscheduled rebalances per run (mean over seeds): " + ", ".join(
            f"{name} {n:g}" for name, n in per.items())
        if (per == 0).any():
            text += (" (a config with 0 ran its initial placement throughout: a run shorter "
                     "than eplb.rebalance_interval_s, or a policy that never rebalances)")
    return text


def compared_columns(frame: pd.DataFrame) -> list[str]:
    """The metric columns a comparison table shows for ``frame`` (`compare`, either mode):
    those present with at least one value."""
    if frame.attrs.get("mode") == "counterfactual":
        cols = list(COUNTERFACTUAL)
    else:
        skip = ("requests", "requests_finished", "requests_decided", "censored", "overloaded",
                *metrics.TEXT)
        cols = [c for c in metrics.SOURCE if c not in skip]
    return [c for c in cols if c in frame and frame[c].notna().any()]


def frame_text(frame: pd.DataFrame) -> str:
    """A small frame as an aligned text table (numbers to 4 significant digits, thousands
    with separators, bytes in GB / TB; a column with a unit in `UNITS` says it in its
    header)."""
    units = [UNITS.get(c, "") for c in frame.columns]
    rows = [tuple((data_size(v) if u == "bytes" else _fmt(v)) if isinstance(v, float)
                  else str(v) for v, u in zip(rec, units, strict=True))
            for rec in frame.itertuples(index=False)]
    return text_table(rows, header=[f"{c} ({u})" if u and u != "bytes" else str(c)
                                    for c, u in zip(frame.columns, units, strict=True)])


def _fmt(x: float, sign: bool = False) -> str:
    """4 significant digits below 1,000, whole numbers with separators from 1,000 (never an
    exponent there); ``-`` for NaN or None."""
    if x is None or not math.isfinite(x):
        return "-"
    if abs(x) >= 1000:
        return f"{x:+,.0f}" if sign else f"{x:,.0f}"
    return f"{x:+.4g}" if sign else f"{x:.4g}"
