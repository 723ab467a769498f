"""What a run's figures say: whether the offered load is above what the cluster serves (judged
in the window in which requests arrive, never from a queue that drained after arrivals
stopped), which tier is the bottleneck, and which SLO each request met, missed or left
undecided (censored). `SimResult.summary` reads these; docs/serving.md, "The verdict", states
the rule.

The rule (`load_verdict`): over the arrival window ``[t0, t1)``, the requests waiting for a
first token are counted on a grid of `GRID` times; the run is **overloaded** when their
least-squares trend exceeds `GROWTH_SHARE` of the arrival rate (completions fall more than 5%
short of arrivals) *and* they grew by more than `GROWTH_SHARE` of the window's arrivals. The
**bottleneck** is the stage whose own backlog trends up most (prefill, counted from arrival
with the router's queue; KV transfer; decode admission), read as a tier: a growing prefill
backlog is the prefill tier when the prefill units stepped at least `BUSY` of the window,
decode when they idled while the decode tier was at least `FULL` full (requests wait for
decode KV before their prefill), else the router's admission rule; a growing transfer backlog
is decode when decode is that full (prefilled prompts wait for decode room), else the KV
transfer links; a growing admission backlog is decode.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "BUSY",
    "FULL",
    "GRID",
    "GROWTH_SHARE",
    "TIERS",
    "in_system",
    "load_verdict",
    "slo_outcomes",
    "trend",
    "verdict_text",
]

GROWTH_SHARE = 0.05  # backlog trend above this share of the arrival rate: overloaded
BUSY = 0.9  # prefill units stepping this share of the window: the prefill tier is saturated
FULL = 0.8  # decode running requests or KV at this share of capacity: decode is full
GRID = 256  # times the backlog is counted at over the window
# bottleneck names, in pipeline order, with what the verdict says of each
TIERS = {
    "prefill": "prefill (prompts queue for the prefill units, which step all the time)",
    "admission": "router admission (requests wait at the router while prefill idles and "
                 "decode has room)",
    "kv_transfer": "KV transfer (prefilled prompts wait for the link to decode)",
    "decode": "decode (requests wait for decode KV or batch room)",
}


def in_system(start: np.ndarray, stop: np.ndarray, t: np.ndarray) -> np.ndarray:
    """``int64[k]``: at each time of ``t: float[k]``, the requests with ``start <= t`` and not
    ``stop <= t`` (``start, stop: float[n]`` seconds; NaN ``start``: never entered, NaN
    ``stop``: still there at the end)."""
    ok = ~np.isnan(start)
    s = np.sort(start[ok])
    stop = stop[ok]
    e = np.sort(stop[~np.isnan(stop)])
    return np.searchsorted(s, t, side="right") - np.searchsorted(e, t, side="right")


def trend(t: np.ndarray, b: np.ndarray) -> float:
    """The least-squares slope of ``b: float[k]`` on ``t: float[k]`` (units of b per second);
    0 with fewer than two distinct times."""
    tc = t - t.mean()
    den = float((tc * tc).sum())
    return float((tc * (b - b.mean())).sum() / den) if den > 0 else 0.0


def _busy(part: pd.DataFrame, t0: float, t1: float) -> float:
    """Seconds of ``part``'s steps inside ``[t0, t1)``."""
    if not len(part):
        return 0.0
    s = part["start_s"].to_numpy()
    e = s + part["duration_s"].to_numpy()
    return float(np.clip(np.minimum(e, t1) - np.maximum(s, t0), 0.0, None).sum())


