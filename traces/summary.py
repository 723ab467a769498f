"""Per-layer skew statistics of expert loads, vectorised over layers.

Every function takes ``load: float[..., E]`` and reduces the last axis; a row with no tokens
has NaN statistics. See docs/data.md, section "Skew statistics".
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from eplb.args import as_int_array, check_int, check_number
from eplb.errors import TraceError
from eplb.loads import MAX_COUNT, as_real_array


def _array(load) -> np.ndarray:
    arr = as_real_array(load, "load", error=TraceError)
    if arr.ndim < 1 or arr.shape[-1] == 0:
        raise TraceError(f"load must be float[..., E] with E >= 1 experts, got shape {arr.shape}")
    if not np.isfinite(arr).all() or (arr < 0).any() or (arr > MAX_COUNT).any():
        raise TraceError("load must hold finite counts in 0..2**53")
    return arr


def _rows(load) -> tuple[np.ndarray, np.ndarray]:
    arr = _array(load)
    total = arr.sum(axis=-1)
    return arr, total


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    return np.divide(a, b, out=np.full(np.broadcast(a, b).shape, np.nan), where=b > 0)


def max_over_mean(load: ArrayLike) -> np.ndarray:
    """``float64[...]``: hottest expert / mean expert of ``load: float[..., E]`` (1.0 = even)."""
    arr, _ = _rows(load)
    return _div(arr.max(axis=-1), arr.mean(axis=-1))


def cv(load: ArrayLike) -> np.ndarray:
    """``float64[...]``: coefficient of variation (population std / mean) of
    ``load: float[..., E]`` over experts."""
    arr, _ = _rows(load)
    return _div(arr.std(axis=-1), arr.mean(axis=-1))


def gini(load: ArrayLike) -> np.ndarray:
    """``float64[...]``: Gini coefficient of ``load: float[..., E]`` over experts, 0 (even) ..
    (E - 1) / E (one expert takes all)."""
    arr, total = _rows(load)
    E = arr.shape[-1]
    s = np.sort(arr, axis=-1)
    i = np.arange(1, E + 1, dtype=np.float64)
    return _div(2.0 * (s * i).sum(axis=-1), E * total) - (E + 1.0) / E


def top_count(num_experts: int, frac: float) -> int:
    """How many experts the "top ``frac``" means: ``max(1, ceil(frac * E))`` (1% of 256 -> 3)."""
    frac = check_number("frac", frac, 0, 1, lo_open=True, error=TraceError)
    return max(1, math.ceil(frac * num_experts - 1e-9))


def top_share(load: ArrayLike, frac: float) -> np.ndarray:
    """``float64[...]``: share of the tokens of ``load: float[..., E]`` taken by the
    `top_count` (``ceil(frac * E)``) hottest experts."""
    arr, total = _rows(load)
    k = top_count(arr.shape[-1], frac)
    top = -np.partition(-arr, k - 1, axis=-1)[..., :k]
    return _div(top.sum(axis=-1), total)


def group_cv(load: ArrayLike, num_groups: int) -> np.ndarray:
    """``float64[...]``: CV of ``load: float[..., E]`` summed over ``num_groups`` contiguous
    expert groups."""
    arr = _array(load)
    E = arr.shape[-1]
    num_groups = check_int("num_groups", num_groups, 1, error=TraceError)
    if E % num_groups:
        raise TraceError(f"num_groups {num_groups} must divide the {E} experts")
    return cv(arr.reshape(*arr.shape[:-1], num_groups, E // num_groups).sum(axis=-1))


STAT_COLUMNS = ("max_over_mean", "cv", "gini", "top1pct_share", "top10pct_share")


def skew_table(load: ArrayLike, layer_ids: ArrayLike | None = None) -> pd.DataFrame:
    """One row per layer of ``load: float[L, E]``: layer id (``layer_ids: int[L]``, default
    ``0..L-1``), tokens and the skew statistics."""
    arr = _array(load)
    if arr.ndim != 2:
        raise TraceError(f"skew_table wants load[L, E], got shape {arr.shape}")
    ids = np.arange(arr.shape[0]) if layer_ids is None else as_int_array(
        "layer_ids", layer_ids, error=TraceError)
    if ids.shape != (arr.shape[0],):
        raise TraceError(f"layer_ids must have one id per layer ({arr.shape[0]}), got shape "
                         f"{ids.shape}")
    return pd.DataFrame({
        "layer": ids.astype(np.int64),
        "tokens": arr.sum(axis=-1),
        "max_over_mean": max_over_mean(arr),
        "cv": cv(arr),
        "gini": gini(arr),
        "top1pct_share": top_share(arr, 0.01),
        "top10pct_share": top_share(arr, 0.10),
    })


SKEW_COLUMNS = ("max_over_mean", "cv", "gini", "top1pct_share", "top10pct_share")


def skew_overview(table: pd.DataFrame) -> pd.DataFrame:
    """Rows ``median`` and ``max`` over layers of a `skew_table`'s statistics (`SKEW_COLUMNS`)."""
    if not isinstance(table, pd.DataFrame) or any(c not in table for c in SKEW_COLUMNS):
        raise TraceError(f"table must be a skew_table frame with columns "
                         f"{', '.join(SKEW_COLUMNS)}")
    stats = table[list(SKEW_COLUMNS)]
    return pd.DataFrame({"median": stats.median(), "max": stats.max()}).T


def picks_spread(counts: ArrayLike) -> dict[str, float]:
    """``min``, ``median`` and ``max`` over windows and layers of the picks per (window,
    layer) of ``counts: float[T, L, E]``."""
    arr = _array(counts)
    if arr.ndim != 3:
        raise TraceError(f"picks_spread wants counts[T, L, E], got shape {arr.shape}")
    per = arr.sum(axis=2)  # [T, L]
    return {"min": float(per.min()), "median": float(np.median(per)), "max": float(per.max())}
