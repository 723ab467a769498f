"""vLLM's recorded expert load (offline EPLB, vLLM PR #41141): a JSON-lines file whose first
record is ``eplb_load_meta`` (model, num_ranks, num_groups, num_nodes, num_layers,
num_redundant_experts) followed by ``eplb_load_stats`` records (``step``, ``expert_load:
[L][P]`` per *physical* slot, ``p2l_map: [L][P]`` the slot's logical expert). Each stats record
becomes one window; slot loads are summed onto their logical experts. Rows are MoE-layer
indices ``0..L-1`` (vLLM numbers MoE layers, not model layers). docs/data.md, "Reading traces".
"""

from __future__ import annotations

import json
import os

import numpy as np

from eplb.errors import TraceError
from eplb.safeload import check_size, read_text
from eplb.traces.checks import check_values, fail, make_trace
from eplb.traces.model import Trace

META, STATS = "eplb_load_meta", "eplb_load_stats"


def looks_like_vllm(head: bytes) -> bool:
    """True when the first line of a file is a vLLM EPLB record."""
    first = head.split(b"\n", 1)[0]
    return b'"record_type"' in first and b'"eplb_load_' in first


def _table(where: str, rec: dict, name: str, ints: bool) -> np.ndarray:
    raw = rec.get(name)
    if not isinstance(raw, list) or not raw or not all(isinstance(r, list) and r for r in raw):
        raise fail(where, f"{name} must be a non-empty [layers][slots] list of lists")
    if len({len(r) for r in raw}) != 1:
        raise fail(where, f"{name} is ragged: rows have lengths {sorted({len(r) for r in raw})}")
    if ints:
        if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31
                   for r in raw for v in r):
            raise fail(where, f"{name} must hold logical expert ids (integers >= 0)")
        return np.asarray(raw, dtype=np.int64)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for r in raw for v in r):
        raise fail(where, f"{name} must hold numbers")
    return check_values(where, np.asarray(raw, dtype=np.float64), name)


def read_vllm(path: str | os.PathLike) -> Trace:
    """A trace from vLLM's expert-load stats JSONL (``counts: float64[steps, L, E]``)."""
    text = read_text(path, "vLLM stats file", lambda msg: fail(path, msg))  # regular, sized
    meta, loads, maps, steps = None, [], [], []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, RecursionError, ValueError) as exc:
            raise fail(where, f"not valid JSON ({type(exc).__name__}); the file may be "
                       "truncated (a server stopped mid-write)") from None
        kind = rec.get("record_type") if isinstance(rec, dict) else None
        if kind == META:
            if meta is not None:
                raise fail(where, f"a second {META} record; one run per file")
            meta = rec
        elif kind == STATS:
            if meta is None:
                raise fail(where, f"{STATS} record before the {META} record")
            load, p2l = _table(where, rec, "expert_load", False), _table(where, rec, "p2l_map",
                                                                         True)
            if load.shape != p2l.shape:
                raise fail(where, f"expert_load has shape {list(load.shape)} but p2l_map "
                           f"{list(p2l.shape)}; they must match")
            if loads and load.shape != loads[0].shape:
                raise fail(where, f"expert_load has shape {list(load.shape)}, the first record "
                           f"{list(loads[0].shape)}; one model per file")
            loads.append(load)
            maps.append(p2l)
            steps.append(rec.get("step"))
        else:
            raise fail(where, f"unexpected record_type {kind!r}; expected {META} then {STATS}")
    if meta is None:
        raise fail(path, f"no {META} record found; not a vLLM expert-load stats file")
    if not loads:
        raise fail(path, f"no {STATS} records found (the run recorded no steps)")
    E = int(max(m.max() for m in maps)) + 1
    T, (L, _) = len(loads), loads[0].shape
    # the largest expert id sets the size: checked before the counts are allocated
    check_size(f"{path}: the counts p2l_map implies (largest expert id {E - 1})", (T, L, E), 8,
               fix="are the p2l_map expert ids right?", error=TraceError)
    counts = np.zeros((T, L, E))
    rows = np.arange(L)[:, None]
    for t, (load, p2l) in enumerate(zip(loads, maps, strict=True)):
        np.add.at(counts[t], (np.broadcast_to(rows, p2l.shape), p2l), load)
    if isinstance(meta.get("num_layers"), int) and meta["num_layers"] != L:
        raise fail(path, f"{META} says num_layers {meta['num_layers']} but the stats have {L}")
    info = {"provenance": {"format": "vllm", "path": str(path), "steps": steps,
                           **{k: meta[k] for k in ("model", "num_ranks", "num_nodes",
                                                   "num_redundant_experts") if k in meta}},
            "layer_ids": "vLLM MoE-layer index (0..L-1), not the model layer id"}
    if isinstance(meta.get("model"), str):
        info["model"] = meta["model"]
    groups = meta.get("num_groups")
    if isinstance(groups, int) and not isinstance(groups, bool) and groups > 1 and E % groups == 0:
        info["num_groups"] = groups
    return make_trace(path, counts, np.arange(L), meta=info)
