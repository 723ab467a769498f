"""Reading traces: ``traces.read(path, format=None) -> Trace``, sniffing by content and suffix.

Formats: ``npz`` (native), ``npy``, ``sglang`` JSON, ``pt`` (SGLang recorder dumps), long
``csv``/``parquet``, ``rankdir``, ``vllm`` (vLLM's expert-load stats JSONL).
Dense formats drop all-zero layers, keeping model layer ids.
Every failure raises `TraceError` naming the file, the field and the fix. See docs/data.md,
section "Reading traces".
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from eplb.errors import TraceError
from eplb.safeload import (
    NPY_MAGIC,
    ZIP_ERRORS,
    ZIP_MAGIC,
    check_regular,
    json_loads,
    npz_names,
    read_npy,
    read_npz,
    read_text,
)
from eplb.traces.checks import (
    FIX_FORMAT,
    FORMATS,
    check_values,
    drop_dense,
    fail,
    from_dense,
    make_trace,
)
from eplb.traces.model import Trace
from eplb.traces.vllm import looks_like_vllm, read_vllm

__all__ = ["FORMATS", "drop_dense", "read", "sniff"]

_SUFFIXES = {".npz": "npz", ".npy": "npy", ".json": "sglang", ".pt": "pt", ".pth": "pt",
             ".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".jsonl": "vllm"}


def sniff(path: str | os.PathLike) -> str:
    """The format of ``path`` from its content (magic bytes), falling back to its suffix."""
    p = Path(path)
    if p.is_dir():
        return "rankdir"
    suffix = p.suffix.lower()
    try:
        with open(p, "rb") as fh:
            head = fh.read(512)
    except OSError as exc:
        raise fail(path, f"cannot read: {exc}") from None
    if not head:
        raise fail(path, "file is empty")
    if head.startswith(b"\x93NUMPY"):
        return "npy"
    if head.startswith(b"PAR1"):
        return "parquet"
    if head.startswith(b"PK\x03\x04"):
        return _sniff_zip(p, suffix)
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "pt"  # legacy (non-zip) torch.save file: a pickle stream
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if looks_like_vllm(text):
        return "vllm"
    if text[:1] in (b"{", b"["):
        return "sglang"
    if suffix == ".csv" or re.match(rb"[^\n]*\bwindow\b[^\n]*\bexpert\b", text, re.I):
        return "csv"
    if suffix in _SUFFIXES and _SUFFIXES[suffix] in ("npz", "npy", "pt", "parquet"):
        raise fail(path, f"suffix {suffix} says {_SUFFIXES[suffix]} but the content is not; "
                    "the file is truncated or mislabelled")
    raise fail(path, f"unknown trace format (suffix {suffix or 'none'!r}, content not "
                f"recognised); {FIX_FORMAT}")


def _sniff_zip(p: Path, suffix: str) -> str:
    try:
        with zipfile.ZipFile(p) as zf:
            names = zf.namelist()
    except (*ZIP_ERRORS, OSError):
        # truncated zip: trust the suffix so the reader reports it as a truncated file
        return _SUFFIXES.get(suffix, "npz")
    if any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
        return "pt"
    return "npz"


def _nested_shape(path, obj: Any, field: str) -> None:
    """Explain why a nested JSON list is not a rectangular numeric array (raises)."""
    names = ("steps", "layers", "experts")

    def depth(x):
        d = 0
        while isinstance(x, list):
            if not x:
                return d + 1
            x, d = x[0], d + 1
        return d

    nd = depth(obj)
    label = names[-nd:] if 1 <= nd <= 3 else [f"axis {i}" for i in range(nd)]

    def walk(x, where: str, level: int, ref: list[int | None]):
        if level == nd:
            if isinstance(x, list) or isinstance(x, bool) or not isinstance(
                    x, (int, float)) and x is not None:
                raise fail(path, f"{field}{where} is {json.dumps(x)[:40]}, expected a number "
                            f"(nesting depth must be the same everywhere)")
            return
        if not isinstance(x, list):
            raise fail(path, f"{field}{where} is {json.dumps(x)[:40]}, expected a list of "
                        f"{label[level]}; nesting depth differs between entries")
        if ref[level] is None:
            ref[level] = len(x)
        elif len(x) != ref[level]:
            what = label[level]
            raise fail(path, f"{field}{where} has {len(x)} {what} but earlier entries have "
                        f"{ref[level]} (ragged JSON; every "
                        f"{'window' if level == 1 and nd == 3 else 'row'} needs the same "
                        f"number of {what})")
        for i, y in enumerate(x):
            walk(y, f"{where}[{i}]", level + 1, ref)

    walk(obj, "", 0, [None] * nd)
    raise fail(path, f"{field} is not a rectangular array of numbers")


# ------------------------------------------------------------------ JSON
def _holds_bool(obj) -> bool:
    """Whether nested lists ``obj`` hold a boolean anywhere (NumPy reads ``true`` as 1)."""
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, list):
            stack.extend(x)
        elif isinstance(x, bool):
            return True
    return False


def _read_sglang(path, text: str | None = None) -> Trace:
    inline = text is not None
    if text is None:
        text = read_text(path, "trace", error=lambda msg: fail(path, msg),
                         encoding="utf-8-sig")
    if not text.strip():
        raise fail(path, "file is empty")
    # duplicated keys and integers beyond 2**53 (counts that lose precision) are refused
    doc = json_loads(text, "JSON", lambda msg: fail(path, msg), exact_ints=True)
    if isinstance(doc, list):
        doc = {"logical_count": doc}
    if not isinstance(doc, dict) or "logical_count" not in doc:
        keys = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
        raise fail(path, f"expected an object with 'logical_count' ([layers][experts] or "
                    f"[steps][layers][experts]); found {keys}")
    raw = doc["logical_count"]
    if not isinstance(raw, list):
        raise fail(path, f"logical_count is {type(raw).__name__}, expected nested lists")
    depth, x = 0, raw
    while isinstance(x, list) and x:
        x, depth = x[0], depth + 1
    if depth > 3:
        raise fail(path, f"logical_count has nesting depth {depth}; expected [layers][experts] "
                   "or [steps][layers][experts]")
    try:
        arr = np.array(raw)  # ints beyond int64 give an object array: check_values names them
    except (ValueError, TypeError, OverflowError):
        _nested_shape(path, raw, "logical_count")
        raise  # pragma: no cover - _nested_shape always raises
    if arr.dtype.kind in "SUb" or (("true" in text or "false" in text) and _holds_bool(raw)):
        _nested_shape(path, raw, "logical_count")  # a string or a boolean: name it
    if arr.dtype == object:  # null (-> NaN, named below) or integers beyond int64
        try:
            arr = arr.astype(np.float64)
        except (TypeError, ValueError):
            _nested_shape(path, raw, "logical_count")
        except OverflowError:
            big = next(v for v in arr.ravel() if isinstance(v, int) and abs(v) > 2**63)
            raise fail(path, f"logical_count holds {str(big)[:24]}..., an integer beyond "
                       "float range; counts must be <= 2**53") from None
    where = "<inline JSON>" if inline else str(path)
    return from_dense(path, arr, {"provenance": {"format": "sglang", "path": where}},
                       "logical_count")


# ------------------------------------------------------------------ npy / npz
def _not_format(path, want: str) -> None:
    """Raise when the file's content is another format than ``want`` (forced by --format)."""
    try:
        found = sniff(path)
    except TraceError:
        found = None
    what = f"its content looks like {found}" if found and found != want else \
        "its content is not recognised"
    raise fail(path, f"is not a {want} file ({what}); "
               + (f"drop --format (format=) or use {found}" if found and found != want
                  else FIX_FORMAT))


