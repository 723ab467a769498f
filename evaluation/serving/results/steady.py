"""`steady_state`: the throughput of one unit at a fixed batch, without queueing: every DP rank
runs the same batch step after step, one `step_time` gives the step and tokens/s per node (the
capacity-planning answer, with a real placement in the loop)."""

from __future__ import annotations

from typing import Any

import numpy as np

from eplb.errors import InputError
from eplb.evaluation.serving.config import DEFAULT_TOKEN_BUDGET, ClusterConfig
from eplb.evaluation.serving.config.budget import with_duplicate_memory, with_placement_memory
from eplb.evaluation.serving.results.mix import (
    LengthMix,
    decode_batches,
    prefill_batches,
    prefill_ttft,
)
from eplb.evaluation.serving.steptime import RankBatch, kernels, step_time
from eplb.evaluation.serving.steptime.batch import check_phase
from eplb.evaluation.serving.steptime.chunking import pairs_per_token
from eplb.placement import Placement

DEFAULT_INPUT_TOKENS = 4096  # prompt length of DeepSeek's profile
DEFAULT_KV_TOKENS = 4096  # decode context of DeepSeek's profile


MAX_SIZE = 1e9  # tokens or requests per rank; far above any GPU's memory


def _decode_batch(unit, batch) -> float:
    """Running requests per decode rank: ``batch``, else the unit's ``max_running_requests``
    (one of them must be given), checked > 0."""
    b = batch if batch is not None else unit.max_running_requests
    if b is None:
        raise InputError(
            "give batch= (running requests per rank) or set "
            "decode.max_running_requests in the config"
        )
    return _positive("batch", b)


def _positive(name: str, value, *, integer: bool = True, zero: bool = False):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if integer:
        ok = ok and float(value).is_integer()
    if ok and not value <= MAX_SIZE:
        raise InputError(f"{name} {value:g} is over the limit of {MAX_SIZE:g} (tokens or "
                         "requests per rank); give a realistic size")
    if not ok or value < 0 or (value == 0 and not zero):
        raise InputError(
            f"{name} must be a {'non-negative' if zero else 'positive'} "
            f"{'integer' if integer else 'number'}, got {value!r}"
        )
    return value


