"""`SimResult`: a simulation's frames (``requests``, ``steps``, ``rebalances``, ``faults``: columns
`STEP_COLUMNS`, `REBALANCE_COLUMNS`, `FAULT_COLUMNS`), per-unit ``utilisation``, a `summary`
with units (`SUMMARY_UNITS`) and its plots; every column is described in docs/serving.md,
"Results"."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from eplb.errors import InputError
from eplb.evaluation.serving.results import plots
from eplb.evaluation.serving.steptime import BREAKDOWN
from eplb.format import text_table

__all__ = ["FAULT_COLUMNS", "REBALANCE_COLUMNS", "STEP_COLUMNS", "SUMMARY_UNITS", "SimResult"]

STEP_COLUMNS = (
    "phase",
    "unit",
    "step",
    "start_s",
    "duration_s",
    "tokens",
    "requests",
    "kv_tokens",
    "input_tokens_done",
    "output_tokens",
    "gpu_load_max_over_mean",
    "placement_version",
    *(f"{k}_s" for k in BREAKDOWN),
)

REBALANCE_COLUMNS = (
    "time_s",
    "phase",
    "unit",
    "kind",
    "solver",
    "replicas_moved",
    "bytes_moved",
    "max_gpu_bytes",
    "copy_s",
    "stall_s",
    "solve_wall_s",
    "expected_balance_before",
    "expected_balance_after",
    "predicted_gain",
)
FAULT_COLUMNS = (
    "time_s",
    "phase",
    "unit",
    "gpu",
    "requests_requeued",
    "orphaned_experts",
    "emergency_replicas_moved",
    "stall_s",
)

# the summary's keys with their units (the CLI prints them; docs list them)
SUMMARY_UNITS = {
    "duration_s": "s",
    "requests": "requests",
    "requests_finished": "requests",
    "retries": "retries",
    "ttft_p50_s": "s",
    "ttft_p90_s": "s",
    "ttft_p99_s": "s",
    "tpot_p50_s": "s",
    "tpot_p90_s": "s",
    "tpot_p99_s": "s",
    "output_tok_s_per_request": "tok/s",
    "input_tok_s_per_node": "tok/s/node",
    "output_tok_s_per_node": "tok/s/node",
    "kv_hit_rate": "fraction",
    "goodput": "fraction",
    "prefill_step_s": "s",
    "decode_step_s": "s",
    "decode_running_per_gpu": "requests",
    "prefill_gpu_load_max_over_mean": "ratio",
    "decode_gpu_load_max_over_mean": "ratio",
    "rebalances": "rebalances",
    "stall_s": "s",
    "bytes_moved": "bytes",
    "rebalances_skipped": "rebalances",
    "emergency_placements": "placements",
    "emergency_replicas_moved": "replicas",
}


def _pct(x: np.ndarray, q: float) -> float:
    """The ``q``-th percentile of ``x: float[k]`` (NaN when empty)."""
    return float(np.percentile(x, q)) if x.size else math.nan


@dataclass
class SimResult:
    """A simulation's frames (docs/serving.md, "Results"), per-unit ``utilisation`` and
    ``meta`` (config, seed, end time, node counts, events processed)."""

    requests: pd.DataFrame
    steps: pd.DataFrame
    rebalances: pd.DataFrame
    faults: pd.DataFrame
    utilisation: dict[str, pd.DataFrame] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ summary
    def summary(self, window: tuple[float, float] | None = None) -> dict[str, Any]:
        """Latency percentiles, throughput per node, KV hit rate, goodput (`SUMMARY_UNITS`).

        ``window=(t0, t1)`` (seconds): throughput from the steps starting in it, latencies and
        goodput over the requests arriving in it (default: the whole run, ``(0, end)``).
        Goodput is the share of the arrived requests that finished within both SLOs (TTFT, and
        TPOT for outputs longer than one token); unfinished requests count as misses.
        ``input_tok_s_per_node``: prompt tokens (cached included) of the prefills finished per
        second per prefill node; ``output_tok_s_per_node``: tokens decode units emitted per
        second per decode node (the first token of each request comes from prefill).
        """
        end = self.meta.get("end_s", 0.0)
        t0, t1 = (0.0, end) if window is None else (float(window[0]), float(window[1]))
        if not t1 > t0:
            raise InputError(f"window must be (start, end) with end > start, got {window!r}")
        span = t1 - t0
        req = self.requests
        sel = req[(req["arrival_s"] >= t0) & (req["arrival_s"] < t1)]
        fin = sel[sel["finish_s"].notna()]
        ttft = sel["ttft_s"].dropna().to_numpy()
        tpot = fin["tpot_s"].dropna().to_numpy()
        steps = self.steps
        st = steps[(steps["start_s"] >= t0) & (steps["start_s"] < t1)] if len(steps) else steps
        pre = st[st["phase"] == "prefill"] if len(st) else st
        dec = st[st["phase"] == "decode"] if len(st) else st
        slo = self.meta.get("slo", {})
        ok = fin["ttft_s"] <= slo.get("ttft_s", math.inf)
        ok &= fin["tpot_s"].isna() | (fin["tpot_s"] <= slo.get("tpot_s", math.inf))
        routed = sel[sel["routed_s"].notna()]
        inp = float(routed["input_tokens"].sum())
        out: dict[str, Any] = {
            "duration_s": span,
            "requests": int(len(sel)),
            "requests_finished": int(len(fin)),
            "retries": int(sel["retries"].sum()),
        }
        for name, arr in (("ttft", ttft), ("tpot", tpot)):
            for q in (50, 90, 99):
                out[f"{name}_p{q}_s"] = _pct(arr, q)
        out["output_tok_s_per_request"] = float(np.mean(1.0 / tpot)) if tpot.size else math.nan
        pn, dn = self.meta.get("prefill_nodes", 1), self.meta.get("decode_nodes", 1)
        out["input_tok_s_per_node"] = (
            float(pre["input_tokens_done"].sum()) / span / pn if len(pre) else 0.0
        )
        out["output_tok_s_per_node"] = (
            float(dec["output_tokens"].sum()) / span / dn if len(dec) else 0.0
        )
        out["kv_hit_rate"] = float(routed["cached_tokens"].sum()) / inp if inp else 0.0
        out["goodput"] = float(ok.sum()) / len(sel) if len(sel) else math.nan
        for phase, part in (("prefill", pre), ("decode", dec)):
            dur = part["duration_s"].to_numpy() if len(part) else np.zeros(0)
            out[f"{phase}_step_s"] = float(dur.mean()) if dur.size else math.nan
            out[f"{phase}_gpu_load_max_over_mean"] = (
                float(np.average(part["gpu_load_max_over_mean"], weights=dur))
                if dur.size and dur.sum() > 0
                else math.nan
            )
        gpus = self.meta.get("decode_gpus", 1)
        if len(dec):
            out["decode_running_per_gpu"] = (
                float(
                    (dec["requests"] * dec["duration_s"]).sum()
                    / max(dec["duration_s"].sum(), 1e-300)
                )
                / gpus
            )
        else:
            out["decode_running_per_gpu"] = 0.0
        rb = self.rebalances
        rb = rb[(rb["time_s"] >= t0) & (rb["time_s"] < t1)] if len(rb) else rb
        kind = rb["kind"] if len(rb) else pd.Series([], dtype=object)
        out["rebalances"] = int((kind == "scheduled").sum())  # applied scheduled rebalances
        out["stall_s"] = float(rb["stall_s"].sum()) if len(rb) else 0.0  # emergencies too
        out["bytes_moved"] = float(rb["bytes_moved"].sum()) if len(rb) else 0.0
        out["rebalances_skipped"] = int((kind == "skipped").sum())
        emergency = rb[kind == "emergency"] if len(rb) else rb
        out["emergency_placements"] = int(len(emergency))
        out["emergency_replicas_moved"] = (
            int(emergency["replicas_moved"].sum()) if len(emergency) else 0
        )
        return out

    def summary_table(self, window=None) -> str:
        """The summary as an aligned text table with a unit column."""

        rows = []
        for key, value in self.summary(window).items():
            unit = SUMMARY_UNITS.get(key, "")
            if isinstance(value, float):
                if math.isnan(value):
                    text = "nan"
                elif unit == "s" and abs(value) < 10:
                    text = f"{value:.4g}"
                elif unit == "fraction":
                    text = f"{value:.4f}"
                else:
                    text = f"{value:,.1f}" if abs(value) >= 100 else f"{value:.4g}"
            else:
                text = f"{value:,}"
            rows.append((key, text, unit))
        return text_table(rows, header=("metric", "value", "unit"))

    # ------------------------------------------------------------------ output
    def save(self, folder: str | os.PathLike, config=None, *, window=None,
             plots: bool = True) -> Path:
        """Write the result into the existing empty ``folder`` (what `eplb simulate -o` holds):
        ``summary.json`` (summary over ``window`` and `meta`), ``requests.parquet``,
        ``steps.parquet``, ``rebalances.csv``, ``faults.csv``, ``utilisation.parquet``,
        ``config.toml`` (``config`` as run, when given) and ``plots/``."""
        folder = Path(folder)
        self.requests.to_parquet(folder / "requests.parquet", index=False)
        self.steps.to_parquet(folder / "steps.parquet", index=False)
        self.rebalances.to_csv(folder / "rebalances.csv", index=False)
        self.faults.to_csv(folder / "faults.csv", index=False)
        util = []
        for name, frame in self.utilisation.items():
            long = frame.stack().rename("utilisation").reset_index()
            long.insert(0, "unit", name)
            util.append(long)
        if util:
            pd.concat(util, ignore_index=True).to_parquet(folder / "utilisation.parquet",
                                                         index=False)
        if config is not None:
            (folder / "config.toml").write_text(config.to_toml(), encoding="utf-8")
        payload = {"summary": self.summary(window), "window": window, "meta": self.meta}
        (folder / "summary.json").write_text(
            json.dumps(_nan_to_none(payload), indent=1, default=_json_default,
                       allow_nan=False),
            encoding="utf-8",
        )
        if plots:
            self.plot(folder / "plots")
        return folder

    def plot(self, directory: str | os.PathLike) -> list[Path]:
        """Write the plots (TTFT/TPOT CDFs, tokens/s per node over time with rebalances and
        faults, per-rank utilisation heatmaps, step-time breakdown) into ``directory``."""
        return plots.write_all(self, Path(directory))


def _json_default(obj):
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return _nan_to_none(float(obj))
    return str(obj)


def _nan_to_none(obj):
    """``obj`` with every non-finite float as None (JSON has no NaN or infinity)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_nan_to_none(v) for v in obj]
    return obj
