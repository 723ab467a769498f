"""The reference executor driven by a trace: `execute_trace` picks the layer, top-k and groups
from the trace and replays its token-level picks, or draws picks from its expert popularity
(counts traces), then runs `eplb.executor.run.execute`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from eplb.args import check_int
from eplb.errors import InputError
from eplb.evaluation.align import check_placement, check_trace, moe_rows
from eplb.executor.run import DEFAULT_TOKENS, ExecuteReport, default_row, execute, row_of
from eplb.placement import Placement
from eplb.traces.model import Trace


def trace_row(placement: Placement, trace: Trace, row: int) -> int:
    """Row of ``trace`` holding the model layer of placement row ``row``; `InputError` when the
    experts differ or the trace does not hold that layer."""
    if trace.num_experts != placement.num_experts:
        raise InputError(
            f"the trace has {trace.num_experts} experts but the placement {placement.num_experts}; "
            "use a placement solved for this trace"
        )
    lid = int(placement.layer_ids[row])
    hit = np.flatnonzero(np.asarray(trace.layer_ids) == lid)
    if hit.size == 0:
        raise InputError(
            f"placement row {row} is model layer {lid}, which the trace does not hold "
            f"(trace layers {trace.layer_ids.min()}-{trace.layer_ids.max()}); pick one of those "
            "as layer"
        )
    return int(hit[0])


def execute_trace(
    placement: Placement,
    trace: Trace | None = None,
    *,
    layer: int | None = None,
    top_k: int | None = None,
    num_groups: int | None = None,
    topk_groups: int | None = None,
    **kwargs: Any,
) -> ExecuteReport:
    """`eplb.executor.run.execute` of model layer ``layer`` of ``placement`` (default: the first
    layer ``trace`` holds, else `default_row`), with what ``trace`` says when given:

    - a token-level trace (``topk_ids``): its picks and source ranks of that layer are replayed
      (the first ``num_tokens``); ``top_k`` is the trace's width (a different one is refused);
    - a counts trace: each token's picks are drawn from the layer's expert popularity
      (``trace.load()``, `executor.popularity`: executed loads converge to `evaluate`'s as
      tokens grow); ``top_k`` defaults to the trace's ``meta["top_k"]``.

    ``num_groups`` (and, with it, ``topk_groups``) default to the trace's ``meta``. Other
    keywords (``num_tokens``, ``hidden``, ``policy``, ``seed``, ...) go to ``execute``. A
    placement keyed by MoE-layer index (a vLLM file) takes the trace's layer ids
    (`evaluation.align.moe_rows`), so ``layer`` is a model layer id then too.
    """
    check_placement(placement)
    if trace is None:
        return execute(placement, layer=layer, top_k=top_k, num_groups=num_groups,
                       topk_groups=topk_groups, **kwargs)
    check_trace(trace)
    placement = moe_rows(placement, trace)  # a vLLM file's MoE indices -> the trace's layers
    row = row_of(placement, layer) if layer is not None else \
        default_row(placement, trace.layer_ids)
    trow = trace_row(placement, trace, row)
    meta = trace.meta
    token_level = trace.topk_ids is not None
    width = trace.topk_ids.shape[2] if token_level else None
    if not top_k:
        top_k = width if token_level else (int(meta["top_k"]) if meta.get("top_k") else None)
    if num_groups is None:
        num_groups = meta.get("num_groups")
        if topk_groups is None and num_groups is not None:
            topk_groups = meta.get("topk_groups")
    if token_level and top_k != width:
        raise InputError(f"top_k {top_k} disagrees with the trace's token-level top-{width}; "
                         "leave top_k out")
    layer = int(placement.layer_ids[row])
    common = dict(layer=layer, top_k=top_k, num_groups=num_groups, topk_groups=topk_groups)
    if not token_level:
        return execute(placement, expert_load=trace.load()[trow], **common, **kwargs)
    G = placement.topology.num_gpus
    num_tokens = check_int("num_tokens", kwargs.pop("num_tokens", DEFAULT_TOKENS), 1)
    n = min(num_tokens, trace.topk_ids.shape[0])
    rank = trace.token_rank[:n]
    if n and rank.max() >= G:
        top = int(rank.max())
        raise InputError(
            f"the trace's tokens come from rank {top} but the placement has {G} GPUs; use a "
            f"placement for at least {top + 1} GPUs"
        )
    return execute(placement, topk_ids=trace.topk_ids[:n, trow, :], token_rank=rank,
                   num_tokens=num_tokens, **common, **kwargs)
