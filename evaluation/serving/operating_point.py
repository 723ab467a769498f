"""Where a serving run operates, per phase: tokens (prefill) or running requests (decode) per
rank per step, the context, and what bounded the decode batch (the KV cache, the running-request
cap, or the arrivals). Read from a simulation's frames (`measured`) or its output folder
(`from_run`, what `eplb advise --from-summary` takes); `describe` is the line each tool prints
(docs/advise.md, "Three answers to one question").

Every figure is a step-duration-weighted mean over the run's steps of the phase (a step that
lasts longer counts more, as the time the unit spends at that point)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from eplb.errors import InputError
from eplb.evaluation.serving.config import ClusterConfig

__all__ = ["KV_LIMITED", "describe", "from_run", "measured"]

KV_LIMITED = 0.9  # decode is KV-limited when its mean KV fill reaches this share of capacity
CAP_LIMITED = 0.9  # ... batch-capped when its mean batch reaches this share of the cap


def _wmean(x, w) -> float:
    x, w = np.asarray(x, dtype=np.float64), np.asarray(w, dtype=np.float64)
    return float(np.average(x, weights=w)) if x.size and w.sum() > 0 else math.nan


def measured(steps: pd.DataFrame, requests: pd.DataFrame, config) -> dict[str, dict[str, Any]]:
    """Per phase with steps, the operating point of a run (``steps``, ``requests``: a
    `SimResult`'s frames; ``config``: the `ClusterConfig` it ran):

    - prefill: ``per_rank`` tokens per rank per step, ``context_tokens`` the mean prompt
      (new + cached tokens) of the routed requests, ``budget_fill`` per_rank over the
      token budget;
    - decode: ``per_rank`` running requests per rank per step, ``context_tokens`` the mean
      context per running request, ``kv_fill`` the KV tokens per rank over the unit's KV
      capacity (NaN without one), ``cap_fill`` per_rank over ``max_running_requests``,
      ``bound``: ``"kv cache"`` (kv_fill >= `KV_LIMITED`), ``"max_running_requests"``
      (cap_fill >= `CAP_LIMITED`) or ``"arrivals"`` (neither: the batch is what arrives).
    """
    out: dict[str, dict[str, Any]] = {}
    routed = requests[requests["routed_s"].notna()] if len(requests) else requests
    for phase in ("prefill", "decode"):
        part = steps[steps["phase"] == phase] if len(steps) else steps
        if not len(part):
            continue
        unit = config.unit(phase)
        G = unit.num_gpus
        w = part["duration_s"].to_numpy()
        per_rank = _wmean(part["tokens" if phase == "prefill" else "requests"] / G, w)
        op: dict[str, Any] = {"phase": phase, "unit": "tokens" if phase == "prefill"
                              else "requests", "per_rank": per_rank, "steps": int(len(part)),
                              "gpus_per_unit": int(G)}
        if phase == "prefill":
            op["context_tokens"] = (float(routed["input_tokens"].mean()) if len(routed)
                                    else math.nan)
            budget = unit.token_budget
            op["budget_fill"] = per_rank / budget if budget else math.nan
        else:
            busy = part[part["requests"] > 0]
            op["context_tokens"] = _wmean(busy["kv_tokens"] / busy["requests"],
                                          busy["duration_s"]) if len(busy) else math.nan
            cap = unit.kv_capacity_tokens
            op["kv_fill"] = _wmean(part["kv_tokens"] / G / cap, w) if cap else math.nan
            mr = unit.max_running_requests
            op["cap_fill"] = per_rank / mr if mr else math.nan
            op["kv_capacity_tokens"] = int(cap) if cap else None
            op["max_running_requests"] = int(mr) if mr else None
            op["bound"] = ("kv cache" if op["kv_fill"] >= KV_LIMITED else
                           "max_running_requests" if op["cap_fill"] >= CAP_LIMITED else
                           "arrivals")
        out[phase] = op
    return out


def from_run(path: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """`measured` on a simulation's output folder (``eplb simulate -o DIR``: its
    ``steps.parquet``, ``requests.parquet`` and ``config.toml``), given as the folder or its
    ``summary.json``. `InputError` naming the missing file otherwise."""
    p = Path(path)
    folder = p.parent if p.name == "summary.json" or p.is_file() else p
    need = {n: folder / n for n in ("summary.json", "steps.parquet", "requests.parquet",
                                    "config.toml")}
    missing = [n for n, f in need.items() if not f.is_file()]
    if missing:
        raise InputError(f"--from-summary {path}: {', '.join(missing)} not found beside it; give "
                         "the folder `eplb simulate -o DIR` wrote (or its summary.json)")
    try:
        json.loads(need["summary.json"].read_text(encoding="utf-8"))
        steps = pd.read_parquet(need["steps.parquet"])
        requests = pd.read_parquet(need["requests.parquet"])
    except (OSError, ValueError) as exc:
        raise InputError(f"--from-summary {path}: cannot read the run's files ({exc})") from None
    config = ClusterConfig.load(need["config.toml"])
    ops = measured(steps, requests, config)
    for op in ops.values():
        op["source"] = f"measured by the simulation in {folder}"
    return ops


def describe(op: Mapping[str, Any]) -> str:
    """One line naming the operating point (`measured`'s dict for one phase)."""
    if op["phase"] == "prefill":
        fill = op.get("budget_fill", math.nan)
        return (f"prefill operating point: {op['per_rank']:,.0f} tokens per rank per step "
                f"({fill:.0%} of the token budget), prompts of {op['context_tokens']:,.0f} "
                "tokens on average")
    kv = op.get("kv_fill", math.nan)
    kv_text = f"KV cache {kv:.0%} full" if math.isfinite(kv) else "no KV capacity set"
    return (f"decode operating point: {op['per_rank']:,.1f} running requests per rank at "
            f"{op['context_tokens']:,.0f} tokens of context, {kv_text}; bound by "
            f"{op['bound']}" + ("" if op["bound"] != "arrivals" else
                               " (neither the KV cache nor the request cap is reached)"))