def _decode_full(steps: pd.DataFrame, meta: Mapping[str, Any], t0: float, t1: float) -> float:
    """Time-weighted share of decode capacity in use over the second half of ``[t0, t1)``:
    the larger of running requests over ``max_running_requests`` and context tokens over
    ``kv_capacity_tokens`` (the config's, per rank, times the unit's GPUs); NaN when the
    config sets neither or no decode step ran."""
    if not len(steps):
        return math.nan
    mid = (t0 + t1) / 2
    d = steps[(steps["phase"] == "decode") & (steps["start_s"] >= mid) & (steps["start_s"] < t1)]
    g = float(meta.get("decode_gpus", 0) or 0)
    if not len(d) or g <= 0:
        return math.nan
    w = d["duration_s"].to_numpy()
    if w.sum() <= 0:
        return math.nan
    shares = []
    run, kv = meta.get("decode_max_running"), meta.get("decode_kv_capacity_tokens")
    if run:
        shares.append(d["requests"].to_numpy() / (float(run) * g))
    if kv:
        shares.append(d["kv_tokens"].to_numpy() / (float(kv) * g))
    if not shares:
        return math.nan
    return float(np.average(np.max(shares, axis=0), weights=w))


def load_verdict(requests: pd.DataFrame, steps: pd.DataFrame, meta: Mapping[str, Any],
                 t0: float, t1: float) -> dict[str, Any]:
    """The load verdict over the arrival window ``[t0, t1)`` (the module docstring's rule):
    ``arrivals_per_s`` and the completion rate of each stage in the window
    (``prefills_per_s``, ``kv_transfers_per_s``, ``first_tokens_per_s``,
    ``completions_per_s``), ``waiting_at_start`` / ``waiting_at_end`` (requests waiting for a
    first token at ``t0`` / ``t1``), ``backlog_growth_per_s`` (their trend), ``prefill_busy``
    (share of the window the prefill units stepped), ``decode_full`` (`_decode_full`),
    ``overloaded`` and ``bottleneck`` (a key of `TIERS`, or "" when not overloaded)."""
    span = t1 - t0
    arr = requests["arrival_s"].to_numpy()
    first = requests["first_token_s"].to_numpy()
    pre_end = requests["prefill_end_s"].to_numpy()
    out_tok = requests["output_tokens"].to_numpy()
    multi = out_tok > 1  # one-token outputs end at their prefill: no transfer, no decode
    kv_ready = np.where(multi, requests["kv_ready_s"].to_numpy(), np.nan)
    fin = requests["finish_s"].to_numpy()
    n_arr = int(((arr >= t0) & (arr < t1)).sum())

    def rate(x: np.ndarray) -> float:
        return float(((x >= t0) & (x < t1)).sum()) / span if span > 0 else math.nan

    out: dict[str, Any] = {
        "arrivals_per_s": n_arr / span if span > 0 else math.nan,
        "prefills_per_s": rate(pre_end),
        "kv_transfers_per_s": rate(kv_ready),
        "first_tokens_per_s": rate(first),
        "completions_per_s": rate(fin),
    }
    grid = np.linspace(t0, t1, GRID) if span > 0 else np.array([t0])
    waiting = in_system(arr, first, grid)
    out["waiting_at_start"] = int(waiting[0])
    out["waiting_at_end"] = int(in_system(arr, first, np.array([t1]))[0])
    growth = trend(grid, waiting.astype(np.float64))
    out["backlog_growth_per_s"] = growth
    lam = out["arrivals_per_s"]
    overloaded = bool(
        span > 0
        and growth > GROWTH_SHARE * lam
        and out["waiting_at_end"] - out["waiting_at_start"] > GROWTH_SHARE * max(n_arr, 1)
    )
    units = float(meta.get("prefill_units", 1) or 1)
    pre = steps[steps["phase"] == "prefill"] if len(steps) else steps
    out["prefill_busy"] = _busy(pre, t0, t1) / (span * units) if span > 0 else math.nan
    out["decode_full"] = _decode_full(steps, meta, t0, t1)
    out["overloaded"] = overloaded
    out["bottleneck"] = ""
    if overloaded:
        stages = {
            "prefill": trend(grid, in_system(arr, pre_end, grid).astype(np.float64)),
            "kv_transfer": trend(grid, in_system(np.where(multi, pre_end, np.nan), kv_ready,
                                                 grid).astype(np.float64)),
            "decode": trend(grid, in_system(kv_ready, np.where(multi, first, np.nan),
                                            grid).astype(np.float64)),
        }
        stage = max(stages, key=stages.get)
        full = out["decode_full"] >= FULL  # False when unknown (NaN)
        if stage == "prefill":
            tier = ("prefill" if out["prefill_busy"] >= BUSY
                    else "decode" if full else "admission")
        elif stage == "kv_transfer":
            tier = "decode" if full else "kv_transfer"
        else:
            tier = "decode"
        out["bottleneck"] = tier
    return out