def steady_state(
    config: ClusterConfig,
    phase: str,
    *,
    input_tokens: int | None = None,
    kv_tokens: int | None = None,
    batch: int | None = None,
    placement: Placement | None = None,
    load=None,
    mix=None,
    steps: int = 24,
    seed: int = 0,
) -> dict[str, Any]:
    """Steady-state step time and tokens/s per node of one ``config`` unit.

    - Prefill: prompts of ``input_tokens`` new tokens (default 4096) after ``kv_tokens``
      cached ones (default 0) fill each rank's token budget (``batch`` tokens per rank, default
      the unit's ``token_budget``, else 16,384); chunked prefill, so a token attends on
      average to ``kv_tokens + (input_tokens + 1) / 2`` keys. ``tok_s_per_node`` counts
      computed tokens, ``input_tok_s_per_node`` cached ones too.
    - Decode: ``batch`` running requests per rank (default the unit's
      ``max_running_requests``) at ``kv_tokens`` context each (default 4096), with the unit's
      MTP drafts; ``tok_s_per_node`` counts output tokens (accepted drafts included),
      ``tpot_s`` is the time per output token of one request.

    - ``mix``: a `Workload` (or `results.mix.LengthMix`) whose length mix replaces the fixed
      lengths: ``steps`` seeded batches of a saturated unit (`results.mix`: prefill, per-rank
      queues of prompts drawn from the mix, cache hits replayed with the config's store;
      decode, requests drawn by output length at a uniform point of their generation), so
      the DP imbalance the mix causes is in the step; decode's default batch is capped by
      the KV capacity at the mix's mean context. Adds ``requests_per_s`` (the unit's
      prompts or completions per second), ``dp_imbalance`` (mean step over the mean step
      with every rank at the step's mean work) and ``step_s_p90``; ``step_s`` and
      ``breakdown`` are means over the steps.

    ``curves``: what the kernel figures rest on (`steptime.kernels.labels`: ``measured``,
    ``calibrated`` or ``roofline``). ``placement=None`` means perfectly balanced routing;
    ``load: float[L, E]`` is the expert
    load routed through ``placement``, scaled to the step's tokens. A placement with empty
    slots on live GPUs (a replica budget, ``craft``) frees their expert weights: the unit's
    KV capacity grows by what they hold (`config.budget.with_placement_memory`); under
    ``dispatch="duplicate"`` it shrinks by the copies' spare HBM (`with_duplicate_memory`).
    Returns a dict with ``step_s``, ``tok_s_per_node``, ``breakdown`` (seconds, sums to
    ``step_s``) and the inputs.
    """
    if not isinstance(config, ClusterConfig):
        raise InputError(f"config must be a ClusterConfig, got {type(config).__name__}")
    check_phase(phase)
    if placement is not None:  # empty slots (a replica budget) free memory for KV cache
        config = with_placement_memory(config, phase, placement)
    config = with_duplicate_memory(config)  # duplication's copies take their HBM from it
    unit = config.unit(phase)
    G, gpn = unit.num_gpus, unit.gpus_per_node
    out: dict[str, Any] = {"phase": phase, "config": config.name, "nodes": unit.nodes, "gpus": G}
    if mix is not None:
        return _steady_mix(config, phase, mix, batch, placement, load, steps, seed, out)
    if phase == "prefill":
        n = _positive(
            "input_tokens", DEFAULT_INPUT_TOKENS if input_tokens is None else input_tokens
        )
        cached = _positive("kv_tokens", 0 if kv_tokens is None else kv_tokens, zero=True)
        per_rank = _positive(
            "batch", batch if batch is not None else unit.token_budget or DEFAULT_TOKEN_BUDGET
        )
        rb = RankBatch.uniform("prefill", G, tokens=per_rank, context=n, cached=cached)
        st = step_time("prefill", rb, placement, load, config=config)
        tok_s = gpn * per_rank / st.total_s
        out.update(
            input_tokens=n,
            cached_tokens=cached,
            tokens_per_rank=per_rank,
            tok_s_per_node=tok_s,
            input_tok_s_per_node=tok_s * (n + cached) / n,
        )
    else:
        b = _decode_batch(unit, batch)
        kv = _positive("kv_tokens", DEFAULT_KV_TOKENS if kv_tokens is None else kv_tokens)
        if input_tokens is not None:
            raise InputError("decode takes kv_tokens= (context per request), not input_tokens")
        q = 1 + unit.mtp_draft_tokens
        accepted = 1 + unit.mtp_draft_tokens * unit.mtp_acceptance
        rb = RankBatch.uniform("decode", G, tokens=b, context=kv, query_tokens=q)
        st = step_time("decode", rb, placement, load, config=config)
        out.update(
            batch=b,
            kv_tokens=kv,
            query_tokens_per_request=q,
            tokens_per_request_step=accepted,
            tok_s_per_node=gpn * b * accepted / st.total_s,
            tpot_s=st.total_s / accepted,
        )
        if unit.kv_capacity_tokens:
            out["kv_usage"] = b * kv / unit.kv_capacity_tokens
    out.update(
        step_s=st.total_s,
        breakdown=dict(st.breakdown),
        curves=kernels.labels(config.hardware_spec, config.model_spec),
        gpu_load_max_over_mean=float((st.gpu_load_max / st.gpu_load_mean).max()),
        balanced=placement is None,
    )
    return out


def _chunking(config: ClusterConfig) -> tuple[str, float]:
    """The config's prefill chunking mode and its ``K`` (`steptime.chunking`, as the simulator's
    prefill units take them: balanced steps of the config's prefill unit)."""
    mode = config.scheduler.prefill_chunking
    if mode == "tokens":
        return mode, 0.0
    K = pairs_per_token(
        lambda b: step_time("prefill", b, config=config).total_s, config.prefill.num_gpus
    )
    return mode, K


