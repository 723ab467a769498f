"""Calibrated skew model: per-layer expert popularity drawn to match measured statistics.

Model of one layer's expert shares (``E`` experts in ``num_groups`` contiguous groups of ``M``):

    share[g, m] = P[g] * q[g, m]
    P = softmax(sigma_group * u),  q[g] = softmax(sigma_within * z[g])

``u: [num_groups]`` and ``z: [num_groups, M]`` are standardised draws (mean 0, std 1; ``z`` per
group) from the empirical shapes stored as quantile tables (``group_quantiles``,
``within_quantiles`` at ``levels``), so the tails are as heavy as measured, not Gaussian.
``sigma_group`` sets how unequal the groups are (what group-limited routing and hierarchical
placement see), ``sigma_within`` how unequal the experts inside a group are.

The tables (``traces/data/calibration-<model>.json``) are written by
``scripts/fit_calibration.py`` from real dumps; they hold only fitted numbers: per layer and
phase the centre and spread (across the measured workloads) of the two sigmas, the pooled
shape quantiles, and the measured per-layer statistics (``targets``) the fit was matched to.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from eplb.errors import TraceError
from eplb.traces import summary

DATA = Path(__file__).resolve().parent / "data"
MODELS = ("deepseek-v3",)
TARGET_STATS = ("max_over_mean", "cv", "gini", "top1pct_share", "top10pct_share", "group_cv")


def target_stats(load: np.ndarray, num_groups: int) -> dict[str, np.ndarray]:
    """The statistics the calibration matches, keyed by `TARGET_STATS`: per layer of
    ``load: float[..., E]`` (each value ``float[...]``); ``group_cv`` over ``num_groups``
    contiguous expert groups."""
    return {
        "max_over_mean": summary.max_over_mean(load),
        "cv": summary.cv(load),
        "gini": summary.gini(load),
        "top1pct_share": summary.top_share(load, 0.01),
        "top10pct_share": summary.top_share(load, 0.10),
        "group_cv": summary.group_cv(load, num_groups),
    }


def table_path(model: str) -> Path:
    return DATA / f"calibration-{model}.json"


@cache
def _load(model: str) -> str:
    path = table_path(model)
    if model not in MODELS or not path.is_file():
        raise TraceError(f"no calibration for model {model!r}; available: {', '.join(MODELS)}")
    return path.read_text(encoding="utf-8")


def load_table(model: str = "deepseek-v3") -> dict[str, Any]:
    """The fitted calibration table of ``model`` (a fresh dict each call)."""
    return json.loads(_load(model))


def phase_params(table: dict, phase: str) -> dict[str, Any]:
    phases = table["phases"]
    if phase not in phases:
        raise TraceError(f"unknown phase {phase!r} for {table['model']}; use one of "
                         f"{', '.join(phases)}")
    return phases[phase]


def draw_shape(levels, quantiles, shape, rng: np.random.Generator) -> np.ndarray:
    """Samples from the distribution whose quantile function interpolates ``quantiles``."""
    return np.interp(rng.random(shape), levels, quantiles)


def _standardise(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    x = x - x.mean(axis=axes[-1], keepdims=True)
    sd = np.sqrt((x**2).mean(axis=axes, keepdims=True))
    return x / np.where(sd > 0, sd, 1.0)


def shares(sigma_group, sigma_within, table: dict, rng: np.random.Generator, *,
           draws: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """``float64[..., E]`` expert shares (rows sum to 1) for ``sigma_group, sigma_within: [...]``.

    ``draws=(u, z)`` reuses standardised draws ``u: [..., G]``, ``z: [..., G, M]`` (the fitting
    script uses that to compare sigmas on common random numbers).
    """
    sg = np.asarray(sigma_group, dtype=np.float64)
    sw = np.asarray(sigma_within, dtype=np.float64)
    G = int(table["num_groups"])
    M = int(table["num_experts"]) // G
    if draws is None:
        draws = standard_draws(sg.shape, table, rng)
    u, z = draws
    P = _softmax(sg[..., None] * u)
    q = _softmax(sw[..., None, None] * z)
    return (P[..., None] * q).reshape(*sg.shape, G * M)


def standard_draws(shape: tuple[int, ...], table: dict, rng: np.random.Generator):
    """Standardised group draws ``u: [*shape, G]`` and within-group draws ``z: [*shape, G, M]``."""
    G = int(table["num_groups"])
    M = int(table["num_experts"]) // G
    lv = np.asarray(table["levels"])
    u = _standardise(draw_shape(lv, table["group_quantiles"], (*shape, G), rng), (-1,))
    z = _standardise(draw_shape(lv, table["within_quantiles"], (*shape, G, M), rng), (-2, -1))
    return u, z


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
