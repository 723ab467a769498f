"""The next window's load from recent windows ``float[W, L, E]`` (``robust``): windows rescaled
to the latest total, then per layer the exponential moving average that predicted the history
best one window ahead; ``spread`` per expert. docs/solvers.md, "How the building blocks work".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ALPHAS = (1.0, 0.7, 0.5, 0.35, 0.25, 0.15, 0.1)  # EMA weights tried, newest-window weight


@dataclass(frozen=True)
class Forecast:
    """``load: float64[L, E]`` forecast of the next window; ``alpha: float64[L]`` the EMA
    weight chosen per layer; ``spread: float64[L, E]`` std of each expert over the windows;
    ``errors: float64[A, L]`` backtest squared errors of every weight in `ALPHAS`."""

    load: np.ndarray
    alpha: np.ndarray
    spread: np.ndarray
    errors: np.ndarray


def normalise(windows: np.ndarray) -> np.ndarray:
    """``float64[W, L, E]``: every window of ``windows: float[W, L, E]`` rescaled per layer to
    the latest window's layer
    total (to the mean total where the latest is empty; empty windows stay 0)."""
    windows = np.asarray(windows, dtype=np.float64)
    tot = windows.sum(-1, keepdims=True)  # [W, L, 1]
    target = np.where(tot[-1] > 0, tot[-1], tot.mean(0))  # [L, 1]
    scale = np.divide(target[None], tot, out=np.zeros_like(tot), where=tot > 0)
    return windows * scale


def backtest(windows: np.ndarray, alphas=ALPHAS) -> tuple[np.ndarray, np.ndarray]:
    """EMA forecasts of ``windows: float[W, L, E]`` after the last window ``float64[A, L, E]``
    and their one-step-ahead squared errors over the history ``float64[A, L]``, one per weight
    in ``alphas``."""
    a = np.asarray(alphas, dtype=np.float64)[:, None, None]
    f = np.broadcast_to(windows[0], (a.shape[0], *windows.shape[1:])).copy()
    err = np.zeros(f.shape[:2])
    for w in windows[1:]:
        err += ((f - w) ** 2).sum(-1)
        f = a * w + (1.0 - a) * f
    return f, err


def forecast(windows: np.ndarray, alphas=ALPHAS) -> Forecast:
    """`Forecast` of the window after ``windows: float[W, L, E]`` (docs/solvers.md)."""
    h = normalise(windows)
    f, err = backtest(h, alphas)
    scale = np.maximum(err.max(0, initial=0.0), 1.0)
    best = np.argmin(err / scale + 1e-12 * np.arange(len(alphas))[:, None], axis=0)  # [L]
    load = np.take_along_axis(f, best[None, :, None], 0)[0]
    spread = h.std(0) if h.shape[0] > 1 else np.zeros_like(load)
    return Forecast(load, np.asarray(alphas, dtype=np.float64)[best], spread, err)
