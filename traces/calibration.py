"""Calibrated skew model: per-layer expert popularity drawn to match measured statistics.

``share[g, m] = softmax(sigma_group * u)[g] * softmax(sigma_within * z[g])[m]`` with ``u``, ``z``
drawn from fitted quantile tables (``traces/data/calibration-<model>.json``). See docs/data.md,
section "The calibrated skew model".
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

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
    """Where the calibration table of ``model`` lives (``traces/data/calibration-<model>.json``)."""
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
    """The fitted parameters of ``phase`` in ``table`` (e.g. ``all``, ``prefill``, ``decode``)."""
    phases = table["phases"]
    if phase not in phases:
        raise TraceError(f"unknown phase {phase!r} for {table['model']}; use one of "
                         f"{', '.join(phases)}")
    return phases[phase]


def draw_shape(
    levels: ArrayLike, quantiles: ArrayLike, shape: tuple[int, ...], rng: np.random.Generator
) -> np.ndarray:
    """``float64[*shape]`` samples from the distribution whose quantile function interpolates
    ``quantiles`` at ``levels`` (both ``float[Q]``)."""
    return np.interp(rng.random(shape), levels, quantiles)


def _standardise(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    x = x - x.mean(axis=axes[-1], keepdims=True)
    sd = np.sqrt((x**2).mean(axis=axes, keepdims=True))
    return x / np.where(sd > 0, sd, 1.0)


def shares(sigma_group: ArrayLike, sigma_within: ArrayLike, table: dict,
           rng: np.random.Generator, *,
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


def standard_draws(
    shape: tuple[int, ...], table: dict, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
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