def _read_npy(path) -> Trace:
    with open(path, "rb") as fh:
        if fh.read(len(NPY_MAGIC)) != NPY_MAGIC:
            _not_format(path, "npy")
    arr = read_npy(path, lambda msg: fail(path, msg))
    if not np.issubdtype(arr.dtype, np.number) or arr.dtype.kind == "b":
        raise fail(path, f"holds {arr.dtype}, expected numeric counts")
    return from_dense(path, arr, {"provenance": {"format": "npy", "path": str(path)}})


_NPZ_ARRAYS = ("counts", "layer_ids", "source_counts", "topk_ids", "token_rank")


def _read_npz(path) -> Trace:
    with open(path, "rb") as fh:
        if fh.read(len(ZIP_MAGIC)) != ZIP_MAGIC:
            _not_format(path, "npz")
    err = lambda msg: fail(path, msg)  # noqa: E731
    z = read_npz(path, err, names=(*_NPZ_ARRAYS, "meta"))
    if "counts" not in z:

        names = npz_names(path, err)
        with zipfile.ZipFile(path) as zf:
            arrays = [n for n in zf.namelist() if n.endswith(".npy")]
        if len(names) == 1 and len(arrays) == 1:
            arr = read_npz(path, err)[names[0]]
            if np.issubdtype(arr.dtype, np.number) and arr.dtype.kind != "b":
                # a bare [L, E] / [T, L, E] array saved with savez
                return from_dense(path, arr, {"provenance": {"format": "npz", "path": str(path)}})
        raise fail(path, f"no 'counts' array (has {sorted(names)}); not an eplb trace "
                    "(write it with traces.write_npz)")
    arrays = {k: z[k] for k in _NPZ_ARRAYS if k in z}
    meta_arr = z.get("meta")
    if meta_arr is not None and (meta_arr.dtype.kind not in "SU" or meta_arr.ndim != 0):
        raise fail(path, "meta must be a JSON string")
    meta_text = str(meta_arr[()]) if meta_arr is not None else "{}"
    try:
        meta = json.loads(meta_text)
    except json.JSONDecodeError as exc:
        raise fail(path, f"meta is not valid JSON ({exc})") from None
    except (RecursionError, ValueError) as exc:
        raise fail(path, f"meta is not usable JSON ({type(exc).__name__})") from None
    if not isinstance(meta, dict):
        raise fail(path, f"meta is {type(meta).__name__}, expected a JSON object")
    for name in ("counts", "source_counts"):
        if name in arrays:
            if not np.issubdtype(arrays[name].dtype, np.number):
                raise fail(path, f"{name} holds {arrays[name].dtype}, expected numbers")
            if not np.issubdtype(arrays[name].dtype, np.unsignedinteger):  # those are fine
                arrays[name] = check_values(path, arrays[name], name)
    return make_trace(path, meta=meta, **arrays)


