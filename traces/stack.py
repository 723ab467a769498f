"""Several traces as the windows of one: `stack` (``eplb trace stack``). SGLang dumps taken at
different times become a windowed trace for ``replay``, the windowed policies and ``advise``.
docs/data.md, section "Reading traces".
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from eplb.errors import TraceError
from eplb.safeload import check_size
from eplb.traces.model import Trace
from eplb.traces.readers import read

# meta keys that must agree across the parts (routing facts); others are kept when equal
_ROUTING = ("num_groups", "top_k", "topk_groups")


def _part(item, i: int) -> tuple[str, Trace]:
    if isinstance(item, Trace):
        return f"trace {i}", item
    if isinstance(item, (str, os.PathLike)):
        return str(item), read(item)
    raise TraceError(f"stack takes traces or trace paths; item {i} is {type(item).__name__}")


def stack(items: Sequence[Trace | str | os.PathLike]) -> Trace:
    """One trace whose windows are the windows of ``items`` in order (traces or paths).

    Every part needs the same experts. Layers are matched by model layer id; a layer a part
    lacks counts zero there when the part came from a dense dump (which drops all-zero
    layers: ``meta["num_model_layers"]``), else it is an error. Per-rank ``source_counts``
    are kept when every part has them with the same ranks; token-level arrays are dropped
    (``meta["provenance"]["dropped_token_level"]`` names those parts).
    """
    if isinstance(items, (str, os.PathLike, Trace)) or not isinstance(items, Sequence):
        raise TraceError("stack takes a list of traces or trace paths (at least two)")
    parts = [_part(item, i) for i, item in enumerate(items)]
    if len(parts) < 2:
        raise TraceError(f"stack needs at least two traces, got {len(parts)}")
    E = parts[0][1].num_experts
    for name, t in parts:
        if t.num_experts != E:
            raise TraceError(f"{name} has {t.num_experts} experts, {parts[0][0]} has {E}; "
                             "stack dumps of one model")
    ids = np.unique(np.concatenate([t.layer_ids for _, t in parts]))
    for name, t in parts:
        missing = np.setdiff1d(ids, t.layer_ids)
        if missing.size and "num_model_layers" not in t.meta:
            raise TraceError(f"{name} has no rows for layers {missing.tolist()[:8]} that other "
                             "parts have; stack traces of the same layers")
    meta: dict = {}
    for key in _ROUTING:
        vals = {repr(t.meta.get(key)) for _, t in parts if key in t.meta}
        if len(vals) > 1:
            raise TraceError(f"the parts disagree on {key} ({', '.join(sorted(vals))}); "
                             "stack dumps of one model and routing")
    first = parts[0][1].meta
    for key, value in first.items():
        if key != "provenance" and all(t.meta.get(key) == value for _, t in parts):
            meta[key] = value
    pos = {int(lid): r for r, lid in enumerate(ids)}
    blocks, srcs = [], []
    keep_src = all(t.source_counts is not None for _, t in parts) and len(
        {t.source_counts.shape[2] for _, t in parts}) == 1
    # the stacked trace's size, checked before its blocks are allocated (each part was
    # within the limit; together they may not be): the blocks and the trace built from them
    W = sum(t.num_windows for _, t in parts)
    R = parts[0][1].source_counts.shape[2] if keep_src else 0
    check_size("the stacked trace", (W, len(ids), E * (1 + R)), 16, error=TraceError,
               fix="stack fewer or smaller traces")
    for _, t in parts:
        rows = [pos[int(lid)] for lid in t.layer_ids]
        block = np.zeros((t.num_windows, len(ids), E))
        block[:, rows] = t.counts
        blocks.append(block)
        if keep_src:
            src = np.zeros((t.num_windows, len(ids), t.source_counts.shape[2], E))
            src[:, rows] = t.source_counts
            srcs.append(src)
    dropped = [name for name, t in parts if t.topk_ids is not None]
    meta["provenance"] = {
        "format": "stack",
        "parts": [{"name": name, "windows": t.num_windows, **({"source": t.meta["provenance"]}
                                                              if "provenance" in t.meta else {})}
                  for name, t in parts],
        **({"dropped_token_level": dropped} if dropped else {}),
    }
    return Trace(np.concatenate(blocks), ids, np.concatenate(srcs) if keep_src else None,
                 meta=meta)
