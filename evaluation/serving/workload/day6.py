"""Day-6-like traffic: request mixes (`MIXES`) whose unbounded-cache prefix-hit rate, input /
output ratio and KV length per output token match DeepSeek's published day (`DAY6`):
``published``, or ``balanced_units`` (one prefill and one decode unit both at Day-6 per-node
load). `fit_mix` refits them; docs/serving.md, "Day-6-like traffic"."""

from __future__ import annotations

from typing import Any

import numpy as np

from eplb.errors import InputError
from eplb.evaluation.serving.workload.model import Workload
from eplb.evaluation.serving.workload.synth import synthesize

__all__ = ["DAY6", "MIXES", "THINK_S", "day6_workload", "fit_mix", "mix_stats"]

# published Day-6 statistics (deepseek-ai/open-infra-index, Day 6)
DAY6 = {
    "hit_rate": 342 / 608,
    "io_ratio": 608 / 168,
    "kv_per_output": 4989.0,
    "prefill_input_tok_s_per_node": 73_700.0,
    "decode_output_tok_s_per_node": 14_800.0,
    "output_tok_s_per_request": (20.0, 22.0),
}
FIXED = {
    "input_sigma": 1.0,
    "output_sigma": 1.0,
    "system_prompts": 8,
    "max_input_tokens": 131_072,
}
THINK_S = 30.0

# found by fit_mix (python scripts/simulate_day6.py --fit-workload: 20,000 requests, seed 0;
# published via sessions, balanced_units via system prompts of 1,536 tokens)
MIXES: dict[str, dict[str, Any]] = {
    "published": {
        "input_mean": 1030.3,
        "output_mean": 982.8,
        "output_sigma": 1.0,
        "session_prob": 0.4293,
        "system_prompt_tokens": 1024,
    },
    "balanced_units": {
        "input_mean": 1174.8,
        "output_mean": 2455.8,
        "output_sigma": 0.7695,
        "session_prob": 0.0,
        "system_prompt_tokens": 1536,
    },
}


def mix_stats(workload: Workload) -> dict[str, float]:
    """Prefix-hit rate (unbounded cache), input / output ratio, KV length per output token and
    mean lengths of ``workload``."""
    df = workload.requests
    inp = df["input_tokens"].to_numpy(dtype=np.float64)
    out = df["output_tokens"].to_numpy(dtype=np.float64)
    return {
        "hit_rate": workload.summary()["prefix_hit_rate"],
        "io_ratio": float(inp.sum() / out.sum()),
        "kv_per_output": float((out * (inp + (out + 1) / 2)).sum() / out.sum()),
        "input_mean": float(inp.mean()),
        "output_mean": float(out.mean()),
    }


def day6_workload(
    num_requests: int, rate: float, *, mix: str = "published", seed: int = 0, **overrides
) -> Workload:
    """``num_requests`` Poisson arrivals at ``rate`` req/s with the lengths and prefix sharing
    of ``MIXES[mix]`` (docs/serving.md, "Day-6-like traffic"); ``overrides`` go to
    `workload.synthesize`."""
    if mix not in MIXES:
        raise InputError(f"unknown Day-6 mix {mix!r}; use one of {', '.join(MIXES)}")
    kw = {**FIXED, **MIXES[mix], "open_sessions": max(32, int(round(rate * THINK_S)))}
    kw.update(overrides)
    wl = synthesize(num_requests, rate=rate, seed=seed, **kw)
    wl.meta["day6_mix"] = mix
    return wl


def fit_mix(
    io_ratio: float,
    *,
    via: str = "sessions",
    system_prompt_tokens: int = 1024,
    hit_rate: float = DAY6["hit_rate"],
    kv_per_output: float = DAY6["kv_per_output"],
    num_requests: int = 20_000,
    seed: int = 0,
    iterations: int = 10,
) -> dict[str, float]:
    """Generator parameters whose workload has ``hit_rate``, ``io_ratio`` and
    ``kv_per_output`` (fixed-point iteration on common random numbers).

    ``via="sessions"``: hits from multi-turn sessions (a turn's prompt holds the previous
    prompt and output): fits ``input_mean`` (new tokens per turn), ``output_mean`` and
    ``session_prob`` (`synthesize`'s bisection). ``via="system_prompts"``: single-turn requests
    whose hits are the shared system prompts of ``system_prompt_tokens``: fits
    ``input_mean``, ``output_mean`` and ``output_sigma`` (the KV length per output token grows
    with the spread of the output lengths).
    """
    if via not in ("sessions", "system_prompts"):
        raise InputError(f"via must be 'sessions' or 'system_prompts', got {via!r}")
    inp_mean, out_mean, out_sigma = 2000.0, 1000.0, FIXED["output_sigma"]
    params: dict[str, float] = {}
    for _ in range(iterations):
        kw = {**FIXED, "output_sigma": out_sigma, "system_prompt_tokens": system_prompt_tokens}
        if via == "sessions":
            kw["hit_rate"] = hit_rate
        else:
            kw["session_prob"] = 0.0
        wl = synthesize(
            num_requests,
            rate=1.0,
            seed=seed,
            input_mean=inp_mean,
            output_mean=out_mean,
            open_sessions=1024,
            **kw,
        )
        s = mix_stats(wl)
        o = s["output_mean"]
        if via == "sessions":
            # kv ~= I_w + c * O (I_w the output-weighted mean input): keep c, move O and I
            c = (s["kv_per_output"] - s["input_mean"]) / o
            o_target = kv_per_output / (io_ratio + c)
            i_target = io_ratio * o_target
        else:
            # hit = shared tokens / I: I from the hit rate, O from the ratio, sigma from kv
            shared = s["hit_rate"] * s["input_mean"]
            i_target = shared / hit_rate
            o_target = i_target / io_ratio
            c_now = (s["kv_per_output"] - s["input_mean"]) / o  # ~ (1 + cv^2) / 2 + I_w excess
            c_want = (kv_per_output - i_target) / o_target
            cv2 = max(np.exp(out_sigma**2) - 1 + 2 * (c_want - c_now), 1e-3)
            out_sigma = float(np.sqrt(np.log1p(cv2)))
            # new tokens move the input mean one for one
            inp_mean = max(inp_mean + (i_target - s["input_mean"]), 1.0)
        out_mean *= o_target / o
        if via == "sessions":
            inp_mean *= i_target / s["input_mean"]
        params = {
            "input_mean": round(inp_mean, 1),
            "output_mean": round(out_mean, 1),
            "output_sigma": round(out_sigma, 4),
            "session_prob": round(wl.meta["generator"]["session_prob"], 4),
            "system_prompt_tokens": system_prompt_tokens,
        }
    return params