def _steady_mix(config, phase, mix, batch, placement, load, steps, seed, out) -> dict[str, Any]:
    """`steady_state` over ``steps`` sampled batches of a length mix (`results.mix`)."""
    _positive("steps", steps)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise InputError(f"seed must be an integer, got {seed!r}")
    unit = config.unit(phase)
    G, gpn = unit.num_gpus, unit.gpus_per_node
    lengths = LengthMix.of(mix, config.kv.store_capacity_blocks)
    if phase == "prefill":
        per_rank = _positive(
            "batch", batch if batch is not None else unit.token_budget or DEFAULT_TOKEN_BUDGET
        )
        mode, K = _chunking(config)
        batches = prefill_batches(
            lengths, G, per_rank, steps, warmup=4, seed=seed, K=K, chunking=mode,
            admission=config.scheduler.prefill_admission,
        )
    else:
        b = _decode_batch(unit, batch)
        if batch is None and unit.kv_capacity_tokens:  # as many as the KV cache holds
            w = lengths.output_tokens.astype(np.float64)
            ctx = float((w * (lengths.input_tokens + w / 2)).sum() / max(w.sum(), 1.0))
            b = max(1, min(b, int(unit.kv_capacity_tokens // ctx)))
        q = 1 + unit.mtp_draft_tokens
        batches = decode_batches(lengths, G, b, steps, q, seed)
    times, means, parts = [], [], []
    for rb in batches:  # step_time(config=...): the config's cached StepModel
        st = step_time(phase, rb, placement, load, config=config)
        times.append(st.total_s)
        parts.append(st.breakdown)
        means.append(step_time(phase, rb.mean(), placement, load, config=config).total_s)
    times_a = np.asarray(times)
    step_s = float(times_a.mean())
    breakdown = {k: float(np.mean([p[k] for p in parts])) for k in parts[0]}
    if phase == "prefill":
        tokens = float(np.mean([rb.tokens.sum() for rb in batches]))  # = G x budget
        new_mean = float(lengths.new_tokens.mean())
        out.update(
            tokens_per_rank=per_rank,
            tok_s_per_node=tokens / G * gpn / step_s,
            input_tok_s_per_node=tokens
            / G
            * gpn
            / step_s
            * float(lengths.input_tokens.mean())
            / new_mean,
            requests_per_s=tokens / step_s / new_mean,
            mean_new_tokens=new_mean,
            mean_cached_tokens=float(lengths.cached_tokens.mean()),
        )
    else:
        accepted = 1 + unit.mtp_draft_tokens * unit.mtp_acceptance
        out_mean = float(lengths.output_tokens.mean())
        out.update(
            batch=b,
            kv_tokens=float(np.mean([rb.kv_tokens.sum() for rb in batches])) / (G * b),
            tokens_per_request_step=accepted,
            tok_s_per_node=gpn * b * accepted / step_s,
            tpot_s=step_s / accepted,
            requests_per_s=G * b * accepted / step_s / out_mean,
        )
        if unit.kv_capacity_tokens:
            out["kv_usage"] = out["kv_tokens"] * b / unit.kv_capacity_tokens
    out.update(
        step_s=step_s,
        step_s_p90=float(np.quantile(times_a, 0.9)),
        dp_imbalance=step_s / float(np.mean(means)),
        breakdown=breakdown,
        curves=kernels.labels(config.hardware_spec, config.model_spec),
        balanced=placement is None,
        mix=True,
        steps=int(steps),
        seed=seed,
    )
    return out


MAX_HORIZON_S = 86_400.0  # slo_rate's arrivals span at most a day (bounded work)
MAX_PROMPTS = 1_000_000  # slo_rate's measured + warm-up arrivals at most (bounded work)


def slo_rate(
    config: ClusterConfig,
    mix,
    *,
    goodput: float = 0.9,
    prompts: int = 400,
    seed: int = 0,
    iterations: int = 8,
    duration_s: float = 600.0,
    warmup_s: float = 120.0,
    warmup_prompts: int = 0,
) -> dict[str, Any]:
    """The highest arrival rate (req/s, whole cluster) at which a steady-state estimate meets
    ``goodput`` of requests within the config's SLO on the length mix ``mix`` (a `Workload`).

    Prefill: `results.mix.prefill_ttft` (a step-level queue of one prefill unit, each unit
    taking ``1 / count`` of the arrivals); the share of ``prompts`` whose prefill ends within
    ``slo.ttft_s``, over the arrivals of ``duration_s`` seconds (at least ``prompts``) after
    a warm-up of ``warmup_s`` seconds' arrivals (at least ``warmup_prompts``): a queue near
    capacity builds up over minutes, so a short horizon (formerly one minute) calls rates
    servable that a simulation of the same window overloads (at most `MAX_PROMPTS` measured).
    Decode: the running requests per GPU that Little's law gives at the rate
    (fixed point with the step time, capped by the KV capacity), TPOT against ``slo.tpot_s``.
    Estimated goodput = prefill share x (TPOT met); bisection over ``iterations`` halvings up
    to `steady_state`'s capacity. Returns ``rate_rps`` (0 when even 1% of capacity misses),
    ``capacity_rps`` and the estimate at the rate found.
    """
    _positive("duration_s", duration_s, integer=False)
    _positive("warmup_s", warmup_s, integer=False, zero=True)
    _positive("prompts", prompts)
    _positive("warmup_prompts", warmup_prompts, zero=True)
    if prompts + warmup_prompts > MAX_PROMPTS:
        raise InputError(
            f"prompts + warmup_prompts = {prompts + warmup_prompts:g} is over the limit of "
            f"{MAX_PROMPTS:g}; give fewer"
        )
    if duration_s + warmup_s > MAX_HORIZON_S:
        raise InputError(
            f"duration_s + warmup_s = {duration_s + warmup_s:g} s is over the limit of "
            f"{MAX_HORIZON_S:g} s; give a horizon of hours at most"
        )
    lengths = LengthMix.of(mix, config.kv.store_capacity_blocks)
    pre = steady_state(config, "prefill", mix=mix, seed=seed)
    dec = steady_state(config, "decode", mix=mix, seed=seed)
    cap = min(
        config.prefill.count * pre["requests_per_s"], config.decode.count * dec["requests_per_s"]
    )
    unit_p, unit_d = config.prefill, config.decode
    budget = unit_p.token_budget or DEFAULT_TOKEN_BUDGET

    def step_s(rb: RankBatch) -> float:
        return step_time("prefill", rb, config=config).total_s

    mode, K = _chunking(config)
    accepted = 1 + unit_d.mtp_draft_tokens * unit_d.mtp_acceptance
    out_mean = float(lengths.output_tokens.mean())
    b_max = dec["batch"]

    def estimate(rate: float) -> dict[str, float]:
        per_unit = rate / unit_p.count
        skip = max(int(per_unit * warmup_s), warmup_prompts)  # the warm-up's arrivals
        n = skip + min(max(prompts, int(np.ceil(per_unit * duration_s))), MAX_PROMPTS)
        ttft = prefill_ttft(
            lengths, step_s, unit_p.num_gpus, budget, per_unit, n, seed, K=K, chunking=mode
        )
        ttft = ttft[skip:]  # after warm-up
        share = float(np.mean(ttft <= config.slo.ttft_s))
        step = dec["step_s"]
        b = b_max
        for _ in range(6):  # Little: running = arrivals per GPU x steps per request x step
            b = rate / (unit_d.count * unit_d.num_gpus) * out_mean / accepted * step
            b = max(1, min(b_max, int(np.ceil(b))))
            step = steady_state(config, "decode", mix=mix, batch=b, steps=8, seed=seed)["step_s"]
        tpot = step / accepted
        ok = tpot <= config.slo.tpot_s
        return {
            "rate_rps": rate,
            "prefill_share": share,
            "tpot_s": tpot,
            "goodput": share * float(ok),
            "decode_batch": b,
        }

    lo, hi = 0.01 * cap, cap
    best = estimate(lo)
    if best["goodput"] < goodput:
        return {"rate_rps": 0.0, "capacity_rps": cap, "at_lowest": best}
    top = estimate(hi)
    if top["goodput"] >= goodput:
        return {"rate_rps": hi, "capacity_rps": cap, "estimate": top}
    for _ in range(iterations):
        mid = (lo * hi) ** 0.5
        e = estimate(mid)
        if e["goodput"] >= goodput:
            lo, best = mid, e
        else:
            hi = mid
    return {"rate_rps": lo, "capacity_rps": cap, "estimate": best}
