"""`Workload`: a frame of requests (arrival time, prompt and output lengths, prefix block hashes,
session), validated on construction (one `InputError` naming the column, the row and the fix);
the columns are in docs/serving.md, "Workloads"."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from eplb.args import check_int
from eplb.errors import InputError
from eplb.evaluation.serving.kvcache import KVStore, cached_tokens

__all__ = ["COLUMNS", "MAX_TOKENS", "Workload"]

COLUMNS = ("request_id", "arrival_s", "input_tokens", "output_tokens", "block_hashes", "session")
REQUIRED = ("arrival_s", "input_tokens", "output_tokens")
MAX_TOKENS = 100_000_000  # per request
_I64 = np.iinfo(np.int64)


def _show(value: object) -> str:
    """``repr`` of a cell as a user wrote it: numpy scalars as plain Python (``1``, ``nan``)."""
    text = repr(value.item() if isinstance(value, np.generic) else value)
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text)} characters)"


def _where(df: pd.DataFrame, pos: int) -> str:
    """``row 3`` (0-based position in the given frame) plus its request id when there is one."""
    if "request_id" in df.columns:
        return f"row {pos} (request_id {_show(df['request_id'].iloc[pos])})"
    return f"row {pos}"


def _numeric(df: pd.DataFrame, col: str) -> np.ndarray:
    """Column ``col`` as float64, refusing text and booleans with the first bad row."""
    s = df[col]
    if pd.api.types.is_bool_dtype(s.dtype):
        raise InputError(f"column {col!r} holds booleans; it needs numbers")
    t = pd.api.types
    if t.is_datetime64_any_dtype(s.dtype) or t.is_timedelta64_dtype(s.dtype) or \
            isinstance(s.dtype, pd.PeriodDtype):
        raise InputError(f"column {col!r} holds {s.dtype} values (dates or durations), read "
                         "as nanoseconds they would be wrong by 1e9; give seconds, e.g. "
                         "(t - t.min()).dt.total_seconds()")
    if not pd.api.types.is_numeric_dtype(s.dtype):
        try:
            conv = pd.to_numeric(s, errors="coerce")
        except (OverflowError, ValueError, TypeError):  # e.g. an integer of 400 digits
            conv = pd.Series([_float(v) for v in s.to_numpy(dtype=object)], index=s.index)
        bad = np.flatnonzero(conv.isna().to_numpy() & s.notna().to_numpy())
        if bad.size:
            i = int(bad[0])
            raise InputError(
                f"column {col!r}, {_where(df, i)}: {_show(s.iloc[i])} is not a number; "
                f"fix or drop that request"
            )
        if any(isinstance(v, bool) for v in s.head(1000)):
            raise InputError(f"column {col!r} holds booleans; it needs numbers")
        s = conv
    try:
        return s.to_numpy(dtype=np.float64, na_value=np.nan)
    except OverflowError:  # an integer beyond float range: inf, refused by the callers
        return np.array([_float(v) for v in s.to_numpy(dtype=object)], dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError(f"column {col!r} is not numeric ({exc})") from None


def _float(value: Any) -> float:
    try:
        return float(value)
    except OverflowError:
        return math.inf
    except (TypeError, ValueError):
        return math.nan


def _tokens(df: pd.DataFrame, col: str) -> np.ndarray:
    if isinstance(df[col].dtype, np.dtype) and df[col].dtype.kind in "iu":  # fast path: numpy
        # integers hold no NaN (pandas' nullable Int64 may hold NA: the checked path below)
        raw = df[col].to_numpy()
        if raw.dtype.kind == "u" and raw.size and raw.max() > _I64.max:
            i = int(np.argmax(raw > _I64.max))
            raise InputError(
                f"column {col!r}, {_where(df, i)}: {raw[i]} tokens is more than "
                f"{MAX_TOKENS:,}; is the unit right?"
            )
        v = raw.astype(np.int64, copy=False)
        bad = np.flatnonzero((v < 1) | (v > MAX_TOKENS))
    else:
        f = _numeric(df, col)
        bad = np.flatnonzero(~np.isfinite(f) | (f < 1) | (f > MAX_TOKENS) | (f != np.round(f)))
        v = None if bad.size else f.astype(np.int64)
    if bad.size:
        i = int(bad[0])
        x = df[col].iloc[i]
        fx = _float(x)  # NaN for a missing value (None, NaN, pandas' NA)
        if x is None or (isinstance(x, float) and not math.isfinite(x)) or math.isnan(fx):
            why = "is missing or not finite; every request needs a token count"
        elif fx > MAX_TOKENS:
            why = f"is more than {MAX_TOKENS:,} tokens; is the unit right?"
        elif fx != round(fx):
            why = "is not a whole number of tokens"
        else:
            why = "must be >= 1 (a request has at least one token); drop or fix the request"
        raise InputError(f"column {col!r}, {_where(df, i)}: {_show(x)} {why}")
    return v


def _hashes(entry: Any, df: pd.DataFrame, pos: int) -> np.ndarray:
    """One ``block_hashes`` entry as ``int64[b]`` (None / NaN / empty -> no blocks)."""
    if entry is None or (isinstance(entry, float) and math.isnan(entry)):
        return np.empty(0, np.int64)
    if isinstance(entry, np.ndarray):
        arr = entry
    elif isinstance(entry, (list, tuple)):
        if any(isinstance(h, bool) or not isinstance(h, (int, np.integer)) for h in entry):
            bad = next(
                h for h in entry if isinstance(h, bool) or not isinstance(h, (int, np.integer))
            )
            raise InputError(
                f"column 'block_hashes', {_where(df, pos)}: holds "
                f"{type(bad).__name__} {bad!r}; block hashes must be integers"
            )
        if not entry:
            return np.empty(0, np.int64)
        try:
            arr = np.asarray(entry, dtype=np.int64)
        except OverflowError:
            raise InputError(
                f"column 'block_hashes', {_where(df, pos)}: a hash does not fit "
                "in a signed 64-bit integer; hash into int64 first"
            ) from None
        return arr
    else:
        raise InputError(
            f"column 'block_hashes', {_where(df, pos)}: is {type(entry).__name__} "
            f"{str(entry)[:40]!r}; it must be a list of integer block hashes"
        )
    if arr.ndim != 1:
        raise InputError(
            f"column 'block_hashes', {_where(df, pos)}: has shape "
            f"{list(arr.shape)}; it must be a flat list of integers"
        )
    if arr.size == 0:
        return np.empty(0, np.int64)
    if arr.dtype.kind == "u":
        if arr.max() > _I64.max:
            raise InputError(
                f"column 'block_hashes', {_where(df, pos)}: a hash does not fit "
                "in a signed 64-bit integer; hash into int64 first"
            )
    elif arr.dtype.kind != "i":
        raise InputError(
            f"column 'block_hashes', {_where(df, pos)}: holds {arr.dtype} values; "
            f"block hashes must be integers"
        )
    return arr.astype(np.int64, copy=False)


def _check_frame(requests: pd.DataFrame, block_size: int) -> tuple[pd.DataFrame, list[str]]:
    if not isinstance(requests, pd.DataFrame):
        raise InputError(f"requests must be a pandas DataFrame, got {type(requests).__name__}")
    df = requests
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise InputError(
            f"requests frame lacks column(s) {', '.join(map(repr, missing))}; a "
            f"workload needs arrival_s (seconds), input_tokens and output_tokens "
            f"(found {', '.join(map(str, df.columns)) or 'no columns'})"
        )
    if df.columns.duplicated().any():
        dup = df.columns[df.columns.duplicated()][0]
        raise InputError(f"requests frame has column {dup!r} twice; keep one")
    n = len(df)
    notes: list[str] = []
    out = {}
    if "request_id" in df.columns:
        rid = _numeric(df, "request_id")
        bad = np.flatnonzero(~np.isfinite(rid) | (rid != np.round(rid)) | (np.abs(rid) > 2**62))
        if bad.size:
            i = int(bad[0])
            raise InputError(
                f"column 'request_id', row {i}: {_show(df['request_id'].iloc[i])} is not "
                "an integer id; use whole numbers (or drop the column to number "
                "requests 0..n-1)"
            )
        rid = (
            rid.astype(np.int64)
            if df["request_id"].dtype.kind not in "iu"
            else (df["request_id"].to_numpy().astype(np.int64))
        )
        dup = pd.Index(rid).duplicated()
        if dup.any():
            i = int(np.argmax(dup))
            raise InputError(
                f"column 'request_id': id {rid[i]} appears more than once (row {i}); "
                "request ids must be unique"
            )
    else:
        rid = np.arange(n, dtype=np.int64)
    out["request_id"] = rid
    arr = _numeric(df, "arrival_s")
    bad = np.flatnonzero(~np.isfinite(arr) | (arr < 0))
    if bad.size:
        i = int(bad[0])
        raise InputError(
            f"column 'arrival_s', {_where(df, i)}: {_show(df['arrival_s'].iloc[i])}; "
            "arrival times must be finite seconds >= 0"
        )
    out["arrival_s"] = arr
    out["input_tokens"] = _tokens(df, "input_tokens")
    out["output_tokens"] = _tokens(df, "output_tokens")
    if "block_hashes" in df.columns:
        col = df["block_hashes"]
        hashes = np.empty(n, dtype=object)
        for pos, entry in enumerate(col.to_numpy(dtype=object)):
            hashes[pos] = _hashes(entry, df, pos)
        nblocks = np.fromiter((h.size for h in hashes), dtype=np.int64, count=n)
        limit = -(-out["input_tokens"] // block_size)
        over = np.flatnonzero(nblocks > limit)
        if over.size:
            i = int(over[0])
            raise InputError(
                f"column 'block_hashes', {_where(df, i)}: {nblocks[i]} blocks, but "
                f"{out['input_tokens'][i]} input tokens fill at most {limit[i]} "
                f"blocks of {block_size}; pass the block_size the hashes were made "
                "with"
            )
        out["block_hashes"] = hashes
    if "session" in df.columns:
        s = df["session"]
        if s.isna().any():
            i = int(np.argmax(s.isna().to_numpy()))
            raise InputError(
                f"column 'session', {_where(df, i)}: missing; give every request a "
                "session id (or drop the column)"
            )
        if pd.api.types.is_numeric_dtype(s.dtype) and not pd.api.types.is_bool_dtype(s.dtype):
            v = s.to_numpy(dtype=np.float64)
            if (v != np.round(v)).any():
                i = int(np.argmax(v != np.round(v)))
                raise InputError(
                    f"column 'session', {_where(df, i)}: {_show(s.iloc[i])} is not a "
                    "whole-number id (or use text ids)"
                )
            out["session"] = v.astype(np.int64)
        else:
            out["session"] = s.astype(str).to_numpy(dtype=object)
    frame = pd.DataFrame(out)
    for c in df.columns:
        if c not in frame.columns:
            frame[c] = df[c].to_numpy()
    frame = frame[
        [c for c in COLUMNS if c in frame.columns] + [c for c in frame.columns if c not in COLUMNS]
    ]
    a = frame["arrival_s"].to_numpy()
    if n > 1 and (np.diff(a) < 0).any():
        moved = int((np.diff(a) < 0).sum())
        notes.append(
            f"rows were not in arrival order ({moved} step(s) back in time); sorted by "
            "arrival_s, keeping the file order among equal times"
        )
        frame = frame.iloc[np.argsort(a, kind="stable")]
    frame = frame.reset_index(drop=True)
    return frame, notes


class Workload:
    """Requests to serve: ``Workload(requests, block_size=512, meta=None)``.

    ``requests``: a frame with the columns of docs/serving.md, "Workloads"; validated, copied,
    sorted by ``arrival_s`` (stable). ``block_size``: tokens per hashed block. ``meta``: provenance
    (format, path, generator parameters) and ``notes`` (e.g. that rows were sorted).
    Treat ``.requests`` as read-only.
    """

    __slots__ = ("_frame", "block_size", "meta")

    def __init__(self, requests: pd.DataFrame, block_size: int = 512, meta: dict | None = None):
        if (
            isinstance(block_size, bool)
            or not isinstance(block_size, (int, np.integer))
            or not 1 <= block_size <= MAX_TOKENS
        ):
            raise InputError(
                f"block_size must be a whole number of tokens in 1..{MAX_TOKENS:,}, got "
                f"{block_size!r}"
            )
        if meta is not None and not isinstance(meta, dict):
            raise InputError(f"meta must be a dict, got {type(meta).__name__}")
        self.block_size = int(block_size)
        self._frame, notes = _check_frame(requests, self.block_size)
        self.meta = dict(meta or {})
        if notes:
            self.meta["notes"] = [*self.meta.get("notes", []), *notes]

    @classmethod
    def _trusted(cls, frame: pd.DataFrame, block_size: int, meta: dict) -> Workload:
        """Wrap an already validated, sorted frame (slices of a workload) without re-checking."""
        w = cls.__new__(cls)
        w._frame = frame.reset_index(drop=True)
        w.block_size = block_size
        w.meta = dict(meta)
        return w

    @property
    def requests(self) -> pd.DataFrame:
        """The request frame (sorted by arrival; do not modify it in place)."""
        return self._frame

    @property
    def has_hashes(self) -> bool:
        return "block_hashes" in self._frame.columns

    def __len__(self) -> int:
        return len(self._frame)

    def head(self, n: int = 5) -> Workload:
        """The first ``n`` requests by arrival, as a workload."""
        n = check_int("n", n, 0)
        return Workload._trusted(self._frame.head(n), self.block_size, self.meta)

    def select(self, rows) -> Workload:
        """Requests at positions ``rows`` (a slice, ``int[k]`` indices or a ``bool[n]`` mask),
        order kept."""
        idx = np.arange(len(self))[rows]
        return Workload._trusted(self._frame.iloc[np.sort(idx)], self.block_size, self.meta)

    def with_arrivals(self, arrival_s, note: str | None = None) -> Workload:
        """The same requests with new arrival times (validated and re-sorted)."""
        df = self._frame.copy()
        df["arrival_s"] = np.asarray(arrival_s, dtype=np.float64)
        meta = dict(self.meta)
        if note:
            meta["notes"] = [*meta.get("notes", []), note]
        return Workload(df, self.block_size, meta)

    def cached_tokens(self, capacity_blocks: float | None = None) -> np.ndarray:
        """``int64[n]``: prompt tokens a prefix cache of ``capacity_blocks`` (default unbounded)
        serves, replaying the requests in arrival order (each prompt is looked up, then cached).

        The idealised hit: the prompt's blocks are cached the moment it arrives (no prefill
        time), and a hit covers ``min(blocks * block_size, input_tokens)``. Zeros without
        ``block_hashes``.
        """
        n = len(self)
        out = np.zeros(n, dtype=np.int64)
        if not self.has_hashes or n == 0:
            return out
        store = KVStore(capacity_blocks, self.block_size)
        match, insert = store.match, store.insert
        for i, h in enumerate(self._frame["block_hashes"].to_numpy()):
            hs = h.tolist()
            out[i] = match(hs)
            insert(hs)
        return cached_tokens(out, self._frame["input_tokens"].to_numpy(), self.block_size)

    def summary(self) -> dict:
        """Count, span, rate, length percentiles and the unbounded-cache prefix-hit rate.

        ``rate_rps`` is ``(count - 1) / span_s`` (one over the mean gap between arrivals;
        ``nan`` for fewer than two requests or a zero span). ``prefix_hit_rate`` is
        token-weighted: ``sum(cached_tokens()) / sum(input_tokens)`` with an unbounded cache
        (0.0 without block hashes; see `cached_tokens`).
        """
        df = self._frame
        n = len(df)
        arr = df["arrival_s"].to_numpy()
        span = float(arr[-1] - arr[0]) if n else 0.0
        out: dict[str, Any] = {
            "count": n,
            "span_s": span,
            "rate_rps": (n - 1) / span if n > 1 and span > 0 else math.nan,
            "block_size": self.block_size,
        }
        for col, key in (("input_tokens", "input"), ("output_tokens", "output")):
            v = df[col].to_numpy()
            out[f"{key}_tokens_total"] = int(v.sum())
            if n:
                p50, p90, p99 = np.percentile(v, [50, 90, 99])
                out.update(
                    {
                        f"{key}_mean": float(v.mean()),
                        f"{key}_p50": float(p50),
                        f"{key}_p90": float(p90),
                        f"{key}_p99": float(p99),
                        f"{key}_max": int(v.max()),
                    }
                )
            else:
                out.update({f"{key}_{s}": math.nan for s in ("mean", "p50", "p90", "p99", "max")})
        out["has_block_hashes"] = self.has_hashes
        out["sessions"] = int(df["session"].nunique()) if "session" in df.columns else None
        total = out["input_tokens_total"]
        out["prefix_hit_rate"] = (float(self.cached_tokens().sum()) / total) if total else 0.0
        return out

    def equals(self, other: Workload, *, meta: bool = False) -> bool:
        """Same requests (every column, hashes element-wise) and block size; ``meta`` too if
        asked."""
        if not isinstance(other, Workload) or self.block_size != other.block_size:
            return False
        a, b = self._frame, other._frame
        if list(a.columns) != list(b.columns) or len(a) != len(b):
            return False
        for c in a.columns:
            if c == "block_hashes":
                if not all(np.array_equal(x, y) for x, y in zip(a[c], b[c], strict=True)):
                    return False
            elif not np.array_equal(a[c].to_numpy(), b[c].to_numpy()):
                return False
        return not meta or self.meta == other.meta

    def __repr__(self) -> str:
        n = len(self)
        if not n:
            return "Workload(0 requests)"
        df = self._frame
        span = float(df["arrival_s"].iloc[-1] - df["arrival_s"].iloc[0])
        rate = f", {(n - 1) / span:.3g} req/s" if n > 1 and span > 0 else ""
        extra = []
        if self.has_hashes:
            extra.append(f"block hashes of {self.block_size} tokens")
        if "session" in df.columns:
            extra.append(f"{df['session'].nunique()} sessions")
        return (
            f"Workload({n} requests over {span:.1f} s{rate}, input mean "
            f"{df['input_tokens'].mean():.0f}, output mean {df['output_tokens'].mean():.0f}"
            + (", " + ", ".join(extra) if extra else "")
            + ")"
        )
