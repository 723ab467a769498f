"""Confidence intervals over seeds: `mean_ci` (Student t on per-seed values), `proportion_ci`
(a fraction of requests: Wilson's score interval, within [0, 1]) and `ci_table` (per config:
mean and 95% interval of each metric and of its paired difference to a baseline, seed by
seed; fractions by `proportion_ci`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import stats

from eplb.errors import InputError
from eplb.evaluation.serving.metrics import FRACTIONS

__all__ = ["ci_table", "fraction_ci", "mean_ci", "proportion_ci"]


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


def proportion_ci(fractions: Sequence[float], trials: Sequence[float],
                  level: float = 0.95) -> tuple[float, float, float]:
    """``(p, lo, hi)`` for a fraction of requests measured once per seed: ``fractions[s]`` of
    ``trials[s]`` requests (NaN or 0 trials dropped). ``p`` pools the seeds (successes over
    trials); ``[lo, hi]`` is Wilson's score interval at ``level``, which stays within [0, 1]
    (also at 0 and 1, where a mean +- t s interval leaves it), on the pooled count with its
    sample size divided by the over-dispersion between seeds (Pearson's chi-square over
    ``seeds - 1`` degrees of freedom, when above 1): seeds that disagree more than binomial
    sampling explains widen it. NaN bounds without trials."""
    f = np.asarray(fractions, dtype=np.float64)
    n = np.asarray(trials, dtype=np.float64)
    ok = ~np.isnan(f) & ~np.isnan(n) & (n > 0)
    f, n = f[ok], n[ok]
    if not n.size:
        return math.nan, math.nan, math.nan
    k = f * n
    total = float(n.sum())
    p = float(k.sum() / total)
    phi = 1.0
    if n.size > 1 and 0 < p < 1:
        chi2 = float((((k - n * p) ** 2) / (n * p * (1 - p))).sum())
        phi = max(1.0, chi2 / (n.size - 1))
    m = total / phi
    z = float(stats.norm.ppf(0.5 + level / 2))
    den = 1 + z * z / m
    centre = (p + z * z / (2 * m)) / den
    half = z * math.sqrt(p * (1 - p) / m + z * z / (4 * m * m)) / den
    lo = 0.0 if p == 0 else min(max(0.0, centre - half), p)  # exactly 0 / 1 at the ends
    hi = 1.0 if p == 1 else max(min(1.0, centre + half), p)
    return p, lo, hi


def fraction_ci(fractions: Sequence[float], trials: Sequence[float] | None = None,
                level: float = 0.95) -> tuple[float, float, float]:
    """A fraction's ``(p, lo, hi)`` over seeds: `proportion_ci` when the ``trials`` behind
    each seed's fraction are known; else the Student-t interval of the mean (`mean_ci`)
    intersected with [0, 1], where a fraction lies."""
    if trials is not None:
        return proportion_ci(fractions, trials, level)
    m, lo, hi = mean_ci(fractions, level)
    return m, (max(lo, 0.0) if lo == lo else lo), (min(hi, 1.0) if hi == hi else hi)


def ci_table(
    frame: pd.DataFrame,
    metrics: Sequence[str],
    baseline: str | None = None,
    level: float = 0.95,
) -> pd.DataFrame:
    """Per config (rows, in ``frame``'s order): for each metric ``mean``, ``lo``, ``hi`` over
    seeds and, against ``baseline`` (default ``frame.attrs["baseline"]`` or the first config),
    the paired difference ``d_mean``, ``d_lo``, ``d_hi`` (config minus baseline, seed by seed;
    Student t, within [-1, 1] for a fraction). A fraction of requests (`metrics.FRACTIONS`)
    gets `fraction_ci` (with its count column in ``frame``, Wilson's interval pooled over the
    seeds), within [0, 1]; other metrics `mean_ci`.

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
            count = FRACTIONS.get(m)
            rec[(m, "mean")], rec[(m, "lo")], rec[(m, "hi")] = (
                mean_ci(part[m], level) if count is None
                else fraction_ci(part[m], part[count] if count in part else None, level))
            paired = part[m] - ref[m].reindex(part.index)
            d = mean_ci(paired, level)
            if count is not None:  # a difference of two fractions lies in [-1, 1]
                d = (d[0], max(d[1], -1.0), min(d[2], 1.0))
            rec[(m, "d_mean")], rec[(m, "d_lo")], rec[(m, "d_hi")] = d
        rows.append(rec)
    out = pd.DataFrame(rows, index=pd.Index(order, name="config"))
    out.columns = pd.MultiIndex.from_tuples(out.columns)
    out.attrs["baseline"] = base
    out.attrs["level"] = level
    return out
