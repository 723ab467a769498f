"""Writing traces, always atomically (temporary file beside the target, then rename).

``write(trace, path, format=None)``: ``npz`` (native, lossless), ``parquet``, ``csv``, ``sglang``;
`dropped` lists what a format leaves out. See docs/data.md, section "Writing traces".
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np

from eplb.atomic import atomic_write, atomic_write_bytes, atomic_write_text
from eplb.errors import TraceError
from eplb.traces.model import Trace, json_default

WRITE_FORMATS = ("npz", "parquet", "csv", "sglang")
_SUFFIXES = {".npz": "npz", ".parquet": "parquet", ".pq": "parquet", ".csv": "csv",
             ".json": "sglang"}


def write_format(path: str | os.PathLike, format: str | None = None) -> str:
    """The output format for ``path``: ``format`` if given, else from the suffix."""
    if path is None or isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        raise TraceError(f"path must be a file name (str or os.PathLike), got {str(path)[:40]}")
    if format is not None:
        if not isinstance(format, str) or format not in WRITE_FORMATS:
            raise TraceError(f"cannot write trace format {format!r}; use one of "
                             f"{', '.join(WRITE_FORMATS)}")
        return format
    suffix = Path(path).suffix.lower()
    if suffix not in _SUFFIXES:
        raise TraceError(f"{path}: cannot tell the trace format from suffix {suffix or 'none'!r}; "
                         f"use .npz, .parquet, .csv or .json, or pass format= (CLI: --format) "
                         f"({', '.join(WRITE_FORMATS)})")
    return _SUFFIXES[suffix]


def dropped(trace: Trace, format: str) -> list[str]:
    """Names of the parts of ``trace`` that ``format`` does not store."""
    out = []
    if format in ("parquet", "csv", "sglang") and trace.topk_ids is not None:
        out.append("token-level topk_ids/token_rank")
    if format == "sglang" and trace.source_counts is not None:
        out.append("source_counts")
    if format in ("csv", "sglang") and trace.meta:
        out.append("meta")
    return out


def write(trace: Trace, path: str | os.PathLike, format: str | None = None) -> str:
    """Write ``trace`` to ``path`` atomically; returns the format used."""
    if not isinstance(trace, Trace):
        raise TraceError(f"write() needs a traces.Trace, got {type(trace).__name__}")
    fmt = write_format(path, format)
    {"npz": write_npz, "parquet": write_parquet, "csv": write_csv,
     "sglang": write_sglang}[fmt](trace, path)
    return fmt


def _compact(a: np.ndarray) -> np.ndarray:
    """Integer-valued counts as the smallest unsigned dtype that holds them exactly."""
    if a.size == 0:
        return a
    top = a.max()
    if top >= 2**32 or not np.array_equal(a, np.floor(a)):
        return a
    return a.astype(np.uint16 if top < 2**16 else np.uint32)


def write_npz(trace: Trace, path: str | os.PathLike, *, compress: bool = True) -> None:
    """Write ``trace`` to ``path`` atomically in the native npz format."""
    arrays = {"counts": _compact(trace.counts), "layer_ids": trace.layer_ids}
    if trace.source_counts is not None:
        arrays["source_counts"] = _compact(trace.source_counts)
    if trace.topk_ids is not None:
        arrays["topk_ids"] = trace.topk_ids
        arrays["token_rank"] = trace.token_rank
    arrays["meta"] = np.array(_meta_json(trace))
    buf = io.BytesIO()
    (np.savez_compressed if compress else np.savez)(buf, **arrays)
    atomic_write_bytes(path, buf.getvalue())


def _meta_json(trace: Trace) -> str:
    try:
        return json.dumps(dict(trace.meta), default=json_default)
    except (TypeError, ValueError) as exc:
        raise TraceError(f"trace meta is not JSON serialisable ({exc}); keep meta to "
                         "numbers, strings, lists and dicts") from None


def _frame(trace: Trace):
    df = trace.to_frame(by_rank=trace.source_counts is not None)
    c = df["count"].to_numpy()
    if c.size and np.array_equal(c, np.floor(c)) and c.max() < 2**53:
        df["count"] = c.astype(np.int64)
    return df


def write_csv(trace: Trace, path: str | os.PathLike) -> None:
    """Long CSV ``window,layer,expert[,rank],count`` with every row (zeros included)."""
    df = _frame(trace)
    with atomic_write(path, "w") as fh:
        df.to_csv(fh, index=False, lineterminator="\n")


def write_parquet(trace: Trace, path: str | os.PathLike) -> None:
    """Long Parquet table with ``meta`` and the expert count in the schema metadata."""
    try:
        import pyarrow as pa  # lazy: pyarrow is an optional extra (parquet)
        import pyarrow.parquet as pq
    except ImportError:
        raise TraceError("writing Parquet needs pyarrow; install it with "
                         "pip install 'eplb[parquet]'") from None
    df = _frame(trace)
    df["count"] = df["count"].astype(np.float64)
    table = pa.Table.from_pandas(df, preserve_index=False)
    md = dict(table.schema.metadata or {})
    md[b"eplb.meta"] = _meta_json(trace).encode()
    md[b"eplb.shape"] = json.dumps({"num_windows": trace.num_windows,
                                    "num_layers": trace.num_layers,
                                    "num_experts": trace.num_experts}).encode()
    table = table.replace_schema_metadata(md)
    buf = io.BytesIO()
    pq.write_table(table, buf)
    atomic_write_bytes(path, buf.getvalue())


def write_sglang(trace: Trace, path: str | os.PathLike) -> None:
    """SGLang ``{"logical_count": ...}`` JSON, dense layers padded back as zero rows."""
    nml = trace.meta.get("num_model_layers")
    ids = trace.layer_ids
    if ids.min() >= 0:  # one row per model layer id, 0..max(num_model_layers, max id + 1)
        rows = max(int(nml) if isinstance(nml, int) else 0, int(ids.max()) + 1)
    else:
        rows, ids = trace.num_layers, np.arange(trace.num_layers)
    full = np.zeros((trace.num_windows, rows, trace.num_experts))
    full[:, ids] = trace.counts
    data = full[0] if trace.num_windows == 1 else full
    atomic_write_text(path, json.dumps({"logical_count": data.tolist()}))