def slo_outcomes(sel: pd.DataFrame, end: float, slo_ttft: float,
                 slo_tpot: float) -> dict[str, np.ndarray]:
    """Each request of ``sel`` (one row per request) against the SLOs, as ``bool[n]`` masks:
    ``met`` (finished within both), ``miss_ttft`` / ``miss_tpot`` (missed that SLO, or is
    certain to: no first token yet after more than the TTFT SLO; still decoding with more
    than the TPOT SLO per token already spent on the tokens to come), ``censored`` (still
    unfinished at ``end`` with neither SLO decided: reported apart, never a miss) and
    ``decided`` (the rest)."""
    arr = sel["arrival_s"].to_numpy()
    first = sel["first_token_s"].to_numpy()
    fin = sel["finish_s"].to_numpy()
    out_tok = sel["output_tokens"].to_numpy().astype(np.float64)
    done = ~np.isnan(fin)
    has_first = ~np.isnan(first)
    ttft = np.where(has_first, first - arr, end - arr)  # a lower bound when not served
    miss_ttft = ttft > slo_ttft
    with np.errstate(invalid="ignore", divide="ignore"):
        spent = np.where(done, fin, end) - first
        tpot = np.where(out_tok > 1, spent / (out_tok - 1), np.nan)  # lower bound if running
    miss_tpot = has_first & (tpot > slo_tpot)
    met = done & ~miss_ttft & ~miss_tpot
    censored = ~done & ~miss_ttft & ~miss_tpot
    return {"met": met, "miss_ttft": miss_ttft, "miss_tpot": miss_tpot, "censored": censored,
            "decided": ~censored}


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%" if math.isfinite(x) else "-"


def verdict_text(s: Mapping[str, Any]) -> str:
    """One line from a summary ``s`` (`SimResult.summary`): the load verdict with the figures
    it rests on, then what goodput lost and to which SLO (when not overloaded, the median
    prompt of the TTFT misses against all: misses that do not come from load)."""
    lam = s["arrivals_per_s"]
    rates = (f"{lam:.3g} req/s arrived over the {s['arrival_window_s']:.4g} s of arrivals; "
             f"prefill completed {s['prefills_per_s']:.3g} req/s, first tokens "
             f"{s['first_tokens_per_s']:.3g} req/s")
    backlog = (f"requests waiting for a first token trended {s['backlog_growth_per_s']:+.3g} "
               f"req/s ({s['waiting_at_start']:,} -> {s['waiting_at_end']:,})")
    if s["overloaded"]:
        tier = s["bottleneck"]
        evidence = (f"prefill busy {_pct(s['prefill_busy'])} of the window, decode "
                    f"{_pct(s['decode_full'])} full")
        head = (f"OVERLOADED, bottleneck {TIERS.get(tier, tier)}: {rates}; {backlog}; "
                f"{evidence}: latencies grow with the run's length (lower the rate or add "
                f"{'prefill' if tier in ('prefill', 'admission') else 'decode'} units)")
    else:
        head = f"not overloaded: {rates}; {backlog}"
    g = s["goodput"]
    if not math.isfinite(g):
        return head
    misses = (f"goodput {g:.3f}: {_pct(s['ttft_miss_fraction'])} miss TTFT <= "
              f"{s['slo_ttft_s']:g} s")
    p50 = s.get("ttft_miss_input_p50", math.nan)
    if not s["overloaded"] and math.isfinite(p50) and s["ttft_miss_fraction"] > 0:
        misses += (f" (their prompts: median {p50:,.0f} tokens, against "
                   f"{s['input_p50']:,.0f} for all)")
    misses += f", {_pct(s['tpot_miss_fraction'])} miss TPOT <= {s['slo_tpot_s']:g} s"
    if s.get("censored", 0):
        misses += f"; {s['censored']:,} censored (undecided at the end, not counted)"
    return f"{head}. {misses}"
