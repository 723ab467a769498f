"""The summary keys that comparisons, sweeps and capacity searches read, in one place: `row`
maps a `SimResult.summary` to them, so a renamed summary key is a one-line change here.
``goodput`` and ``served_fraction`` are passed on when the summary has them (NaN else);
`FRACTIONS` names each fraction of requests with the count it is a fraction of (for its
interval, `intervals.proportion_ci`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["FRACTIONS", "LATENCY", "SOURCE", "SWEEP", "TEXT", "row"]

# name used by comparisons -> key of SimResult.summary() it is read from
SOURCE: dict[str, str] = {
    "ttft_p50_s": "ttft_p50_s",
    "ttft_p90_s": "ttft_p90_s",
    "ttft_p99_s": "ttft_p99_s",
    "tpot_p50_s": "tpot_p50_s",
    "tpot_p90_s": "tpot_p90_s",
    "tpot_p99_s": "tpot_p99_s",
    "input_tok_s_per_node": "input_tok_s_per_node",
    "output_tok_s_per_node": "output_tok_s_per_node",
    "goodput": "goodput",
    "served_fraction": "served_fraction",
    "prefill_step_s": "prefill_step_s",
    "decode_step_s": "decode_step_s",
    "requests": "requests",
    "requests_finished": "requests_finished",
    "requests_decided": "requests_decided",
    "censored": "censored",
    "overloaded": "overloaded",
    "bottleneck": "bottleneck",
}
LATENCY = ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "tpot_p90_s", "tpot_p99_s")
SWEEP = (*LATENCY, "goodput", "served_fraction", "overloaded", "output_tok_s_per_node")
TEXT = ("bottleneck",)  # passed on as text, not a number
# a fraction of requests -> the column counting the requests it is a fraction of
FRACTIONS = {"goodput": "requests_decided", "served_fraction": "requests"}


def row(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The comparison metrics (`SOURCE`) of one summary as floats (``overloaded`` 1.0 / 0.0;
    `TEXT` keys as text, "" when absent); a key the summary lacks is NaN, except
    ``served_fraction``, which falls back to finished / arrived requests, and
    ``requests_decided``, which falls back to the requests."""
    out: dict[str, Any] = {}
    for name, key in SOURCE.items():
        value = summary.get(key, "" if name in TEXT else math.nan)
        out[name] = str(value) if name in TEXT else float(value)
    if math.isnan(out["served_fraction"]) and out["requests"] > 0:
        out["served_fraction"] = out["requests_finished"] / out["requests"]
    if math.isnan(out["requests_decided"]):
        out["requests_decided"] = out["requests"]
    return out
