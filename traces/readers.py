"""Reading traces: ``traces.read(path, format=None) -> Trace``, sniffing by suffix and content.

Formats so far: native ``.npz`` (lossless), ``.npy`` (``[L, E]`` or ``[T, L, E]``) and SGLang
JSON (``{"logical_count": [L][E]}`` or ``[steps][L][E]``). All-zero layers (dense layers in
SGLang dumps) are dropped; the kept rows keep their model layer ids in ``layer_ids`` and
``meta["num_model_layers"]`` records the original row count.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import numpy as np

from eplb.errors import TraceError
from traces.model import Trace

FORMATS = ("npz", "npy", "sglang")


def _fail(path, msg: str) -> TraceError:
    return TraceError(f"{path}: {msg}")


def sniff(path: str | os.PathLike) -> str:
    suffix = Path(path).suffix.lower()
    if suffix == ".npz":
        return "npz"
    if suffix == ".npy":
        return "npy"
    if suffix == ".json":
        return "sglang"
    raise _fail(
        path,
        f"unknown trace format (suffix {suffix or 'none'!r}); use one of "
        f"{', '.join(FORMATS)} or pass format=",
    )


def drop_dense(counts: np.ndarray, layer_ids: np.ndarray | None = None):
    """Drop layers that are zero in every window; returns ``(counts, layer_ids)``."""
    ids = np.arange(counts.shape[1]) if layer_ids is None else np.asarray(layer_ids)
    keep = counts.reshape(counts.shape[0], counts.shape[1], -1).any(axis=(0, 2))
    if not keep.any():
        return counts, ids
    return counts[:, keep], ids[keep]


def _from_dense(path, arr, meta: dict) -> Trace:
    if arr.ndim == 2:
        arr = arr[None]
    if arr.ndim != 3:
        raise _fail(
            path,
            f"expected [layers, experts] or [windows, layers, experts], "
            f"got nesting depth {arr.ndim}",
        )
    num_model_layers = arr.shape[1]
    try:
        counts, ids = drop_dense(np.asarray(arr, dtype=np.float64))
        meta = {"num_model_layers": num_model_layers, **meta}
        return Trace(counts, ids, meta=meta)
    except TraceError as exc:
        raise _fail(path, str(exc)) from None


def _read_sglang(path) -> Trace:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail(path, f"cannot read: {exc}") from None
    if not text.strip():
        raise _fail(path, "file is empty")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _fail(path, f"not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or "logical_count" not in doc:
        raise _fail(
            path,
            "expected an object with 'logical_count' ([layers][experts] or "
            "[steps][layers][experts])",
        )
    try:
        arr = np.array(doc["logical_count"], dtype=np.float64)
    except (ValueError, TypeError):
        raise _fail(
            path,
            "logical_count is ragged or not numeric; every layer needs the same "
            "number of expert counts",
        ) from None
    return _from_dense(path, arr, {"provenance": {"format": "sglang", "path": str(path)}})


def _read_npy(path) -> Trace:
    try:
        arr = np.load(path, allow_pickle=False)
    except ValueError as exc:
        if "pickle" in str(exc):
            raise _fail(path, "contains pickled objects, which are refused") from None
        raise _fail(path, f"not a readable .npy ({exc})") from None
    except (OSError, EOFError) as exc:
        raise _fail(path, f"truncated or unreadable .npy ({exc})") from None
    if not np.issubdtype(arr.dtype, np.number):
        raise _fail(path, f"holds {arr.dtype}, expected numeric counts")
    return _from_dense(path, arr, {"provenance": {"format": "npy", "path": str(path)}})


_NPZ_ARRAYS = ("counts", "layer_ids", "source_counts", "topk_ids", "token_rank")


def _read_npz(path) -> Trace:
    try:
        with np.load(path, allow_pickle=False) as z:
            names = set(z.files)
            if "counts" not in names:
                if len(names) == 1:  # a bare [L, E] / [T, L, E] array saved with savez
                    arr = z[next(iter(names))]
                    return _from_dense(
                        path, arr, {"provenance": {"format": "npz", "path": str(path)}}
                    )
                raise _fail(path, f"no 'counts' array (has {sorted(names)}); not an eplb trace")
            arrays = {k: z[k] for k in _NPZ_ARRAYS if k in names}
            meta = json.loads(str(z["meta"][()])) if "meta" in names else {}
    except TraceError:
        raise
    except ValueError as exc:
        if "pickle" in str(exc):
            raise _fail(path, "contains pickled objects, which are refused") from None
        raise _fail(path, f"not a readable npz ({exc})") from None
    except (zipfile.BadZipFile, EOFError, OSError, json.JSONDecodeError) as exc:
        raise _fail(path, f"truncated or not an npz file ({exc})") from None
    try:
        return Trace(meta=meta, **arrays)
    except TraceError as exc:
        raise _fail(path, str(exc)) from None


def read(path: str | os.PathLike, format: str | None = None) -> Trace:
    """Read a trace file; raises `TraceError` naming the file, field and fix."""
    if not Path(path).exists():
        raise TraceError(f"trace file {str(path)!r} does not exist")
    fmt = sniff(path) if format is None else format
    if fmt not in FORMATS:
        raise TraceError(f"unknown trace format {fmt!r}; use one of {', '.join(FORMATS)}")
    if Path(path).is_file() and Path(path).stat().st_size == 0:
        raise _fail(path, "file is empty")
    return {"npz": _read_npz, "npy": _read_npy, "sglang": _read_sglang}[fmt](path)
