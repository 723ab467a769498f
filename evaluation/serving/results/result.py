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

from eplb.atomic import os_errors
from eplb.errors import InputError
from eplb.evaluation.serving.results import plots, verdict
from eplb.evaluation.serving.results.notes import few_tokens_note
from eplb.evaluation.serving.steptime import BREAKDOWN
from eplb.format import data_size, text_table

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
    "measure_from_s": "s",
    "arrival_window_s": "s",
    "drain_s": "s",
    "drain_cap_s": "s",
    "requests": "requests",
    "requests_finished": "requests",
    "censored": "requests",
    "requests_decided": "requests",
    "served_fraction": "fraction",
    "retries": "retries",
    "retractions": "retractions",
    "ttft_p50_s": "s",
    "ttft_p90_s": "s",
    "ttft_p99_s": "s",
    "ttft_queue_mean_s": "s",
    "ttft_prefill_mean_s": "s",
    "ttft_transfer_mean_s": "s",
    "ttft_admission_mean_s": "s",
    "itl_p50_s": "s",
    "itl_p90_s": "s",
    "itl_p99_s": "s",
    "tpot_p50_s": "s",
    "tpot_p90_s": "s",
    "tpot_p99_s": "s",
    "e2e_p50_s": "s",
    "e2e_p90_s": "s",
    "e2e_p99_s": "s",
    "lower_bounds": "keys",
    "output_tok_s_per_request": "tok/s",
    "input_tok_s_per_node": "tok/s/node",
    "output_tok_s_per_node": "tok/s/node",
    "kv_hit_rate": "fraction",
    "goodput": "fraction",
    "ttft_miss_fraction": "fraction",
    "tpot_miss_fraction": "fraction",
    "ttft_miss_input_p50": "tokens",
    "input_p50": "tokens",
    "slo_ttft_s": "s",
    "slo_tpot_s": "s",
    "arrivals_per_s": "req/s",
    "prefills_per_s": "req/s",
    "kv_transfers_per_s": "req/s",
    "first_tokens_per_s": "req/s",
    "completions_per_s": "req/s",
    "waiting_at_start": "requests",
    "waiting_at_end": "requests",
    "backlog_growth_per_s": "req/s",
    "prefill_busy": "fraction",
    "decode_full": "fraction",
    "overloaded": "yes/no",
    "bottleneck": "tier",
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
QUANTILES = (50, 90, 99)


def _pct(x: np.ndarray, q: float) -> float:
    """The ``q``-th percentile of ``x: float[k]`` (NaN when empty)."""
    return float(np.percentile(x, q)) if x.size else math.nan


def censored_percentiles(
    exact: np.ndarray, censored: np.ndarray, qs=QUANTILES
) -> tuple[list[float], list[bool]]:
    """Percentiles over ``exact: float[a]`` values and ``censored: float[b]`` lower bounds
    (requests still waiting: their wait so far); each with a flag, True when it is a lower
    bound (some censored value lies at or below it, so the true percentile may be larger)."""
    both = np.concatenate([exact, censored])
    vals = [_pct(both, q) for q in qs]
    low = float(censored.min()) if censored.size else math.inf
    # exact when both order statistics the interpolation uses lie below every censored value
    upper = [float(np.percentile(both, q, method="higher")) if both.size else math.nan
             for q in qs]
    return vals, [bool(u >= low) for u in upper]


def weighted_percentiles(values: np.ndarray, weights: np.ndarray, qs=QUANTILES) -> list[float]:
    """Percentiles of ``values: float[k]`` each counted ``weights: float[k]`` times (the
    inverted CDF: the smallest value whose cumulative weight reaches ``q%``); NaN if empty."""
    keep = weights > 0
    v, w = values[keep], weights[keep]
    if not v.size:
        return [math.nan for _ in qs]
    order = np.argsort(v, kind="stable")
    v, c = v[order], np.cumsum(w[order])
    return [float(v[min(int(np.searchsorted(c, q / 100 * c[-1])), v.size - 1)]) for q in qs]


