"""The summary keys that comparisons, sweeps and capacity searches read, in one place: `row`
maps a `SimResult.summary` to them, so a renamed summary key is a one-line change here.
``goodput`` and ``served_fraction`` are passed on when the summary has them (NaN else)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["LATENCY", "SOURCE", "SWEEP", "row"]

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
}
LATENCY = ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "tpot_p90_s", "tpot_p99_s")
SWEEP = (*LATENCY, "goodput", "served_fraction", "output_tok_s_per_node")


def row(summary: Mapping[str, Any]) -> dict[str, float]:
    """The comparison metrics (`SOURCE`) of one summary; a key the summary lacks is NaN, except
    ``served_fraction``, which falls back to finished / arrived requests."""
    out = {name: float(summary.get(key, math.nan)) for name, key in SOURCE.items()}
    if math.isnan(out["served_fraction"]) and out["requests"] > 0:
        out["served_fraction"] = out["requests_finished"] / out["requests"]
    return out
