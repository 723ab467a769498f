"""Shared checks for the trace readers: errors that name the file, value checks, dense input."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from eplb.errors import TraceError
from eplb.loads import MAX_COUNT, as_real_array
from eplb.traces.model import Trace

FORMATS = ("npz", "npy", "sglang", "pt", "csv", "parquet", "rankdir", "vllm")
FIX_FORMAT = f"pass format= (CLI: --format) with one of {', '.join(FORMATS)}"


def fail(path: str | os.PathLike, msg: str) -> TraceError:
    """A `TraceError` whose message starts with ``path``."""
    return TraceError(f"{path}: {msg}")


def check_values(path: str | os.PathLike, arr: ArrayLike, field: str) -> np.ndarray:
    """``arr`` as ``float64[...]`` after checking every entry is real, finite, >= 0 and <= 2**53
    (indices in the file's own coordinates)."""
    arr = as_real_array(arr, field, error=lambda msg: fail(path, msg))
    bad = ~np.isfinite(arr)
    if bad.any():
        idx = "".join(f"[{int(i)}]" for i in np.argwhere(bad)[0])
        raise fail(path, f"{field}{idx} is {arr[tuple(np.argwhere(bad)[0])]}; counts must be "
                    "finite numbers (fix or remove that entry)")
    neg = arr < 0
    if neg.any():
        first = tuple(np.argwhere(neg)[0])
        idx = "".join(f"[{int(i)}]" for i in first)
        raise fail(path, f"{field}{idx} is {arr[first]}; counts must be >= 0 "
                    "(token counts cannot be negative)")
    big = arr > MAX_COUNT
    if big.any():
        first = tuple(np.argwhere(big)[0])
        idx = "".join(f"[{int(i)}]" for i in first)
        raise fail(path, f"{field}{idx} is {arr[first]:.6g}; counts must be <= 2**53 (9.0e15): "
                    "larger values are corrupt (an integer overflow?)")
    return arr


def make_trace(path: str | os.PathLike, *args: Any, **kw: Any) -> Trace:
    """``Trace(*args, **kw)``, its `TraceError` prefixed with ``path``."""
    try:
        return Trace(*args, **kw)
    except TraceError as exc:
        raise fail(path, str(exc)) from None


def drop_dense(
    counts: np.ndarray, layer_ids: ArrayLike | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Drop layers of ``counts: float[T, L, ...]`` that are zero in every window; returns
    ``(counts: float[T, L', ...], layer_ids: int[L'])`` (all kept when every layer is zero)."""
    ids = np.arange(counts.shape[1]) if layer_ids is None else np.asarray(layer_ids)
    keep = counts.reshape(counts.shape[0], counts.shape[1], -1).any(axis=(0, 2))
    if not keep.any():
        return counts, ids
    return counts[:, keep], ids[keep]


SGLANG_BUFFER = 1000  # rows of SGLang's recorder buffer unless set (server_args.py)


def drop_empty_passes(arr: np.ndarray, meta: dict) -> np.ndarray:
    """``arr: float[B, L, E]`` of an SGLang recorder buffer (one row per forward pass) without
    its all-zero rows, the passes a circular buffer had not reached (SGLang dumps every row of
    it); ``meta["notes"]`` says how many were dropped, or, when every row holds counts, that a
    buffer of ``B`` passes may have wrapped (its rows are then rotated: the window order is
    unknown) and how to record with the exact order."""
    B = arr.shape[0]
    kept = arr.reshape(B, -1).any(axis=1)
    prov = meta.setdefault("provenance", {})
    prov["buffer_rows"] = B
    if not kept.all() and kept.any():
        note = (f"dropped {int((~kept).sum())} all-zero passes of {B} (recorder buffer rows "
                "no pass reached)")
        meta.setdefault("notes", []).append(note)
        prov["empty_passes_dropped"] = int((~kept).sum())
        return arr[kept]
    if B > 1 and kept.all():
        likely = " (SGLang's default buffer size)" if B == SGLANG_BUFFER else ""
        note = (f"every one of the {B} passes holds counts: a recorder buffer of {B} rows"
                f"{likely} may have wrapped, which rotates the pass order; treat the windows "
                "as unordered samples, or record with --expert-distribution-recorder-buffer-size "
                "-1 for the exact order")
        meta.setdefault("notes", []).append(note)
        prov["order"] = "may have wrapped"
    return arr


def from_dense(path: str | os.PathLike, arr: ArrayLike, meta: dict, field: str = "counts",
               *, passes: bool = False) -> Trace:
    """A trace from a dense ``[L, E]`` or ``[T, L, E]`` count array (all-zero layers dropped,
    ``meta["num_model_layers"]`` the original row count). ``passes``: the rows of a 3-D array
    are an SGLang recorder's forward passes (`drop_empty_passes`)."""
    arr = np.asarray(arr)
    if arr.ndim in (2, 3) and 0 not in arr.shape:
        arr = check_values(path, arr, field)  # indices in the file's own coordinates
    if arr.ndim == 2:
        arr = arr[None]
    if arr.ndim != 3:
        raise fail(path, f"{field} has nesting depth {arr.ndim} (shape {list(arr.shape)}); "
                    "expected [layers][experts] or [steps][layers][experts]")
    if 0 in arr.shape:
        raise fail(path, f"{field} is empty (shape {list(arr.shape)}); it needs at least one "
                    "layer and one expert")
    meta = {"num_model_layers": int(arr.shape[1]), **meta}
    if passes and arr.shape[0] > 1:
        arr = drop_empty_passes(arr, meta)
    counts, ids = drop_dense(arr)
    return make_trace(path, counts, ids, meta=meta)
