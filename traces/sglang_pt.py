"""SGLang ``torch.save`` dumps of the expert distribution recorder (needs the ``torch`` extra).

Stat, per-pass and per-token dumps, loaded with ``weights_only=True`` (arbitrary pickled objects
are refused). See docs/data.md, section "Reading traces" (``pt``).
"""

from __future__ import annotations

import os
import re
import warnings
from typing import Any

import numpy as np

from eplb.errors import TraceError
from eplb.safeload import check_size, check_torch_file
from eplb.traces.checks import check_values, drop_dense, fail, from_dense, make_trace
from eplb.traces.model import Trace


def _torch(path):
    try:
        import torch  # lazy: torch is an optional extra
    except ImportError:
        raise fail(path, "reading .pt dumps needs PyTorch; install it with "
                    "pip install 'eplb[torch]'") from None
    return torch


def _to_numpy(value, path, field: str) -> np.ndarray:
    """``value`` (a tensor, list or number) as a numpy array; sparse, meta and quantized
    tensors are refused by name, BF16/FP8 (no numpy dtype) widen losslessly to float32."""
    if hasattr(value, "detach"):
        kind = ("a sparse tensor" if getattr(value, "is_sparse", False)
                or str(getattr(value, "layout", "torch.strided")) != "torch.strided"
                else "a meta tensor (no data)" if getattr(value, "is_meta", False)
                else "a quantized tensor" if getattr(value, "is_quantized", False) else None)
        if kind is not None:
            raise fail(path, f"{field} is {kind}; save a dense tensor of counts "
                       "(tensor.to_dense() / dequantize())")
        # a view can claim far more elements than its storage holds (stride 0): the copy
        # made below would allocate them all
        check_size(f"{path}: {field}", tuple(int(d) for d in value.shape), 8,
                   fix="save a smaller tensor", error=TraceError)
        try:
            t = value.detach().cpu()
            if t.is_floating_point() and t.element_size() < 4:  # bf16, fp16, fp8
                t = t.float()
            elif t.is_complex():
                raise fail(path, f"{field} holds complex numbers; counts must be real")
            value = t.numpy()
        except (TypeError, RuntimeError, ValueError) as exc:
            raise fail(path, f"{field} is a tensor numpy cannot hold ({exc}); save it as "
                       "int64 or float32") from None
    if isinstance(value, (list, tuple)):  # shared sub-lists can imply billions of entries
        check_size(f"{path}: {field}", _nested_shape(value), 8, fix="save a smaller tensor",
                   error=TraceError)
    try:
        return np.asarray(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise fail(path, f"{field} is not an array ({exc})") from None


def _nested_shape(value, depth: int = 64) -> tuple[int, ...]:
    """The shape a nested list implies, read along its first elements (a pickle can share one
    sub-list many times, so a small file can imply a huge array)."""
    shape = []
    while isinstance(value, (list, tuple)) and len(shape) < depth:
        shape.append(len(value))
        if not value:
            break
        value = value[0]
    if hasattr(value, "shape"):  # a list of tensors
        shape.extend(int(d) for d in value.shape)
    return tuple(shape)


def _rank(value, path, field: str) -> int:
    """A rank id: a whole number >= 0 (an int or a one-element integer tensor)."""
    if hasattr(value, "detach") and getattr(value, "numel", lambda: 0)() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise fail(path, f"{field} is {str(value)[:30]!r}; a rank must be a whole number >= 0")
    return int(value)


def read_pt(path: str | os.PathLike) -> Trace:
    """The trace of an SGLang ``torch.save`` dump (stat, per-pass or per-token)."""
    torch = _torch(path)
    # sizes the file implies (storages named in the pickle, zip data records), checked
    # against EPLB_MAX_BYTES before torch.load allocates anything
    check_torch_file(path, error=TraceError)
    try:
        with warnings.catch_warnings():  # torch's deprecation notes are not the user's error
            warnings.simplefilter("ignore")
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types: UnpicklingError, RuntimeError, EOFError
        text = str(exc)
        if "weights_only" in text.lower() or "Unsupported global" in text:
            found = re.search(r"Unsupported global: GLOBAL (\S+)", text)
            what = f" ({found.group(1)})" if found else ""
            raise fail(path, f"holds a Python object{what} that weights_only=True loading "
                       "refuses (arbitrary pickles are never loaded); save plain tensors, "
                       "numbers, lists and dicts") from None
        first = re.sub(r"\x1b\[[0-9;]*m", "", text.splitlines()[0] if text else "")
        raise fail(path, f"truncated or not a torch.save file ({first[:120]}); re-copy or "
                   "re-dump it") from None
    prov = {"format": "pt", "path": str(path)}
    if hasattr(obj, "detach"):
        return from_dense(path, _to_numpy(obj, path, "tensor"), {"provenance": prov})
    if not isinstance(obj, dict):
        raise fail(path, f"holds a {type(obj).__name__}; expected an SGLang expert-distribution "
                    "dump (dict with 'logical_count' or 'records')")
    if "logical_count" in obj:
        arr = _to_numpy(obj["logical_count"], path, "logical_count")
        meta: dict[str, Any] = {"provenance": {**prov, "kind": "sglang-stat"}}
        if "rank" in obj:
            meta["provenance"]["rank"] = _rank(obj["rank"], path, "rank")
        util = obj.get("average_utilization_rate_over_window")
        if isinstance(util, (int, float)):
            meta["provenance"]["average_utilization_rate_over_window"] = float(util)
        return from_dense(path, arr, meta, "logical_count", passes=True)
    if "records" in obj:
        return _read_pt_records(path, obj, prov)
    raise fail(path, f"dict has keys {sorted(map(str, obj))}; expected an SGLang dump with "
                "'logical_count' (stat mode) or 'records' (per-pass / per-token mode)")


def _read_pt_records(path, obj: dict, prov: dict) -> Trace:
    key = next((k for k in ("last_physical_to_logical_map", "physical_to_logical_map")
                if k in obj), None)
    if key is None:
        raise fail(path, "per-pass dump has 'records' but no 'last_physical_to_logical_map'; "
                    "it is needed to turn physical slot counts into logical expert counts")
    p2l = _to_numpy(obj[key], path, key)
    if p2l.ndim != 2 or not np.issubdtype(p2l.dtype, np.integer) or p2l.size == 0:
        raise fail(path, f"{key} must be int[layers, physical slots], got "
                    f"{p2l.dtype}{list(p2l.shape)}")
    if p2l.min() < 0:
        raise fail(path, f"{key} holds {int(p2l.min())}; logical expert ids must be >= 0")
    L, P = p2l.shape
    E = int(p2l.max()) + 1
    # the largest expert id sets the size of every table below: checked before allocating
    check_size(f"{path}: the counts {key} implies (largest expert id {E - 1})",
               (len(obj.get("records") or ()) or 1, L, E), 8,
               fix=f"are the expert ids in {key} right?", error=TraceError)
    records = obj["records"]
    if not isinstance(records, list) or not records:
        raise fail(path, "records is empty; record at least one forward pass before dumping")
    physical = []
    pass_ids = []
    for i, rec in enumerate(records):
        if not isinstance(rec, dict) or "global_physical_count" not in rec:
            raise fail(path, f"records[{i}] has no 'global_physical_count' [layers, slots]")
        gpc = _to_numpy(rec["global_physical_count"], path,
                        f"records[{i}].global_physical_count")
        if gpc.shape != (L, P):
            raise fail(path, f"records[{i}].global_physical_count has shape {list(gpc.shape)} "
                        f"but {key} is [{L}, {P}]; mismatched layer or slot counts")
        physical.append(check_values(path, gpc, f"records[{i}].global_physical_count"))
        fid = rec.get("forward_pass_id", i)
        pass_ids.append(int(fid) if isinstance(fid, (int, np.integer)) else i)
    # one window per forward pass, in ascending forward-pass id
    ids_sorted, window = np.unique(np.array(pass_ids), return_inverse=True)
    ids_sorted = ids_sorted.tolist()
    T = len(ids_sorted)
    flat_idx = (np.arange(L)[:, None] * E + p2l).ravel()  # [L * P] -> logical cell
    logical = np.zeros((T, L * E))
    for w, phys in zip(window, physical, strict=True):
        logical[w] += np.bincount(flat_idx, weights=phys.ravel(), minlength=L * E)
    logical = logical.reshape(T, L, E)
    counts, ids = drop_dense(logical)
    ranks = sorted({int(r["rank"]) for r in records if isinstance(r.get("rank"), int)})
    meta: dict[str, Any] = {
        "num_model_layers": L,
        "provenance": {**prov, "kind": "sglang-per-pass", "num_records": len(records),
                       "forward_pass_ids": ids_sorted, "ranks": ranks,
                       "num_physical_experts": P},
    }
    topk, token_rank = _pt_tokens(path, records, p2l, ids)
    if topk is not None:
        meta["provenance"]["kind"] = "sglang-per-token"
        meta["top_k"] = int(topk.shape[2])
    return make_trace(path, counts, ids, topk_ids=topk, token_rank=token_rank, meta=meta)


def _pt_tokens(path, records: list, p2l: np.ndarray, keep_ids: np.ndarray):
    """Logical ``topk_ids[N, L_kept, K]`` and ``token_rank[N]`` from per-token records."""
    if not all("topk_ids_of_layer" in r for r in records):
        return None, None
    L = p2l.shape[0]
    parts, ranks = [], []
    K = None
    for i, rec in enumerate(records):
        ids = _to_numpy(rec["topk_ids_of_layer"], path, f"records[{i}].topk_ids_of_layer")
        if ids.ndim != 3 or ids.shape[0] != L or not np.issubdtype(ids.dtype, np.integer):
            raise fail(path, f"records[{i}].topk_ids_of_layer must be int[{L}, tokens, K], got "
                        f"{ids.dtype}{list(ids.shape)}")
        K = ids.shape[2] if K is None else K
        if ids.shape[2] != K:
            raise fail(path, f"records[{i}].topk_ids_of_layer picks {ids.shape[2]} experts per "
                       f"token but records[0] picks {K}; one dump holds one model's top-k")
        ids = ids[keep_ids].astype(np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= p2l.shape[1]):
            return None, None  # padded (-1) picks: counts stay, token arrays are not exact
        logical = np.take_along_axis(p2l[keep_ids][:, None, :],
                                     ids.reshape(len(keep_ids), 1, -1), axis=2)
        parts.append(logical.reshape(ids.shape).transpose(1, 0, 2))
        rank = _rank(rec.get("rank", 0), path, f"records[{i}].rank")
        ranks.append(np.full(ids.shape[1], rank, dtype=np.int32))
    return np.concatenate(parts), np.concatenate(ranks)

