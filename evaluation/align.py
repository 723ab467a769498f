"""Matching a placement to a trace: same experts, and rows for every layer the trace holds.

A placement may cover more layers than a trace (an SGLang map has a row for every model layer,
dense ones included); `align` keeps the rows of the trace's layers, in the trace's order. A vLLM
mapping file is keyed by MoE-layer index: `moe_rows` (which `align` calls) maps index i to the
trace's i-th MoE layer.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from eplb.args import as_int_array, check_opt_int, check_type
from eplb.errors import InputError, PlacementError, TraceError
from eplb.io import MOE_INDEX
from eplb.placement import Placement
from eplb.traces.model import Trace


def _ids(ids: np.ndarray, limit: int = 8) -> str:
    ids = [int(i) for i in ids]
    text = ", ".join(map(str, ids[:limit]))
    return text + (f", ... ({len(ids)} in all)" if len(ids) > limit else "")


def check_placement(placement: Any, name: str = "placement") -> Placement:
    """``placement`` if it is a `Placement`, else an `InputError` naming the argument."""
    return check_type(name, placement, Placement, "an eplb.Placement")


def check_trace(trace: Any, name: str = "trace") -> Trace:
    """``trace`` if it is a `traces.Trace`, else an `InputError` naming the argument."""

    return check_type(name, trace, Trace, "a traces.Trace (traces.read(path))")


def check_num_groups(num_groups: Any, num_experts: int, name: str = "num_groups") -> int | None:
    """``None``, or a positive integer dividing ``num_experts``."""
    num_groups = check_opt_int(name, num_groups, 1)
    if num_groups is not None and num_experts % num_groups:
        raise InputError(f"{name} {num_groups} does not divide the {num_experts} experts "
                         "(groups are equal blocks of experts)")
    return num_groups


def moe_rows(placement: Placement, trace: Trace) -> Placement:
    """``placement`` with model layer ids when its rows are MoE-layer indices (a vLLM mapping
    file read without ``layer_ids=``: ``meta["source"]["layer_ids"] == "moe_index"``): row
    ``i`` becomes the trace's ``i``-th MoE layer in model-layer order. Any other placement is
    returned as is. A different number of MoE layers is a `PlacementError`."""
    source = placement.meta.get("source")
    if not isinstance(source, dict) or source.get("layer_ids") != MOE_INDEX:
        return placement
    t_ids = np.sort(np.asarray(trace.layer_ids))
    if not np.array_equal(np.sort(placement.layer_ids), np.arange(placement.num_layers)):
        raise PlacementError(f"the placement is marked as keyed by MoE-layer index but its "
                             f"layer ids are {_ids(placement.layer_ids)}, not 0..L-1")
    if placement.num_layers != len(t_ids):
        raise PlacementError(
            f"the placement is keyed by MoE-layer index (a vLLM mapping file) and has "
            f"{placement.num_layers} MoE layers, but the trace has {len(t_ids)} (model layers "
            f"{_ids(t_ids)}); MoE index i maps to the trace's i-th MoE layer, so both must "
            "cover the same MoE layers: use a placement solved for this trace (a trace reader "
            "drops a layer with no counts as dense)"
        )
    meta = dict(placement.meta)
    meta["source"] = {**source, "layer_ids": "model", "moe_index_to_layer": "trace"}
    return Placement(placement.phy2log, placement.num_experts, placement.topology,
                     placement.replica_share, meta, t_ids[placement.layer_ids])


def align(placement: Placement, trace: Trace) -> Placement:
    """The rows of ``placement`` for ``trace.layer_ids``, or a `PlacementError` naming the mismatch.

    ``trace`` is a `traces.Trace`.
    """
    check_placement(placement)
    check_trace(trace)
    if trace.num_windows < 1:
        raise TraceError("the trace has no windows; it needs at least one window of counts")
    if placement.num_experts != trace.num_experts:
        raise PlacementError(
            f"the placement has {placement.num_experts} experts per layer but the trace has "
            f"{trace.num_experts}; solve a placement for this trace (eplb solve TRACE ...)"
        )
    placement = moe_rows(placement, trace)
    p_ids = placement.layer_ids
    t_ids = np.asarray(trace.layer_ids)
    if np.array_equal(p_ids, t_ids):
        return placement
    missing = np.setdiff1d(t_ids, p_ids)
    if missing.size:
        hint = ""
        if len(p_ids) == len(t_ids) and np.array_equal(p_ids, np.arange(len(p_ids))):
            hint = (" (solvers number rows 0..L-1: label them with "
                    "evaluation.align.with_layers(placement, trace.layer_ids))")
        raise PlacementError(
            f"the placement has no rows for trace layers {_ids(missing)} (placement layers "
            f"{_ids(p_ids)}); use a placement solved for this trace{hint}"
        )
    pos = {int(lid): i for i, lid in enumerate(p_ids)}
    rows = np.array([pos[int(lid)] for lid in t_ids], dtype=np.int64)
    share = None if placement.replica_share is None else placement.replica_share[rows]
    return Placement(
        placement.phy2log[rows], placement.num_experts, placement.topology, share,
        placement.meta, t_ids,
    )


def check_load_shape(placement: Placement, load: np.ndarray, name: str = "load") -> None:
    """Raise `PlacementError` unless ``load: [..., L, E]`` fits the placement (layers, experts)."""
    check_counts_shape(load, placement.num_layers, placement.num_experts, name)


def check_counts_shape(counts: np.ndarray, L: int, E: int, name: str = "load") -> None:
    """Raise `PlacementError` unless ``counts: [..., L, E]`` has ``L`` layers and ``E`` experts."""
    if tuple(counts.shape[-2:]) != (L, E):
        raise PlacementError(
            f"{name} has shape {tuple(counts.shape)} but the placement is [{L} layers, "
            f"{E} experts]; use a placement solved for this trace"
        )


def with_layers(placement: Placement, layer_ids: ArrayLike) -> Placement:
    """``placement`` with its rows labelled by ``layer_ids: int[L]`` (solvers number rows
    0..L-1)."""
    check_placement(placement)
    ids = as_int_array("layer_ids", layer_ids, error=PlacementError)
    return Placement(placement.phy2log, placement.num_experts, placement.topology,
                     placement.replica_share, placement.meta, ids)
