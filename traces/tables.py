"""Long tables: CSV and Parquet with columns ``window, layer, expert, count[, rank]``.

A missing row is a zero count; every window needs rows for every layer. See docs/data.md,
section "Reading traces" (``csv`` / ``parquet``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from eplb.args import check_mapping
from eplb.errors import EplbError
from eplb.loads import MAX_COUNT
from eplb.safeload import check_size, json_loads
from eplb.traces.checks import fail, make_trace
from eplb.traces.model import Trace

if TYPE_CHECKING:
    import pandas as pd

_MAX_ID = 2**31  # window, layer, expert and rank ids beyond this are corrupt input

_LONG_KEYS = ("window", "layer", "expert")


def from_frame(
    df: pd.DataFrame, *, path: str | os.PathLike = "frame", meta: dict | None = None
) -> Trace:
    """Build a trace from a long frame with columns ``window, layer, expert, count[, rank]``."""
    import pandas as pd  # lazy: pandas is heavy; start-up avoids it


    if not isinstance(df, pd.DataFrame):
        raise fail(path, f"df must be a pandas DataFrame, got {type(df).__name__}")
    meta = check_mapping("meta", meta, error=lambda msg: fail(path, msg))
    cols = {str(c).strip().lower(): c for c in df.columns}
    missing = [c for c in (*_LONG_KEYS, "count") if c not in cols]
    if missing:
        raise fail(path, f"missing column(s) {', '.join(repr(m) for m in missing)}; a long "
                    f"trace table needs window, layer, expert, count (and optionally rank); "
                    f"found {', '.join(map(str, df.columns)) or 'no columns'}")
    if len(df) == 0:
        raise fail(path, "has a header but no rows; it needs one row per (window, layer, "
                    "expert)")
    keys = [*_LONG_KEYS, "rank"] if "rank" in cols else list(_LONG_KEYS)
    ints = {}
    for k in keys:
        ints[k] = _int_column(path, df[cols[k]], k)
    _check_kind(path, df[cols["count"]], "count")
    count = _numeric(df[cols["count"]])
    bad = np.flatnonzero(~np.isfinite(count) | (count < 0) | (count > MAX_COUNT))
    if bad.size:
        i = int(bad[0])
        raise fail(path, f"count on row {i + 1} is {str(df[cols['count']].iloc[i])[:30]!r}; "
                    "counts must be finite numbers >= 0 and <= 2**53 (9.0e15)")
    for k in ("window", "expert", "rank"):
        if k in ints and ints[k].min() < 0:
            i = int(np.argmax(ints[k] < 0))
            raise fail(path, f"{k} on row {i + 1} is {ints[k][i]}; {k} ids must be >= 0")
    for k in keys:
        if np.abs(ints[k]).max() >= _MAX_ID:
            i = int(np.argmax(np.abs(ints[k]) >= _MAX_ID))
            raise fail(path, f"{k} on row {i + 1} is {ints[k][i]}; {k} ids must be below 2**31")
    w_codes, w_uniq = pd.factorize(ints["window"], sort=True)
    l_codes, l_uniq = pd.factorize(ints["layer"], sort=False)
    T, L = len(w_uniq), len(l_uniq)
    E = int(ints["expert"].max()) + 1
    R = int(ints["rank"].max()) + 1 if "rank" in ints else 1
    r_codes = ints["rank"] if "rank" in ints else 0
    # the ids imply the dense size: checked before anything of that size is allocated (the
    # dense counts and the trace's copy of them)
    check_size("the dense trace", (T, L, R, E), 16, error=lambda msg: fail(path, msg),
               fix="are the window/layer/expert ids right?")
    wl = w_codes.astype(np.int64) * L + l_codes
    flat = (wl * R + r_codes) * E + ints["expert"]
    size = T * L * R * E
    cells, counts = np.unique(flat, return_counts=True)  # per row, not per dense cell
    if counts.max() > 1:
        cell = int(cells[np.argmax(counts > 1)])
        i = int(np.flatnonzero(flat == cell)[1])
        what = ", ".join(f"{k}={ints[k][i]}" for k in keys)
        raise fail(path, f"row {i + 1} repeats ({what}); each (window, layer, expert"
                    f"{', rank' if R > 1 or 'rank' in ints else ''}) needs one row (sum them)")
    seen = np.zeros(T * L, dtype=bool)
    seen[wl] = True
    seen = seen.reshape(T, L)
    if not seen.all():
        w, lyr = map(int, np.argwhere(~seen)[0])
        n0 = int(seen[0].sum()) if w else L
        raise fail(path, f"window {w_uniq[w]} has rows for {int(seen[w].sum())} layers but "
                    f"the trace has {L} (window {w_uniq[0] if w else w_uniq[-1]}: {n0}); "
                    f"layer {l_uniq[lyr]} is missing there. Mismatched layer counts between "
                    "windows: write zero counts explicitly")
    dense = np.zeros(size)
    dense[flat] = count
    if "rank" in ints:
        src = dense.reshape(T, L, R, E)
        return make_trace(path, src.sum(axis=2), np.asarray(l_uniq, dtype=np.int64), src, meta=meta)
    return make_trace(path, dense.reshape(T, L, E), np.asarray(l_uniq, dtype=np.int64), meta=meta)


def _numeric(col) -> np.ndarray:
    """float64 values of a column; anything that is not a number (or overflows) becomes NaN."""
    import pandas as pd  # lazy: pandas is heavy; start-up avoids it

    try:
        return pd.to_numeric(col, errors="coerce").to_numpy(np.float64)
    except (OverflowError, ValueError, TypeError):  # e.g. an integer of 400 digits
        out = np.empty(len(col))
        for i, v in enumerate(col.to_numpy()):
            try:
                out[i] = float(v)
            except (OverflowError, ValueError, TypeError):
                out[i] = np.nan
        return out


def _check_kind(path, col, name: str) -> None:
    """Refuse a column of booleans, dates or durations (pandas would read them as numbers)."""
    import pandas as pd  # lazy: pandas is heavy; start-up avoids it

    t = pd.api.types
    kind = ("booleans" if t.is_bool_dtype(col.dtype) else
            "dates" if t.is_datetime64_any_dtype(col.dtype) else
            "durations" if t.is_timedelta64_dtype(col.dtype) else None)
    if kind is None and col.dtype == object:
        first = next((v for v in col if v is not None), None)
        if isinstance(first, (bool, np.bool_)):
            kind = "booleans"
    if kind is not None:
        raise fail(path, f"column {name!r} holds {kind} ({str(col.iloc[0])[:30]!r} on row 1); "
                   f"{name} must hold {'counts' if name == 'count' else 'integer ids'}")


def _int_column(path, col, name: str) -> np.ndarray:
    import pandas as pd  # lazy: pandas is heavy; start-up avoids it

    _check_kind(path, col, name)
    if pd.api.types.is_integer_dtype(col.dtype) and col.dtype != np.uint64:
        if col.isna().any():  # a nullable integer column with missing values
            i = int(np.argmax(col.isna().to_numpy()))
            raise fail(path, f"{name} on row {i + 1} is missing; every row needs a {name} id")
        return col.to_numpy(np.int64)
    num = _numeric(col)
    bad = ~np.isfinite(num) | (num != np.round(num))
    if bad.any():
        i = int(np.argmax(bad))
        raise fail(path, f"{name} on row {i + 1} is {col.iloc[i]!r}; {name} must be an integer "
                    f"id (e.g. {name}=3)")
    return num.astype(np.int64)


def read_csv(path: str | os.PathLike) -> Trace:
    """The trace of a long CSV table."""
    import pandas as pd  # lazy: pandas is heavy; start-up avoids it

    try:
        df = pd.read_csv(path, skipinitialspace=True)
    except pd.errors.EmptyDataError:
        raise fail(path, "file is empty; a long trace CSV needs a header "
                    "window,layer,expert,count and rows") from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        raise fail(path, f"not a readable CSV ({str(exc).splitlines()[0]})") from None
    return from_frame(df, path=path, meta={"provenance": {"format": "csv", "path": str(path)}})


def read_parquet(path: str | os.PathLike) -> Trace:
    """The trace of a long Parquet table (``eplb.meta`` and ``eplb.shape`` metadata honoured)."""
    try:
        import pyarrow.parquet as pq  # lazy: pyarrow is an optional extra (parquet)
    except ImportError:
        raise fail(path, "reading Parquet needs pyarrow; install it with "
                    "pip install 'eplb[parquet]'") from None
    err = lambda msg: fail(path, msg)  # noqa: E731
    try:
        info = pq.ParquetFile(path).metadata  # the footer only: sizes checked before reading
        check_size("the Parquet table", (info.num_rows, max(info.num_columns, 1)), 8,
                   error=err, fix="is the row count in the file's footer right?")
        table = pq.read_table(path)
    except EplbError:
        raise
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ...
        raise fail(path, f"truncated or not a Parquet file ({str(exc).splitlines()[0]})"
                    ) from None
    md = table.schema.metadata or {}
    meta: dict[str, Any] = {"provenance": {"format": "parquet", "path": str(path)}}
    if b"eplb.meta" in md:
        try:
            text = md[b"eplb.meta"].decode()
        except UnicodeDecodeError as exc:
            raise fail(path, f"eplb.meta metadata is not UTF-8 ({exc})") from None
        meta = json_loads(text, "eplb.meta metadata", err)
        if not isinstance(meta, dict):
            raise fail(path, "eplb.meta metadata must be a JSON object")
    trace = from_frame(table.to_pandas(), path=path, meta=meta)
    if b"eplb.shape" in md:  # restore trailing all-zero experts the rows cannot show
        try:
            E = int(json_loads(md[b"eplb.shape"].decode(), "eplb.shape", err)["num_experts"])
        except (ValueError, KeyError, TypeError, UnicodeDecodeError, OverflowError):
            raise fail(path, "eplb.shape metadata is malformed") from None
        check_size("the trace padded to eplb.shape num_experts",
                   (trace.num_windows, trace.num_layers, max(E, 1)), 8, error=err)
        if E > trace.num_experts:
            pad = [(0, 0)] * 2 + [(0, E - trace.num_experts)]
            src = trace.source_counts
            trace = make_trace(path, np.pad(trace.counts, pad), trace.layer_ids,
                           None if src is None else np.pad(src, [(0, 0)] * 3 + pad[2:]),
                           meta=trace.meta)
    return trace

