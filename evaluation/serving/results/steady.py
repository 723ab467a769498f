"""`steady_state`: the throughput of one unit at a fixed batch, without queueing: every DP rank
runs the same batch step after step, one `step_time` gives the step and tokens/s per node (the
capacity-planning answer, with a real placement in the loop)."""

from __future__ import annotations

from typing import Any

from eplb.errors import InputError
from eplb.evaluation.serving.config import DEFAULT_TOKEN_BUDGET, ClusterConfig
from eplb.evaluation.serving.steptime import RankBatch, step_time
from eplb.evaluation.serving.steptime.batch import check_phase
from eplb.placement import Placement

DEFAULT_INPUT_TOKENS = 4096  # prompt length of DeepSeek's profile
DEFAULT_KV_TOKENS = 4096  # decode context of DeepSeek's profile


MAX_SIZE = 1e9  # tokens or requests per rank; far above any GPU's memory


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

    ``placement=None`` means perfectly balanced routing; ``load: float[L, E]`` is the expert
    load routed through ``placement``, scaled to the step's tokens. Returns a dict with
    ``step_s``, ``tok_s_per_node``, ``breakdown`` (seconds, sums to ``step_s``) and the inputs.
    """
    if not isinstance(config, ClusterConfig):
        raise InputError(f"config must be a ClusterConfig, got {type(config).__name__}")
    check_phase(phase)
    unit = config.unit(phase)
    G, gpn = unit.num_gpus, unit.gpus_per_node
    out: dict[str, Any] = {"phase": phase, "config": config.name, "nodes": unit.nodes, "gpus": G}
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
        b = batch if batch is not None else unit.max_running_requests
        if b is None:
            raise InputError(
                "give batch= (running requests per rank) or set "
                "decode.max_running_requests in the config"
            )
        b = _positive("batch", b)
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
        gpu_load_max_over_mean=float((st.gpu_load_max / st.gpu_load_mean).max()),
        balanced=placement is None,
    )
    return out
