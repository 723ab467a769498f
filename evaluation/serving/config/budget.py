"""Expert weight memory follows the slots a placement uses: a per-layer replica budget
(`solvers.policies.craft`) that leaves slots empty frees their expert weights for KV cache
(docs/solvers.md, "craft"); the spare HBM of ``dispatch="duplicate"``'s copies
(`DuplicateConfig.hbm_gb`) comes out of it (`with_duplicate_memory`)."""

from __future__ import annotations

import math
from dataclasses import replace

from eplb.errors import InputError
from eplb.evaluation.serving.config.cluster import ClusterConfig
from eplb.evaluation.serving.config.dispatch import check_dispatch
from eplb.evaluation.serving.config.model import ModelSpec, get_model
from eplb.placement import Placement
from eplb.solvers.primitives.replica_budget import expert_slots_per_gpu


def placement_expert_slots(placement: Placement) -> int:
    """Routed experts the fullest GPU of ``placement`` keeps, summed over its layers."""
    return expert_slots_per_gpu(placement.phy2log, placement.topology.slots_per_gpu)


def kv_capacity_for_slots(
    config: ClusterConfig, phase: str, expert_slots: int, num_layers: int
) -> int | None:
    """KV tokens per rank of ``config``'s ``phase`` unit when each GPU holds ``expert_slots``
    routed experts over ``num_layers`` placement layers (scaled to the model's MoE layers)
    instead of ``slots_per_gpu`` in every MoE layer: the unit's ``kv_capacity_tokens`` plus
    the tokens the freed expert weights (bytes, FP8) hold. ``None`` (unbounded) stays
    ``None``."""
    unit = config.unit(phase)
    if unit.kv_capacity_tokens is None:
        return None
    model = get_model(config.model)
    freed = freed_kv_tokens(model, unit.slots_per_gpu, expert_slots, num_layers, what=phase)
    return int(unit.kv_capacity_tokens + freed)


def freed_kv_tokens(
    model: ModelSpec, slots_per_gpu: int, expert_slots: int, num_layers: int, *, what: str = ""
) -> int:
    """KV tokens the expert weights a GPU does not keep would hold: ``slots_per_gpu`` slots in
    every MoE layer of ``model`` against ``expert_slots`` routed experts kept over
    ``num_layers`` placement layers (scaled to the model's MoE layers), FP8 weights over the
    KV bytes of a token in every layer. `InputError` if ``expert_slots`` is more than the
    slots hold (``what`` names the unit in the message)."""
    full = model.moe_layers * slots_per_gpu
    used = math.ceil(expert_slots * model.moe_layers / num_layers)
    if used > full:
        raise InputError(
            f"{expert_slots} expert slots per GPU over {num_layers} layers exceed the "
            f"{what + ' unit' if what else 'unit'}'s {slots_per_gpu} slots per GPU per layer"
        )
    freed = (full - used) * model.expert_bytes
    return int(freed // (model.kv_bytes_per_token * model.num_layers))


def with_placement_memory(config: ClusterConfig, phase: str, placement: Placement) -> ClusterConfig:
    """``config`` with the ``phase`` unit's KV capacity following the slots ``placement``
    uses (`kv_capacity_for_slots`); unchanged when every live slot is used."""
    alive = placement.topology.slot_alive
    if not (placement.phy2log[:, alive] < 0).any():
        return config
    cap = kv_capacity_for_slots(
        config, phase, placement_expert_slots(placement), placement.num_layers
    )
    unit = config.unit(phase)
    if cap == unit.kv_capacity_tokens:
        return config
    return config.replace(**{phase: replace(unit, kv_capacity_tokens=cap)})


def with_duplicate_memory(config: ClusterConfig) -> ClusterConfig:
    """``config`` with each unit's KV capacity less the tokens its dispatch policy's spare HBM
    per GPU would hold (`Dispatch.reserved_bytes`: ``duplicate.hbm_gb`` for the copies of
    ``dispatch="duplicate"``, none for the others); unchanged where nothing is reserved or the
    capacity is unbounded (None). `InputError` if nothing is left for KV cache."""
    spare = check_dispatch(config.dispatch).configure(hbm_gb=config.duplicate.hbm_gb)
    if not spare.reserved_bytes():
        return config
    model = get_model(config.model)
    per_token = model.kv_bytes_per_token * model.num_layers
    reserved = int(spare.reserved_bytes() // per_token)
    changes = {}
    for phase in ("prefill", "decode"):
        unit = config.unit(phase)
        if unit.kv_capacity_tokens is None or not reserved:
            continue
        cap = unit.kv_capacity_tokens - reserved
        if cap < 1:
            raise InputError(
                f"duplicate.hbm_gb = {config.duplicate.hbm_gb} GB leaves no KV cache on a "
                f"{phase} GPU ({unit.kv_capacity_tokens:,} tokens, {reserved:,} reserved): "
                "lower duplicate.hbm_gb"
            )
        changes[phase] = replace(unit, kv_capacity_tokens=cap)
    return config.replace(**changes) if changes else config
