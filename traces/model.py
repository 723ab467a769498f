"""The `Trace` model: expert-load counts per time window, per MoE layer, per logical expert.

Shapes (see DESIGN.md):

- ``counts: float64[T, L, E]``: tokens routed to each expert in each window.
- ``layer_ids: int64[L]``: model layer id of each row (dense layers are not stored).
- ``source_counts: float64[T, L, G_src, E]`` (optional): tokens from each source rank.
- ``topk_ids: int16[N, L, K]`` + ``token_rank: int32[N]`` (optional): token-level routing.
- ``meta``: ``model``, ``num_groups``, ``top_k``, ``num_model_layers``, ``provenance``...
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from eplb.errors import InputError, TraceError
from eplb.loads import check_load


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


@dataclass(frozen=True, eq=False)
class Trace:
    """Expert-load trace; arrays are converted, checked and made read-only on construction."""

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
        ids = np.arange(L) if self.layer_ids is None else np.asarray(self.layer_ids)
        if ids.shape != (L,) or not np.issubdtype(ids.dtype, np.integer):
            raise TraceError(f"layer_ids must be {L} integers (one per layer), got {ids!r}")
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
            object.__setattr__(self, "source_counts", src)
        if (self.topk_ids is None) != (self.token_rank is None):
            raise TraceError("topk_ids and token_rank come together; give both or neither")
        if self.topk_ids is not None:
            topk = np.asarray(self.topk_ids)
            rank = np.asarray(self.token_rank)
            if topk.ndim != 3 or topk.shape[1] != L or not np.issubdtype(topk.dtype, np.integer):
                raise TraceError(f"topk_ids must be int[N, {L}, K], got {topk.dtype}{topk.shape}")
            if rank.shape != (topk.shape[0],) or not np.issubdtype(rank.dtype, np.integer):
                raise TraceError(f"token_rank must be int[{topk.shape[0]}], got shape {rank.shape}")
            if topk.size and (topk.min() < 0 or topk.max() >= E):
                raise TraceError(f"topk_ids must be expert ids in 0..{E - 1}")
            if rank.size and rank.min() < 0:
                raise TraceError("token_rank must be >= 0")
            object.__setattr__(self, "topk_ids", _frozen(topk.astype(np.int16, copy=True)))
            object.__setattr__(self, "token_rank", _frozen(rank.astype(np.int32, copy=True)))
        object.__setattr__(self, "meta", dict(self.meta))

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

    def load(self, windows=None, *, ema: float | None = None) -> np.ndarray:
        """``float64[L, E]``: the load over ``windows`` (index, slice or list; default all).

        Default is the sum of the chosen windows. With ``ema=alpha`` (0 < alpha <= 1) it is the
        exponential moving average, the latest window weighted ``alpha``, the one before
        ``alpha * (1 - alpha)``, ...; weights are normalised to sum to the window count so the
        scale matches the sum.
        """
        sel = self.counts if windows is None else self.counts[windows]
        if sel.ndim == 2:
            sel = sel[None]
        if sel.shape[0] == 0:
            raise TraceError(f"windows {windows!r} selects no window of {self.num_windows}")
        if ema is None:
            return sel.sum(axis=0)
        if not (0 < ema <= 1):
            raise TraceError(f"ema must be in (0, 1], got {ema}")
        T = sel.shape[0]
        w = ema * (1 - ema) ** np.arange(T - 1, -1, -1, dtype=np.float64)
        w *= T / w.sum()
        return np.tensordot(w, sel, axes=1)

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