# ------------------------------------------------------------------ entry point
def _lazy(module: str, name: str):
    def reader(path):
        import importlib

        return getattr(importlib.import_module(module), name)(path)

    return reader


_READERS = {"npz": _read_npz, "npy": _read_npy, "sglang": _read_sglang,
            "pt": _lazy("eplb.traces.sglang_pt", "read_pt"),
            "csv": _lazy("eplb.traces.tables", "read_csv"),
            "parquet": _lazy("eplb.traces.tables", "read_parquet"),
            "rankdir": _lazy("eplb.traces.rankdir", "read_rankdir"),
            "vllm": read_vllm}


def read(path: str | os.PathLike, format: str | None = None) -> Trace:
    """Read a trace (file, per-rank directory or inline SGLang JSON text).

    ``format`` is one of ``FORMATS``; by default it is sniffed from the content, then the
    suffix. Raises `TraceError` naming the file, the field and the fix.
    """
    if format is not None and (not isinstance(format, str) or format not in FORMATS):
        raise TraceError(f"unknown trace format {format!r}; use one of {', '.join(FORMATS)}")
    if path is None or isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        raise TraceError(f"path must be a trace file name (str or os.PathLike), got {path!r}")
    if isinstance(path, str) and path.lstrip().startswith(("{", "[")) and not _exists(path):
        return _read_sglang("<inline JSON>", path)
    if isinstance(path, str) and (not path.strip() or "\0" in path):
        raise TraceError(f"trace path {path!r} is empty or invalid")
    p = Path(path)
    try:
        if not p.exists():
            raise TraceError(f"trace file {str(path)!r} does not exist")
    except OSError as exc:  # a name too long, a loop of links
        raise fail(str(path)[:80], f"cannot read: {exc.strerror or exc}") from None
    if not p.is_dir():
        check_regular(p, "trace file", TraceError)
    if p.is_file() and p.stat().st_size == 0:
        raise fail(path, "file is empty")
    fmt = sniff(p) if format is None else format
    if fmt == "rankdir" and not p.is_dir():
        raise fail(path, "format rankdir needs a directory of rank folders")
    if fmt != "rankdir" and p.is_dir():
        raise fail(path, f"is a directory; format {fmt} needs a file")
    return _READERS[fmt](p)


def _exists(path: str) -> bool:
    try:
        return Path(path).exists()
    except (OSError, ValueError):
        return False
