"""Cited cluster presets: DeepSeek's Day-6 deployment and SGLang's 96 x H100 one, each field
with its public source (the hardware and model presets are `config.hardware`, `config.model`).
Each preset is the keyword arguments of a `ClusterConfig` (`ClusterConfig.deepseek_day6()`)."""

from __future__ import annotations

from typing import Any

from eplb.errors import InputError
from eplb.evaluation.serving.config.hardware import Hardware, get_hardware
from eplb.evaluation.serving.config.model import ModelSpec, get_model
from eplb.evaluation.serving.config.schema import (
    DEFAULT_TOKEN_BUDGET,
    EplbConfig,
    KVConfig,
    RoutingConfig,
    SLOConfig,
    UnitConfig,
)

PRESETS = ("deepseek_day6", "sglang_96xh100")


def deepseek_day6() -> dict[str, Any]:
    """DeepSeek-V3/R1 serving as published on Day 6 (open-infra-index, 2025-03-01), H800.

    Prefill units of 4 nodes (EP32, DP32) and decode units of 18 nodes (EP144, DP144),
    both with 32 redundant experts (288 slots); DeepSeek's own DP balancers (Day 6 describes
    the objectives, `balancers.deepseek`), the prefill one deciding on arrival
    (``scheduler.prefill_admission = "rank_queues"``); DBO in prefill (16,384 tokens per rank,
    as in DeepSeek's profile), 5-stage pipeline in decode (128 requests per rank as in the
    profile). One unit of each: Day-6's fleet averaged 226.75 nodes, about 24 prefill
    and 7 decode units of these sizes [derived in serving-facts.md]; set ``count``.
    Assumptions (not published): ``even`` dispatch, one MTP draft token accepted with
    0.85 (DeepSeek-V3 report: 85-90%), rebalancing every 10 minutes from the last 10
    (starting from a placement solved on the 10 minutes before, as a running service has),
    an unbounded on-disk store read at 40 GiB/s per node (3FS README), SLOs of 5 s TTFT and
    50 ms TPOT (Day-6's 20-22 tok/s per user). The TTFT SLO follows the batching, which is
    DeepSeek's (profile-data README: 16K tokens per GPU) and SGLang's at the same scale
    (``--chunked-prefill-size 524288`` over 32 ranks; its blog measured TTFT 2-5 s): a full
    16,384-token step takes ~2.2 s, so a request arriving during one waits for it and then
    runs in the next; 2 s cannot be met near capacity, 5 s can (docs/serving.md, "Presets";
    tests/test_serving_latency.py checks the SLO against two full steps and one decode step).
    """
    hw = get_hardware("h800")
    model = get_model("deepseek_v3")
    return dict(
        model="deepseek_v3",
        hardware="h800",
        prefill=UnitConfig(
            nodes=4,
            slots_per_layer=288,
            token_budget=DEFAULT_TOKEN_BUDGET,
            balancer="deepseek_prefill",
        ),
        decode=UnitConfig(
            nodes=18,
            slots_per_layer=288,
            max_running_requests=128,
            kv_capacity_tokens=kv_capacity_tokens(model, hw, 2),
            mtp_draft_tokens=1,
            mtp_acceptance=0.85,
            balancer="deepseek_decode",
        ),
        dispatch="even",
        eplb=EplbConfig(
            solver="deepseek",
            rebalance_interval_s=600.0,
            history_s=600.0,
            initial="history",
        ),
        kv=KVConfig(store_capacity_blocks=None, store_load_gbps=42.9),
        slo=SLOConfig(ttft_s=5.0, tpot_s=0.05),
        routing=RoutingConfig(source="calibrated"),
        name="deepseek_day6",
    )


def sglang_96xh100() -> dict[str, Any]:
    """SGLang's large-scale EP deployment of DeepSeek-V3 on H100 (LMSYS blog, 2025-05-05;
    commands in sgl-project/sglang#6017).

    Prefill: 4 nodes, EP32, 16,384 tokens per rank, two-batch overlap; decode: 9 nodes,
    EP72, up to 256 running requests per rank (``--cuda-graph-bs 256``); both with
    ``--ep-num-redundant-experts 32`` (288 slots: 9 per GPU in prefill, 4 in decode; the
    decode command of #6017 and a user's copy of its prefill command), DeepSeek's EPLB
    algorithm, KV capacity from ``--mem-fraction-static 0.846`` (#6017 decode command). DP
    routing: SGLang's default ``round_robin`` load-balance method, which in a PD prefill server
    sends a request to DP rank ``bootstrap_room % dp_size`` with the router's room drawn
    uniformly at random (sglang v0.4.6.post5, ``managers/data_parallel_controller.py``,
    ``round_robin_scheduler``; ``follow_bootstrap_room`` in v0.5.23): ``random`` in prefill,
    decided on arrival (``scheduler.prefill_admission = "rank_queues"``); ``round_robin`` in
    decode (v0.5.23's PD decode default; v0.4.6.post5 followed the room there too). Dispatch
    ``random`` as in that prefill command (the blog does not say; ``even`` and ``random`` have
    the same counts-mode expectation). The blog's 12 nodes ran the phases separately; one unit
    of each is 13 nodes. No prefix cache: the deployment's prefill command runs
    ``--disable-radix-cache`` (a user's copy of it in sgl-project/sglang#9787) and names no
    external KV store, so a workload's shared prefixes are recomputed (0 hits, by design); set
    ``kv.gpu_cache_blocks`` / a store to model SGLang with its radix cache or HiCache on.
    """
    hw = get_hardware("h100")
    model = get_model("deepseek_v3")
    return dict(
        model="deepseek_v3",
        hardware="h100",
        prefill=UnitConfig(
            nodes=4,
            slots_per_layer=288,
            token_budget=DEFAULT_TOKEN_BUDGET,
            balancer="random",
        ),
        decode=UnitConfig(
            nodes=9,
            slots_per_layer=288,
            max_running_requests=256,
            kv_capacity_tokens=kv_capacity_tokens(model, hw, 4, memory_fraction=0.846),
            balancer="round_robin",
        ),
        dispatch="random",
        eplb=EplbConfig(solver="deepseek"),
        kv=KVConfig(store_capacity_blocks=0, gpu_cache_blocks=0),
        slo=SLOConfig(ttft_s=5.0, tpot_s=0.1),
        routing=RoutingConfig(source="calibrated"),
        name="sglang_96xh100",
    )


def kv_capacity_tokens(
    model: ModelSpec, hardware: Hardware, slots_per_gpu: int, *, memory_fraction: float = 0.85
) -> int:
    """Tokens of KV cache one rank holds: ``memory_fraction`` of HBM minus the weights it
    keeps (`ModelSpec.weight_bytes_per_gpu`), over the KV bytes of a token in every layer."""
    free = hardware.hbm_gb * 1e9 * memory_fraction - model.weight_bytes_per_gpu(slots_per_gpu)
    if free <= 0:
        raise InputError(
            f"{model.name}'s weights do not fit {hardware.name} with "
            f"{slots_per_gpu} experts per GPU"
        )
    return int(free // (model.kv_bytes_per_token * model.num_layers))
