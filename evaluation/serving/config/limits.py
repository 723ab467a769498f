"""Bounds on the work a simulation implies, checked before it starts.

A config or workload whose implied work is unbounded in practice (a rebalance every
nanosecond, a KV transfer at 1e-12 GB/s, 30 requests at 1e-9 req/s spanning a thousand years,
a utilisation bucket of a picosecond, 1e18 units) would run for days or exhaust memory; these
checks refuse it with the number it implies and the limit. `check_config` runs in
`ClusterConfig.validate`, `check_work` in `simulate`'s argument checks.
"""

from __future__ import annotations

import math

from eplb.errors import InputError
from eplb.evaluation.serving.config.schema import EplbMode
from eplb.safeload import check_size

MAX_SIM_S = 1e7  # simulated seconds one run may span (about 116 days)
MAX_OP_S = 86_400.0  # one KV transfer, prompt load or weight migration: at most a simulated day
MAX_REBALANCES = 100_000  # rebalances one run may imply (each one solves a placement)
MAX_GPUS = 100_000  # GPUs in all units together
MIN_SPAN_S = 60.0  # the least simulated time a run is assumed to cover when counting events
MAX_DRAFT_TOKENS = 64  # MTP / speculative drafts per request per step (DeepSeek's MTP: 1)
# the utilisation record as float64[buckets, ranks], and its long table (time, rank, value)
# with pandas' intermediates when utilisation.parquet is written: about 5 copies
UTILISATION_BYTES = 40


def _finite(name: str, value: float, limit: float, unit: str = "s") -> None:
    if not math.isfinite(value) or value > limit:
        raise InputError(f"{name} = {value:g} {unit} is over the limit of {limit:g} {unit}; "
                         "give a finite, smaller value")


def check_config(config) -> None:
    """Refuse a `ClusterConfig` whose single operations take unbounded simulated time."""
    model = config.model_spec
    gpus = 0
    for phase in ("prefill", "decode"):
        unit = config.unit(phase)
        gpus += unit.count * unit.num_gpus
    if gpus > MAX_GPUS:
        raise InputError(f"the config has {gpus:,} GPUs in all (count x nodes x gpus_per_node "
                         f"of prefill and decode), over the limit of {MAX_GPUS:,}; use fewer "
                         "units")
    drafts = config.unit("decode").mtp_draft_tokens
    if drafts > MAX_DRAFT_TOKENS:  # each step sums and draws over every draft position
        raise InputError(f"decode.mtp_draft_tokens = {drafts:,} is over the limit of "
                         f"{MAX_DRAFT_TOKENS} draft tokens per request per step (DeepSeek's "
                         "MTP drafts 1; speculative decoders a few); use fewer")
    for phase in ("prefill", "decode"):  # each phase's policy ([eplb] with its own table)
        eplb, at = config.eplb_for(phase), lambda key, ph=phase: config.eplb_path(ph, key)
        _finite(at("history_s"), float(eplb.history_s), MAX_SIM_S)
        _finite(at("rebalance_interval_s"), float(eplb.rebalance_interval_s), MAX_SIM_S)
        # bytes per GPU if every slot moves
        moved = config.unit(phase).slots_per_gpu * model.moe_layers * model.expert_bytes
        worst = moved / (float(eplb.migration_gbps) * 1e9)
        if worst > MAX_OP_S:
            raise InputError(
                f"{at('migration_gbps')} = {eplb.migration_gbps:g} GB/s makes one rebalance's "
                f"weight migration take up to {worst:.3g} simulated s, over the limit of "
                f"{MAX_OP_S:g} s; use at least {moved / MAX_OP_S / 1e9:.3g} GB/s"
            )


def check_work(config, workload, duration_s: float | None, bucket_s: float) -> None:
    """Refuse a run whose implied simulated span, rebalances, transfers or utilisation record
    are over the limits (the number and the limit in the message)."""
    arrivals = workload.requests["arrival_s"].to_numpy(dtype=float)
    span = float(arrivals.max() - min(0.0, arrivals.min())) if len(arrivals) else 0.0
    if duration_s is None and span > MAX_SIM_S:
        rate = len(arrivals) / span if span > 0 else math.inf
        raise InputError(
            f"the workload spans {span:.3g} simulated s ({len(arrivals):,} requests at "
            f"{rate:.3g} req/s), over the limit of {MAX_SIM_S:g} s; raise --rate (rate=) or "
            "stop earlier with --duration (duration_s=)"
        )
    horizon = max(min(span, duration_s) if duration_s is not None else span, MIN_SPAN_S)
    if duration_s is not None and duration_s > MAX_SIM_S:
        _finite("duration_s", float(duration_s), MAX_SIM_S)
    for phase in ("prefill", "decode"):
        eplb = config.eplb_for(phase)
        rebalances = horizon / float(eplb.rebalance_interval_s)
        if eplb.mode is not EplbMode.STATIC and rebalances > MAX_REBALANCES:
            raise InputError(
                f"{config.eplb_path(phase, 'rebalance_interval_s')} = "
                f"{eplb.rebalance_interval_s:g} s implies {rebalances:.3g} rebalances over "
                f"{horizon:.3g} simulated s, over the limit of {MAX_REBALANCES:,}; use at least "
                f"{horizon / MAX_REBALANCES:.3g} s"
            )
    model = config.model_spec
    tokens = float(workload.requests["input_tokens"].max())
    kv_bytes = tokens * model.kv_bytes_per_token * model.num_layers
    for name, gbps in (("kv.transfer_gbps", config.kv.transfer_gbps),
                       ("kv.store_load_gbps", config.kv.store_load_gbps)):
        seconds = kv_bytes / (float(gbps) * 1e9)
        if seconds > MAX_OP_S:
            raise InputError(
                f"{name} = {gbps:g} GB/s makes the KV cache of the longest prompt "
                f"({tokens:,.0f} tokens) take {seconds:.3g} simulated s to move, over the "
                f"limit of {MAX_OP_S:g} s; use at least "
                f"{kv_bytes / MAX_OP_S / 1e9:.3g} GB/s"
            )
    buckets = math.ceil((horizon + MAX_OP_S) / float(bucket_s))
    ranks = sum(config.unit(p).count * config.unit(p).num_gpus for p in ("prefill", "decode"))
    check_size(f"bucket_s = {bucket_s:g} s: the utilisation record of {ranks:,} ranks (with its "
               "table)", (buckets, ranks), UTILISATION_BYTES,
               fix="use a coarser bucket_s or fewer GPUs")
