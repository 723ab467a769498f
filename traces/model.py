"""The `Trace` model: expert-load counts per time window, per MoE layer, per logical expert.

``counts: float64[T, L, E]``, model ``layer_ids: int64[L]``, optional per-rank and token-level
arrays and JSON ``meta``; all checked and read-only. See docs/data.md, section "The Trace model".
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from eplb.args import as_int_array, check_bool, check_mapping, check_opt_number
from eplb.errors import InputError, TraceError
from eplb.loads import check_load
from eplb.tolerance import SUM_TOL

if TYPE_CHECKING:
    import pandas as pd

    # a window selection: an index, a slice, a list of indices or a boolean mask (None: all)
    Windows = int | slice | Sequence[int] | np.ndarray | None


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


@dataclass(frozen=True, eq=False)
class Trace:
    """Expert-load trace; arrays are converted, checked and made read-only on construction.

    - ``counts: float64[T, L, E]``: tokens routed to each expert in each window.
    - ``layer_ids: int64[L]``: model layer id of each row (default ``0..L-1``; distinct).
    - ``source_counts: float64[T, L, G_src, E]`` or ``None``: tokens from each source rank;
      ``source_counts.sum(axis=2) == counts`` (checked).
    - ``topk_ids: int16[N, L, K]`` + ``token_rank: int32[N]`` or ``None``: token-level routing
      of the whole trace (not of one window).
    - ``meta``: JSON-serialisable (``model``, ``num_groups``, ``top_k``, ``num_model_layers``,
      ``provenance``...).
    """

    counts: np.ndarray
    layer_ids: np.ndarray | None = None
    source_counts: np.ndarray | None = None
    topk_ids: np.ndarray | None = None
    token_rank: np.ndarray | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        try:
            counts = check_load(self.counts, name="counts", ndim=3)
        except InputError as exc:
            raise TraceError(str(exc)) from None
        object.__setattr__(self, "counts", counts)
        T, L, E = counts.shape
        object.__setattr__(self, "meta", check_mapping("meta", self.meta, error=TraceError))
        _check_routing_meta(self.meta, E)
        try:
            ids = np.arange(L) if self.layer_ids is None else np.asarray(self.layer_ids)
        except (TypeError, ValueError, OverflowError):
            ids = np.asarray(None)
        if ids.shape != (L,) or not np.issubdtype(ids.dtype, np.integer) or (
                ids.size and np.abs(ids).max() >= 2**62):
            raise TraceError(f"layer_ids must be {L} integers (one per layer), got "
                             f"{str(self.layer_ids)[:60]}")
        if len(np.unique(ids)) != L:
            raise TraceError(f"layer_ids must be distinct, got {ids.tolist()}")
        object.__setattr__(self, "layer_ids", _frozen(ids.astype(np.int64, copy=True)))
        if self.source_counts is not None:
            try:
                src = check_load(self.source_counts, name="source_counts", ndim=4)
            except InputError as exc:
                raise TraceError(str(exc)) from None
            if src.shape[:2] != (T, L) or src.shape[3] != E:
                raise TraceError(
                    f"source_counts has shape {src.shape}, expected [{T}, {L}, G_src, {E}]"
                )
            total = src.sum(axis=2)
            if not np.allclose(total, counts, rtol=SUM_TOL, atol=0):
                w, lyr, e = (int(i) for i in np.argwhere(
                    ~np.isclose(total, counts, rtol=SUM_TOL, atol=0))[0])
                raise TraceError(
                    f"source_counts summed over ranks is {total[w, lyr, e]} at window {w}, "
                    f"layer row {lyr}, expert {e} but counts is {counts[w, lyr, e]}; counts must "
                    "equal source_counts.sum(axis=2)"
                )
            object.__setattr__(self, "source_counts", src)
        if (self.topk_ids is None) != (self.token_rank is None):
            raise TraceError("topk_ids and token_rank come together; give both or neither")
        if self.topk_ids is not None:
            topk = as_int_array("topk_ids", self.topk_ids, error=TraceError)
            rank = as_int_array("token_rank", self.token_rank, error=TraceError)
            if topk.ndim != 3 or topk.shape[1] != L:
                raise TraceError(f"topk_ids must be int[N, {L}, K], got shape {topk.shape}")
            if rank.shape != (topk.shape[0],):
                raise TraceError(f"token_rank must be int[{topk.shape[0]}], got shape {rank.shape}")
            if E > 2**15:
                raise TraceError(f"token-level topk_ids are stored as int16: at most 32768 "
                                 f"experts, got {E}")
            if topk.size and (topk.min() < 0 or topk.max() >= E):
                raise TraceError(f"topk_ids must be expert ids in 0..{E - 1}")
            if rank.size and (rank.min() < 0 or rank.max() >= 2**31):
                raise TraceError("token_rank must be source ranks in 0..2**31-1")
            object.__setattr__(self, "topk_ids", _frozen(topk.astype(np.int16, copy=True)))
            object.__setattr__(self, "token_rank", _frozen(rank.astype(np.int32, copy=True)))

    # ------------------------------------------------------------------ sizes
    @property
    def num_windows(self) -> int:
        return self.counts.shape[0]

    @property
    def num_layers(self) -> int:
        return self.counts.shape[1]

    @property
    def num_experts(self) -> int:
        return self.counts.shape[2]

    def load(self, windows: Windows = None, *, ema: float | None = None) -> np.ndarray:
        """``float64[L, E]``: the load over ``windows`` (index, slice or list; default all).

        Default is the sum of the chosen windows. With ``ema=alpha`` (0 < alpha <= 1) it is the
        exponential moving average, the latest window weighted ``alpha``, the one before
        ``alpha * (1 - alpha)``, ...; weights are normalised to sum to the window count so the
        scale matches the sum.
        """
        ema = check_opt_number("ema", ema, 0, 1, lo_open=True, error=TraceError)
        sel = self.counts if windows is None else self.counts[self.window_index(windows)]
        if ema is None:
            return sel.sum(axis=0)
        T = sel.shape[0]
        w = ema * (1 - ema) ** np.arange(T - 1, -1, -1, dtype=np.float64)
        w *= T / w.sum()
        return np.tensordot(w, sel, axes=1)

    # -------------------------------------------------------------- slicing
    def window_index(self, windows: Windows = None) -> np.ndarray:
        """``int64[T']``: the window positions ``windows`` picks (int, slice, list or bool mask)."""
        allw = np.arange(self.num_windows)
        if windows is None:
            return allw
        try:
            if isinstance(windows, (bool, np.bool_)):
                raise TypeError("a single boolean is not a selection")
            idx = np.atleast_1d(allw[windows])
            if idx.ndim != 1:
                raise ValueError(f"it selects a {idx.ndim}-D block")
        except (IndexError, TypeError, ValueError, OverflowError) as exc:
            raise TraceError(
                f"windows {str(windows)[:40]} is not a valid selection of {self.num_windows} "
                f"windows (use an index, a slice, a list of indices or a boolean mask): {exc}"
            ) from None
        if idx.size == 0:
            raise TraceError(f"windows {windows!r} selects no window of {self.num_windows}")
        return idx

    def layer_index(self, layers: int | Iterable[int] | None = None) -> np.ndarray:
        """``int64[L']``: row positions of the model layer ids ``layers`` (int or iterable)."""
        if layers is None:
            return np.arange(self.num_layers)
        try:
            wanted = np.atleast_1d(np.asarray(list(layers) if isinstance(layers, Iterable)
                                              and not isinstance(layers, np.ndarray) else layers))
        except (TypeError, ValueError, OverflowError) as exc:
            raise TraceError(f"layers must be model layer ids: {exc}") from None
        if wanted.ndim != 1:
            raise TraceError(f"layers must be a flat list of model layer ids, got shape "
                             f"{wanted.shape}")
        if wanted.size == 0:
            raise TraceError("layers selects no layer; give model layer ids, e.g. layers=[3, 4]")
        if not np.issubdtype(wanted.dtype, np.integer):
            raise TraceError(f"layers must be model layer ids (integers), got {wanted.tolist()}")
        pos = {int(lid): i for i, lid in enumerate(self.layer_ids)}
        missing = [int(x) for x in wanted if int(x) not in pos]
        if missing:
            ids = self.layer_ids
            raise TraceError(
                f"layers {missing} are not in this trace; its model layer ids are "
                f"{ids.min()}..{ids.max()} ({self.num_layers} layers)"
            )
        return np.array([pos[int(x)] for x in wanted], dtype=np.int64)

    def select(
        self, windows: Windows = None, layers: int | Iterable[int] | None = None
    ) -> Trace:
        """A new trace with only ``windows`` (positions) and ``layers`` (model layer ids).

        ``source_counts`` is sliced alike. Token-level arrays are kept (sliced by layer) only
        when every window is kept in order; a window subset drops them (tokens carry no window).
        """
        w = self.window_index(windows)
        lpos = self.layer_index(layers)
        src = None
        if self.source_counts is not None:
            src = self.source_counts[w][:, lpos]
        topk = rank = None
        if self.topk_ids is not None and np.array_equal(w, np.arange(self.num_windows)):
            topk, rank = self.topk_ids[:, lpos], self.token_rank
        return Trace(self.counts[w][:, lpos], self.layer_ids[lpos], src, topk, rank,
                     meta=self.meta)

    # --------------------------------------------------------------- views
    def token_counts(self) -> np.ndarray:
        """``float64[L, E]``: per-layer bincount of ``topk_ids`` (picks per expert)."""
        if self.topk_ids is None:
            raise TraceError("this trace has no token-level topk_ids")
        N, L, K = self.topk_ids.shape
        E = self.num_experts
        flat = (self.topk_ids.astype(np.int64) + (np.arange(L) * E)[None, :, None]).ravel()
        return np.bincount(flat, minlength=L * E).reshape(L, E).astype(np.float64)

    def to_frame(self, *, by_rank: bool = False, nonzero: bool = False) -> pd.DataFrame:
        """Long pandas frame, one row per (window, layer, expert): columns ``window, layer,
        expert, count`` (``layer`` is the model layer id, ``window`` the window position).

        ``by_rank=True`` uses ``source_counts`` and adds a ``rank`` column (source rank) before
        ``count``. ``nonzero=True`` leaves out rows whose count is 0.
        """
        import pandas as pd  # lazy: pandas is heavy; start-up avoids it

        by_rank = check_bool("by_rank", by_rank, error=TraceError)
        nonzero = check_bool("nonzero", nonzero, error=TraceError)
        if by_rank:
            if self.source_counts is None:
                raise TraceError("by_rank=True needs source_counts, which this trace lacks")
            arr = self.source_counts
            names = ("window", "layer", "rank", "expert")
        else:
            arr = self.counts
            names = ("window", "layer", "expert")
        flat = arr.reshape(-1)
        grids = np.unravel_index(np.arange(flat.size, dtype=np.int64), arr.shape)
        if nonzero:
            keep = np.flatnonzero(flat)
            flat = flat[keep]
            grids = tuple(g[keep] for g in grids)
        cols = dict(zip(names, grids, strict=True))
        cols["layer"] = self.layer_ids[cols["layer"]]
        cols["count"] = flat
        order = ("window", "layer", "expert", "rank", "count") if by_rank else (
            "window", "layer", "expert", "count")
        return pd.DataFrame({k: cols[k] for k in order})

    def summary(self, windows: Windows = None, *, ema: float | None = None) -> pd.DataFrame:
        """Per-layer skew of ``load(windows, ema=ema)``: one row per layer with columns
        ``layer, tokens, max_over_mean, cv, gini, top1pct_share, top10pct_share``
        (see `traces.summary`)."""
        from eplb.traces.summary import skew_table  # lazy: it imports pandas

        return skew_table(self.load(windows, ema=ema), self.layer_ids)

    def equals(self, other: Trace, *, meta: bool = True) -> bool:
        """Same arrays (values and shapes) and, with ``meta=True``, the same JSON metadata."""
        if not isinstance(other, Trace):
            return False
        for name in ("counts", "layer_ids", "source_counts", "topk_ids", "token_rank"):
            a, b = getattr(self, name), getattr(other, name)
            if (a is None) != (b is None):
                return False
            if a is not None and not np.array_equal(a, b):
                return False
        if meta:
            return _json(self.meta) == _json(other.meta)
        return True

    def __repr__(self) -> str:
        extra = []
        if self.source_counts is not None:
            extra.append(f"{self.source_counts.shape[2]} source ranks")
        if self.topk_ids is not None:
            extra.append(f"{self.topk_ids.shape[0]} tokens x top-{self.topk_ids.shape[2]}")
        more = ", " + ", ".join(extra) if extra else ""
        return (
            f"Trace({self.num_windows} windows, {self.num_layers} layers, "
            f"{self.num_experts} experts{more})"
        )


def _check_routing_meta(meta: Mapping[str, Any], num_experts: int) -> None:
    """Refuse ``meta`` routing fields (``top_k``, ``num_groups``, ``topk_groups``) that are not
    whole numbers in range: a ``top_k`` of 0 or ``"eight"`` would give wrong answers later."""
    limits = {"top_k": num_experts, "num_groups": num_experts,
              "topk_groups": meta.get("num_groups") if isinstance(meta.get("num_groups"), int)
              else num_experts}
    for key, hi in limits.items():
        value = meta.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or \
                not 1 <= value <= hi:
            raise TraceError(f"meta {key} is {str(value)[:30]!r}; it must be a whole number in "
                             f"1..{hi} (or absent)")
    groups = meta.get("num_groups")
    if groups is not None and num_experts % int(groups):
        raise TraceError(f"meta num_groups {groups} does not divide the {num_experts} experts")


def _json(meta: Mapping[str, Any]) -> str:
    return json.dumps(dict(meta), sort_keys=True, default=json_default)


def json_default(obj: Any) -> Any:
    """``json.dumps(default=...)`` for numpy scalars and arrays inside ``meta``."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"meta value {obj!r} is not JSON serialisable")
