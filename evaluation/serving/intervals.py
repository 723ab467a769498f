"""Confidence intervals over seeds: `mean_ci` (Student t on per-seed values) and `ci_table`
(per config: mean and 95% interval of each metric and of its paired difference to a baseline,
seed by seed)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import stats

from eplb.errors import InputError

__all__ = ["ci_table", "mean_ci"]


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """``(mean, lo, hi)`` of ``values`` (one per seed; NaNs dropped): the Student-t interval of
    the mean at ``level``; ``lo = hi = mean`` when the values agree, NaN bounds with one value."""
    x = np.asarray(values, dtype=np.float64)
    x = x[~np.isnan(x)]
    if x.size == 0:
        return math.nan, math.nan, math.nan
    m = float(x.mean())
    if x.size == 1:
        return m, math.nan, math.nan
    half = float(stats.t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return m, m - half, m + half


def ci_table(
    frame: pd.DataFrame,
    metrics: Sequence[str],
    baseline: str | None = None,
    level: float = 0.95,
) -> pd.DataFrame:
    """Per config (rows, in ``frame``'s order): for each metric ``mean``, ``lo``, ``hi`` over
    seeds and, against ``baseline`` (default ``frame.attrs["baseline"]`` or the first config),
    the paired difference ``d_mean``, ``d_lo``, ``d_hi`` (config minus baseline, seed by seed).

    ``frame``: one row per ``(config, seed)`` with the metric columns."""
    for col in ("config", "seed"):
        if col not in frame:
            raise InputError(f"ci_table needs a {col!r} column")
    order = list(dict.fromkeys(frame["config"]))
    base = baseline or frame.attrs.get("baseline") or order[0]
    if base not in order:
        raise InputError(f"baseline {base!r} is not one of the configs: {', '.join(order)}")
    missing = [m for m in metrics if m not in frame]
    if missing:
        raise InputError(f"unknown metric(s) {', '.join(missing)}; known: {', '.join(frame)}")
    ref = frame[frame["config"] == base].set_index("seed")
    rows = []
    for name in order:
        part = frame[frame["config"] == name].set_index("seed")
        rec: dict[tuple[str, str], float] = {}
        for m in metrics:
            rec[(m, "mean")], rec[(m, "lo")], rec[(m, "hi")] = mean_ci(part[m], level)
            paired = part[m] - ref[m].reindex(part.index)
            rec[(m, "d_mean")], rec[(m, "d_lo")], rec[(m, "d_hi")] = mean_ci(paired, level)
        rows.append(rec)
    out = pd.DataFrame(rows, index=pd.Index(order, name="config"))
    out.columns = pd.MultiIndex.from_tuples(out.columns)
    out.attrs["baseline"] = base
    out.attrs["level"] = level
    return out
