"""Reading and writing request workloads: ``read(path, format=None) -> Workload`` and `write`,
for Mooncake JSON lines, the Azure LLM inference CSV and the frame's own CSV / Parquet, sniffed
from the content then the suffix; formats and errors in docs/serving.md, "Files"."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd

from eplb.atomic import atomic_write
from eplb.errors import InputError
from eplb.evaluation.serving.workload.model import MAX_TOKENS, Workload
from eplb.safeload import MAX_JSON_INT, check_regular, check_size, read_text

__all__ = ["READ_FORMATS", "WRITE_FORMATS", "dropped", "read", "sniff", "write", "write_format"]

READ_FORMATS = ("mooncake", "azure", "csv", "parquet")
WRITE_FORMATS = ("mooncake", "csv", "parquet")
_SUFFIXES = {
    ".jsonl": "mooncake",
    ".json": "mooncake",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}
_AZURE = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def _fail(path, msg: str) -> InputError:
    return InputError(f"{path}: {msg}")


def _check_file(path) -> Path:
    p = check_regular(path, "workload file")  # a name, a regular file (a FIFO would block)
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise _fail(path, f"cannot read: {exc.strerror or exc}") from None
    check_size(f"workload file {p}", (size,), 1, error=lambda msg: _fail(path, msg))
    if size == 0:
        raise _fail(path, "file is empty; a workload needs at least one request")
    return p


def sniff(path: str | os.PathLike) -> str:
    """The format of ``path`` from its first bytes, falling back to its suffix."""
    p = _check_file(path)
    try:
        with open(p, "rb") as fh:
            head = fh.read(4096)
    except OSError as exc:
        raise _fail(path, f"cannot read: {exc.strerror or exc}") from None
    if head.startswith(b"PAR1"):
        return "parquet"
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not text:
        raise _fail(path, "file holds only whitespace; a workload needs at least one request")
    if text[:1] == b"{":
        return "mooncake"
    first = text.split(b"\n", 1)[0].decode("utf-8", "replace")
    cells = [c.strip().strip('"') for c in first.split(",")]
    if all(k in cells for k in _AZURE):
        return "azure"
    if "arrival_s" in cells or "input_tokens" in cells:
        return "csv"
    suffix = p.suffix.lower()
    if suffix == ".parquet" or suffix == ".pq":
        raise _fail(
            path,
            "suffix says parquet but the file does not start with PAR1; it is "
            "truncated or mislabelled",
        )
    if suffix in (".jsonl", ".json"):
        raise _fail(path, "suffix says JSON lines but the first line is not a JSON object {...}")
    raise _fail(
        path,
        f"unknown workload format (first line {first[:60]!r}); expected Mooncake "
        "JSON lines, an Azure trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens) "
        "or a CSV with arrival_s,input_tokens,output_tokens; pass format= (CLI: "
        f"--format) with one of {', '.join(READ_FORMATS)}",
    )


def read(
    path: str | os.PathLike, format: str | None = None, *, block_size: int | None = None
) -> Workload:
    """Read a workload file (formats: docs/serving.md, "Files").

    ``block_size``: tokens per hashed block (default: 512, or the value a Parquet file
    records). Raises `InputError` naming the file, the field and the fix.
    """
    if format is not None and format not in READ_FORMATS:
        raise InputError(
            f"unknown workload format {format!r}; use one of {', '.join(READ_FORMATS)}"
        )
    p = _check_file(path)
    fmt = sniff(p) if format is None else format
    reader = {
        "mooncake": _read_mooncake,
        "azure": _read_azure,
        "csv": _read_csv,
        "parquet": _read_parquet,
    }[fmt]
    return reader(p, block_size)


def _make(path, frame: pd.DataFrame, block_size: int | None, meta: dict) -> Workload:
    try:
        return Workload(frame, 512 if block_size is None else block_size, meta)
    except InputError as exc:
        raise _fail(path, str(exc)) from None


# ------------------------------------------------------------------ Mooncake JSON lines
_MOONCAKE = ("timestamp", "input_length", "output_length")


def _read_mooncake(path: Path, block_size: int | None) -> Workload:
    # a regular UTF-8 file within EPLB_MAX_BYTES
    text = read_text(path, "workload file", lambda msg: _fail(path, msg), encoding="utf-8-sig")
    ts, inp, out, hashes = [], [], [], []
    has_hash = None
    loads = json.loads
    lines = text.split("\n")
    for ln, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = loads(line)
        except json.JSONDecodeError as exc:
            last = ln == len(lines) or all(not x.strip() for x in lines[ln:])
            hint = (
                ("; the file looks truncated (cut off mid-line): re-copy it or drop the last line")
                if last
                else "; fix or drop that line"
            )
            raise _fail(path, f"line {ln} is not valid JSON ({exc.msg}){hint}") from None
        except (ValueError, RecursionError) as exc:  # a 5,000-digit integer, deep nesting
            why = "nested too deeply" if isinstance(exc, RecursionError) else \
                " ".join(str(exc).split())[:80]
            raise _fail(path, f"line {ln} is not usable JSON ({why}); fix or drop that "
                        "line") from None
        if not isinstance(rec, dict):
            raise _fail(
                path,
                f"line {ln} is {type(rec).__name__}, expected an object with "
                "timestamp, input_length, output_length[, hash_ids]",
            )
        try:
            t, i, o = rec["timestamp"], rec["input_length"], rec["output_length"]
        except KeyError as exc:
            raise _fail(
                path,
                f"line {ln} has no {exc.args[0]!r}; each line needs timestamp "
                "(ms), input_length, output_length (and optionally "
                "hash_ids)",
            ) from None
        for key, v in (("timestamp", t), ("input_length", i), ("output_length", o)):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise _fail(path, f"line {ln}: {key} is {json.dumps(v)[:40]}, expected a number")
            if isinstance(v, int) and abs(v) > MAX_JSON_INT:  # beyond float range: no time
                raise _fail(path, f"line {ln}: {key} {str(v)[:24]}... is beyond 2**53; "
                            "timestamps are milliseconds, lengths tokens (an overflow?)")
        h = rec.get("hash_ids")
        if has_hash is None:
            has_hash = h is not None
        if (h is not None) != has_hash:
            raise _fail(
                path,
                f"line {ln}: hash_ids is {'missing' if h is None else 'present'} "
                "but it is the other way on earlier lines; give every line "
                "hash_ids or none",
            )
        if h is not None:
            if not isinstance(h, list):
                raise _fail(
                    path,
                    f"line {ln}: hash_ids is {json.dumps(h)[:40]}, expected a list of integers",
                )
            for x in h:
                if isinstance(x, bool) or not isinstance(x, int):
                    raise _fail(
                        path,
                        f"line {ln}: hash_ids holds {json.dumps(x)[:40]}; block "
                        "hashes must be integers",
                    )
            hashes.append(h)
        ts.append(t)
        inp.append(i)
        out.append(o)
    if not ts:
        raise _fail(path, "no requests (only blank lines)")
    t = np.asarray(ts, dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(t) | (t < 0))
    if bad.size:
        raise _fail(
            path,
            f"request {int(bad[0])}: timestamp {ts[int(bad[0])]!r}; timestamps "
            "are milliseconds >= 0",
        )
    frame = {
        "arrival_s": t / 1000.0,
        "input_tokens": _ints(path, inp, "input_length"),
        "output_tokens": _ints(path, out, "output_length"),
    }
    if has_hash:
        frame["block_hashes"] = _hash_column(path, hashes)
    meta = {"provenance": {"format": "mooncake", "path": str(path)}}
    return _make(path, pd.DataFrame(frame), block_size, meta)


def _ints(path, values: list, field: str) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(v) | (v < 1) | (v > MAX_TOKENS) | (v != np.round(v)))
    if bad.size:
        i = int(bad[0])
        x = values[i]
        why = (
            f"is more than {MAX_TOKENS:,} tokens; is the unit right?"
            if v[i] > MAX_TOKENS
            else "is not a whole number of tokens"
            if math.isfinite(v[i]) and v[i] >= 1
            else "must be a whole number >= 1"
        )
        raise _fail(path, f"request {i}: {field} {x!r} {why}")
    return v.astype(np.int64)


def _hash_column(path, hashes: list) -> np.ndarray:
    col = np.empty(len(hashes), dtype=object)
    for i, h in enumerate(hashes):
        try:
            col[i] = np.asarray(h, dtype=np.int64) if h else np.empty(0, np.int64)
        except OverflowError:
            raise _fail(
                path, f"request {i}: a hash id does not fit in a signed 64-bit integer"
            ) from None
    return col


# ------------------------------------------------------------------ Azure CSV
_AZURE_TS = re.compile(r"^\s*(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?\s*$")


def _read_azure(path: Path, block_size: int | None) -> Workload:
    df = _csv_frame(path)
    missing = [c for c in _AZURE if c not in df.columns]
    if missing:
        raise _fail(
            path,
            f"missing column(s) {', '.join(missing)}; the Azure trace has "
            f"TIMESTAMP,ContextTokens,GeneratedTokens (found "
            f"{', '.join(map(str, df.columns))})",
        )
    if len(df) == 0:
        raise _fail(path, "has a header but no requests")
    raw = df["TIMESTAMP"].astype(str)
    ok = raw.str.match(_AZURE_TS.pattern)
    if not ok.all():
        i = int(np.argmax(~ok.to_numpy()))
        raise _fail(
            path,
            f"row {i + 1}: TIMESTAMP {df['TIMESTAMP'].iloc[i]!r} is not "
            "'YYYY-MM-DD HH:MM:SS[.fraction]'",
        )
    try:
        t = pd.to_datetime(raw.str.strip().str.replace("T", " ", regex=False), format="ISO8601")
    except (ValueError, TypeError) as exc:
        raise _fail(path, f"TIMESTAMP is not a valid date-time ({exc})") from None
    try:  # nanoseconds hold 1677..2262: a wider span would wrap around silently
        ns = t.dt.as_unit("ns").to_numpy(dtype="datetime64[ns]").astype(np.int64)
    except (ValueError, OverflowError) as exc:  # pandas' OutOfBoundsDatetime
        raise _fail(path, f"TIMESTAMP spans dates beyond years 1677..2262 ({exc}); "
                    "the trace's dates are corrupt") from None
    frame = pd.DataFrame({"arrival_s": (ns - ns.min()) / 1e9})
    for src, dst in (("ContextTokens", "input_tokens"), ("GeneratedTokens", "output_tokens")):
        frame[dst] = df[src].to_numpy()
    meta = {"provenance": {"format": "azure", "path": str(path), "start": str(t.min())}}
    try:
        return Workload(frame, 512 if block_size is None else block_size, meta)
    except InputError as exc:
        msg = (
            str(exc)
            .replace("'input_tokens'", "'ContextTokens' (input_tokens)")
            .replace("'output_tokens'", "'GeneratedTokens' (output_tokens)")
        )
        raise _fail(path, msg) from None


def _csv_frame(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(
            path, skipinitialspace=True, dtype={"block_hashes": str, "TIMESTAMP": str}
        )
    except pd.errors.EmptyDataError:
        raise _fail(
            path, "file is empty; a workload needs a header and at least one request"
        ) from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        raise _fail(path, f"is not a readable CSV ({str(exc).splitlines()[0]})") from None


# ------------------------------------------------------------------ plain CSV / Parquet
def _parse_hash_cell(path, cell, row: int):
    if cell is None or (isinstance(cell, float) and math.isnan(cell)):
        return np.empty(0, np.int64)
    text = str(cell).strip()
    if not text or text == "[]":
        return np.empty(0, np.int64)
    if text.startswith("["):
        try:
            v = json.loads(text)
        except json.JSONDecodeError:
            raise _fail(
                path, f"row {row + 1}: block_hashes {text[:40]!r} is not a JSON list of integers"
            ) from None
        if not isinstance(v, list):
            raise _fail(path, f"row {row + 1}: block_hashes {text[:40]!r} is not a list")
        return v
    parts = text.split()
    try:
        return [int(x) for x in parts]
    except ValueError:
        raise _fail(
            path,
            f"row {row + 1}: block_hashes {text[:40]!r} is not a list of "
            "integers (write '[1, 2, 3]' or '1 2 3')",
        ) from None


def _read_csv(path: Path, block_size: int | None) -> Workload:
    df = _csv_frame(path)
    if len(df) == 0:
        raise _fail(path, "has a header but no requests")
    if "block_hashes" in df.columns:
        df["block_hashes"] = pd.Series(
            [
                _parse_hash_cell(path, c, i)
                for i, c in enumerate(df["block_hashes"].to_numpy(dtype=object))
            ],
            dtype=object,
            index=df.index,
        )
    meta = {"provenance": {"format": "csv", "path": str(path)}}
    return _make(path, df, block_size, meta)


def _read_parquet(path: Path, block_size: int | None) -> Workload:
    try:
        import pyarrow.parquet as pq  # lazy: pyarrow is an optional extra (parquet)
    except ImportError:
        raise InputError("reading Parquet needs pyarrow; pip install 'eplb[parquet]'") from None
    try:
        info = pq.ParquetFile(path).metadata  # the footer: sizes checked before reading
        check_size("the Parquet table", (info.num_rows, max(info.num_columns, 1)), 8,
                   error=lambda msg: _fail(path, msg), fix="is the footer's row count right?")
        table = pq.read_table(path)
    except InputError:
        raise
    except Exception as exc:  # pyarrow raises several unrelated types for corrupt files
        raise _fail(path, f"not a readable Parquet file ({exc}); it may be truncated") from None
    md = table.schema.metadata or {}
    meta: dict = {}
    if b"eplb.workload.meta" in md:
        try:  # provenance only: metadata that is not a JSON object is left out
            meta = json.loads(md[b"eplb.workload.meta"])
        except (ValueError, RecursionError):  # bad JSON or UTF-8, a huge integer, deep
            meta = {}
        if not isinstance(meta, dict):
            meta = {}
    if block_size is None and b"eplb.workload.block_size" in md:
        text = md[b"eplb.workload.block_size"]
        if not (text.isascii() and text.strip().isdigit() and len(text) <= 18):
            raise _fail(path, f"schema metadata eplb.workload.block_size {text[:24]!r} is not "
                        "a whole number of tokens")
        block_size = int(text)
    df = table.to_pandas()
    if len(df) == 0:
        raise _fail(path, "holds no requests")
    if "block_hashes" in df.columns:
        df["block_hashes"] = pd.Series(
            [np.asarray(v) if v is not None else None for v in df["block_hashes"]],
            dtype=object,
            index=df.index,
        )
    meta = {
        **meta,
        "provenance": {
            "format": "parquet",
            "path": str(path),
            **({"source": meta["provenance"]} if isinstance(meta.get("provenance"), dict) else {}),
        },
    }
    return _make(path, df, block_size, meta)


# ------------------------------------------------------------------ writers
def write_format(path: str | os.PathLike, format: str | None = None) -> str:
    """The output format: ``format`` if given, else from the suffix of ``path``."""
    if format is not None:
        if format not in WRITE_FORMATS:
            raise InputError(
                f"cannot write workload format {format!r}; use one of {', '.join(WRITE_FORMATS)}"
            )
        return format
    suffix = Path(path).suffix.lower()
    if suffix not in _SUFFIXES:
        raise InputError(
            f"{path}: cannot tell the workload format from suffix "
            f"{suffix or 'none'!r}; use .jsonl (Mooncake), .csv or .parquet, or "
            f"pass format= (CLI: --format)"
        )
    return _SUFFIXES[suffix]


def dropped(workload: Workload, format: str) -> list[str]:
    """What ``format`` cannot hold of ``workload`` (named in the CLI's note)."""
    cols = workload.requests.columns
    out = []
    if format == "mooncake":
        df = workload.requests
        if not np.array_equal(df["request_id"].to_numpy(), np.arange(len(df))):
            out.append("request_id")  # re-read as 0..n-1
        if "session" in cols:
            out.append("session")
        out += [
            c
            for c in cols
            if c
            not in (
                "request_id",
                "arrival_s",
                "input_tokens",
                "output_tokens",
                "block_hashes",
                "session",
            )
        ]
        if workload.block_size != 512 and workload.has_hashes:
            out.append(f"block_size {workload.block_size} (Mooncake readers assume 512)")
    if format in ("mooncake", "csv") and workload.meta:
        out.append("meta")
    return out


def write(workload: Workload, path: str | os.PathLike, format: str | None = None) -> str:
    """Write ``workload`` to ``path`` atomically; returns the format used."""
    if not isinstance(workload, Workload):
        raise InputError(f"write() needs a Workload, got {type(workload).__name__}")
    fmt = write_format(path, format)
    {"mooncake": _write_mooncake, "csv": _write_csv, "parquet": _write_parquet}[fmt](workload, path)
    return fmt


def _write_mooncake(workload: Workload, path) -> None:
    df = workload.requests
    ms = df["arrival_s"].to_numpy() * 1000.0
    whole = np.all(ms == np.round(ms))
    hashes = df["block_hashes"].to_numpy() if workload.has_hashes else None
    with atomic_write(path, "w") as fh:
        for i, (t, a, b) in enumerate(
            zip(ms.tolist(), df["input_tokens"].tolist(), df["output_tokens"].tolist(), strict=True)
        ):
            rec = {
                "timestamp": int(t) if whole else round(t, 6),
                "input_length": a,
                "output_length": b,
            }
            if hashes is not None:
                rec["hash_ids"] = hashes[i].tolist()
            fh.write(json.dumps(rec) + "\n")


def _write_csv(workload: Workload, path) -> None:
    df = workload.requests.copy()
    if workload.has_hashes:
        df["block_hashes"] = [json.dumps(h.tolist()) for h in df["block_hashes"]]
    with atomic_write(path, "w") as fh:
        df.to_csv(fh, index=False)


def _write_parquet(workload: Workload, path) -> None:
    try:
        import pyarrow as pa  # lazy: pyarrow is an optional extra (parquet)
        import pyarrow.parquet as pq
    except ImportError:
        raise InputError("writing Parquet needs pyarrow; pip install 'eplb[parquet]'") from None
    df = workload.requests
    cols = {}
    for c in df.columns:
        if c == "block_hashes":
            cols[c] = pa.array([h for h in df[c]], type=pa.list_(pa.int64()))
        else:
            cols[c] = pa.array(df[c].to_numpy() if df[c].dtype != object else df[c].tolist())
    table = pa.table(cols)
    try:
        meta_text = json.dumps(workload.meta, default=_json_default)
    except (TypeError, ValueError) as exc:
        raise InputError(f"workload meta is not JSON serialisable ({exc})") from None
    md = dict(table.schema.metadata or {})
    md[b"eplb.workload.meta"] = meta_text.encode()
    md[b"eplb.workload.block_size"] = str(workload.block_size).encode()
    table = table.replace_schema_metadata(md)
    with atomic_write(path, "wb") as fh:
        pq.write_table(table, fh)


def _json_default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")