def inter_token_gaps(requests: pd.DataFrame, steps: pd.DataFrame, end: float):
    """Every inter-token gap of ``requests`` as ``(values: float[k], weights: float[k])``: a
    request admitted at decode step ``k0`` (its first token goes out at that step's start)
    receives a chunk at the end of each step ``k0..k1`` of its unit, so its gaps are ``E[k0]
    - S[k0]`` and ``E[k] - E[k - 1]`` (stalls and idle time between steps included), one per
    step as `vllm bench serve` counts one per streamed chunk; only steps ended by ``end``."""
    vals, wts = [], []
    dec = steps[steps["phase"] == "decode"] if len(steps) else steps
    if not len(dec) or not len(requests):
        return np.zeros(0), np.zeros(0)
    r = requests[requests["decode_first_step"] >= 0]
    for v, part in dec.groupby("unit"):
        k = part["step"].to_numpy()
        K = int(k.max()) + 1
        S = np.full(K, np.nan)
        E = np.full(K, np.nan)
        S[k] = part["start_s"].to_numpy()
        E[k] = S[k] + part["duration_s"].to_numpy()
        mine = r[r["decode_unit"] == v]
        if not len(mine):
            continue
        k0 = mine["decode_first_step"].to_numpy()
        k1 = np.minimum(mine["decode_last_step"].to_numpy(), K - 1)
        ok = k1 >= k0
        k0, k1 = k0[ok], k1[ok]
        first = np.bincount(k0, minlength=K).astype(np.float64)
        cont = np.zeros(K + 1)
        np.add.at(cont, k0 + 1, 1.0)
        np.add.at(cont, k1 + 1, -1.0)
        cont = np.cumsum(cont)[:K]
        ended = E <= end
        gap = np.full(K, np.nan)
        gap[1:] = E[1:] - E[:-1]
        vals += [E - S, gap]
        wts += [np.where(ended, first, 0.0), np.where(ended & ~np.isnan(gap), cont, 0.0)]
    if not vals:
        return np.zeros(0), np.zeros(0)
    values, weights = np.concatenate(vals), np.concatenate(wts)
    keep = weights > 0
    return values[keep], weights[keep]


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
    def arrival_window(self) -> tuple[float, float]:
        """``(0, arrivals end)`` in seconds: the window `summary` covers by default (the
        whole run when every request arrived at t = 0, a batch)."""
        end = float(self.meta.get("end_s", 0.0))
        arrivals_end = float(self.meta.get("arrivals_end_s", end))
        return 0.0, arrivals_end if arrivals_end > 1e-9 else end

    def summary(
        self, window: tuple[float, float] | None = None, *, measure_from_s: float | None = None
    ) -> dict[str, Any]:
        """Latency percentiles as `vllm bench serve` reports them, throughput per node, KV hit
        rate, goodput, the load verdict (`SUMMARY_UNITS`; docs/serving.md, "Results").

        ``window=(t0, t1)`` (seconds; default the window in which requests arrived,
        ``meta["arrivals_end_s"]``, not the drain after it) and ``measure_from_s`` (a warm-up
        left out: the window starts there): throughput from the steps starting in it,
        latencies and goodput over *every* request arriving in it. A request without a first
        token by the run's end enters TTFT (and E2E) with its wait so far, a lower bound; the
        percentiles it can raise are listed in ``lower_bounds``. TTFT is to the first token at
        the client (KV transfer and decode admission included; ``ttft_*_mean_s`` its parts
        over the served requests); ITL from the token emission times; TPOT per finished
        request ``(e2e - ttft) / (output - 1)``. Goodput: the share of the decided requests
        that finished within both SLOs; a request still unfinished at the end whose SLOs are
        not yet missed is ``censored``, reported apart (`verdict.slo_outcomes`). The load
        verdict (``overloaded``, ``bottleneck`` and the rates beside them) covers the part of
        the window in which requests arrived (`verdict.load_verdict`). Rebalances, stalls and
        bytes moved: those of the whole run from ``t0`` (of the window, when given).
        """
        end = self.meta.get("end_s", 0.0)
        arrivals_end = self.arrival_window()[1]
        t0, t1 = (0.0, arrivals_end) if window is None else (float(window[0]), float(window[1]))
        if measure_from_s is not None:
            if not (isinstance(measure_from_s, (int, float)) and measure_from_s >= 0):
                raise InputError(f"measure_from_s must be seconds >= 0, got {measure_from_s!r}")
            t0 = max(t0, float(measure_from_s))
        if not t1 > t0:
            raise InputError(
                f"window must be (start, end) with end > start, got {(t0, t1)!r}"
                + (" (measure_from_s is past the end of the arrivals)"
                   if measure_from_s is not None else "")
            )
        span = t1 - t0
        req = self.requests
        sel = req[(req["arrival_s"] >= t0) & (req["arrival_s"] < t1)]
        fin = sel[sel["finish_s"].notna()]
        served = sel["first_token_s"].notna().to_numpy()
        wait = end - sel["arrival_s"].to_numpy()
        ttft_all = sel["ttft_s"].to_numpy()
        e2e_all = sel["e2e_s"].to_numpy() if "e2e_s" in sel else (
            sel["finish_s"] - sel["arrival_s"]).to_numpy()
        done = ~np.isnan(e2e_all)
        tpot = fin["tpot_s"].dropna().to_numpy()
        steps = self.steps
        st = steps[(steps["start_s"] >= t0) & (steps["start_s"] < t1)] if len(steps) else steps
        pre = st[st["phase"] == "prefill"] if len(st) else st
        dec = st[st["phase"] == "decode"] if len(st) else st
        slo = self.meta.get("slo", {})
        slo_ttft, slo_tpot = slo.get("ttft_s", math.inf), slo.get("tpot_s", math.inf)
        outcome = verdict.slo_outcomes(sel, end, slo_ttft, slo_tpot)
        decided = int(outcome["decided"].sum())
        routed = sel[sel["routed_s"].notna()]
        inp = float(routed["input_tokens"].sum())
        out: dict[str, Any] = {
            "duration_s": span,
            "measure_from_s": t0,
            "arrival_window_s": max(min(t1, arrivals_end) - t0, 0.0),
            "drain_s": max(end - arrivals_end, 0.0),
            "drain_cap_s": float(self.meta.get("drain_cap_s", math.inf)),
            "requests": int(len(sel)),
            "requests_finished": int(len(fin)),
            "censored": int(outcome["censored"].sum()),
            "requests_decided": decided,
            "served_fraction": float(served.mean()) if len(sel) else math.nan,
            "retries": int(sel["retries"].sum()),
            "retractions": int(sel["retractions"].sum()) if "retractions" in sel else 0,
        }
        lower = []
        for name, vals_all, have in (("ttft", ttft_all, served), ("e2e", e2e_all, done)):
            vals, flags = censored_percentiles(vals_all[have], wait[~have])
            for q, v, f in zip(QUANTILES, vals, flags, strict=True):
                out[f"{name}_p{q}_s"] = v
                if f:
                    lower.append(f"{name}_p{q}_s")
            if name == "ttft":
                sv = sel[served]
                for part, col in (
                    ("queue", "queue_s"),
                    ("prefill", "prefill_s"),
                    ("transfer", "transfer_s"),
                    ("admission", "decode_admission_s"),
                ):
                    x = sv[col].to_numpy() if col in sv else np.zeros(0)
                    out[f"ttft_{part}_mean_s"] = float(x.mean()) if x.size else math.nan
                gv, gw = (
                    inter_token_gaps(sel, steps, end)
                    if "decode_first_step" in sel
                    else (np.zeros(0), np.zeros(0))
                )
                for q, v in zip(QUANTILES, weighted_percentiles(gv, gw), strict=True):
                    out[f"itl_p{q}_s"] = v
                for q in QUANTILES:
                    out[f"tpot_p{q}_s"] = _pct(tpot, q)
        out["lower_bounds"] = ",".join(lower)
        out["output_tok_s_per_request"] = float(np.mean(1.0 / tpot)) if tpot.size else math.nan
        pn, dn = self.meta.get("prefill_nodes", 1), self.meta.get("decode_nodes", 1)
        out["input_tok_s_per_node"] = (
            float(pre["input_tokens_done"].sum()) / span / pn if len(pre) else 0.0
        )
        out["output_tok_s_per_node"] = (
            float(dec["output_tokens"].sum()) / span / dn if len(dec) else 0.0
        )
        out["kv_hit_rate"] = float(routed["cached_tokens"].sum()) / inp if inp else 0.0
        out["goodput"] = float(outcome["met"].sum()) / decided if decided else math.nan
        for key in ("ttft", "tpot"):
            out[f"{key}_miss_fraction"] = (
                float((outcome[f"miss_{key}"] & outcome["decided"]).sum()) / decided
                if decided else math.nan)
        prompts = sel["input_tokens"].to_numpy()
        missed = prompts[outcome["miss_ttft"]]
        out["ttft_miss_input_p50"] = float(np.median(missed)) if missed.size else math.nan
        out["input_p50"] = float(np.median(prompts)) if prompts.size else math.nan
        out["slo_ttft_s"] = float(slo.get("ttft_s", math.nan))
        out["slo_tpot_s"] = float(slo.get("tpot_s", math.nan))
        out.update(verdict.load_verdict(req, steps, self.meta, t0,
                                        max(min(t1, arrivals_end), t0)))
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
        r1 = end if window is None else t1  # the run's rebalances, or the window's
        rb = rb[(rb["time_s"] >= t0) & (rb["time_s"] < r1)] if len(rb) else rb
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

    def summary_table(self, window=None, *, measure_from_s: float | None = None) -> str:
        """The summary as an aligned text table with a unit column (``>=`` marks a lower
        bound; bytes in GB / TB), then the SLOs goodput is measured against, how long the run
        drained after arrivals stopped (and its cap), and the verdict line
        (`verdict.verdict_text`: overloaded or not, the bottleneck tier, the SLO misses)."""
        s = self.summary(window, measure_from_s=measure_from_s)
        lower = set(filter(None, s["lower_bounds"].split(",")))
        rows = []
        for key, value in s.items():
            if key == "lower_bounds":
                continue
            unit = SUMMARY_UNITS.get(key, "")
            if isinstance(value, bool):
                text = "yes" if value else "no"
            elif isinstance(value, str):
                text = value or "-"
            elif unit == "bytes":
                text, unit = data_size(value), ""
            elif isinstance(value, float):
                if math.isnan(value):
                    text = "nan"
                elif math.isinf(value):
                    text = "none"
                elif unit == "s" and abs(value) < 10:
                    text = f"{value:.4g}"
                elif unit == "fraction":
                    text = f"{value:.4f}"
                else:
                    text = f"{value:,.1f}" if abs(value) >= 100 else f"{value:.4g}"
            else:
                text = f"{value:,}"
            if key in lower:
                text = ">= " + text
            rows.append((key, text, unit))
        lines = [text_table(rows, header=("metric", "value", "unit"))]
        lines.append(
            f"goodput: finished within TTFT <= {s['slo_ttft_s']:g} s and TPOT <= "
            f"{s['slo_tpot_s']:g} s (SLOs of the config), over the requests whose outcome is "
            "decided; TTFT is to the first token at the client (queue + prefill + KV "
            "transfer + decode admission)"
        )
        lines.append(drain_text(s))
        if lower:
            lines.append(
                f"'>=': lower bounds ({1 - s['served_fraction']:.1%} of the arrivals had no "
                "first token by the end and enter with their wait so far)"
            )
        few = few_tokens_note(s, self.meta.get("config"))
        if few:
            lines.append(few)
        lines.append("verdict: " + verdict.verdict_text(s))
        return "\n".join(lines)

    # ------------------------------------------------------------------ output
    def save(self, folder: str | os.PathLike, config=None, *, window=None,
             plots: bool = True, measure_from_s: float | None = None) -> Path:
        """Write the result into the existing empty ``folder`` (what `eplb simulate -o` holds):
        ``summary.json`` (summary over ``window`` and `meta`), ``requests.parquet``,
        ``steps.parquet``, ``rebalances.csv``, ``faults.csv``, ``utilisation.parquet``,
        ``config.toml`` (``config`` as run, when given) and ``plots/``."""
        folder = Path(folder)
        with os_errors(folder):  # a full disk or a long name: the path and the fix
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
            payload = {
                "summary": self.summary(window, measure_from_s=measure_from_s),
                "window": window,
                "meta": self.meta,
            }
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


def drain_text(s: dict[str, Any]) -> str:
    """One line: how long the run went on after arrivals stopped, its cap, and what the cap
    left unfinished (the censored requests, reported apart)."""
    cap = s["drain_cap_s"]
    cap_text = "no cap: until every admitted request finished" if math.isinf(cap) else (
        f"cap {cap:,.4g} s")
    text = (f"drain: arrivals stopped, then the run finished what was admitted for "
            f"{s['drain_s']:,.4g} s ({cap_text})")
    if s["censored"]:
        text += (f"; {s['censored']:,} requests were still running at the end with no SLO "
                 "missed yet: censored, reported apart and left out of goodput (raise the "
                 "drain cap, --drain, to decide them)")
    return text


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
