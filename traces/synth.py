"""Seeded synthetic trace generators.

Every generator takes ``seed`` and returns a `Trace`; same arguments, same trace.
"""

from __future__ import annotations

import numpy as np

from eplb.errors import TraceError
from traces.model import Trace


def _check_sizes(**sizes: int) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise TraceError(f"{name} must be a positive integer, got {value!r}")


def zipf(
    num_layers: int = 58,
    num_experts: int = 256,
    *,
    windows: int = 1,
    tokens: int = 16384,
    top_k: int = 8,
    skew: tuple[float, float] = (0.6, 1.1),
    seed: int = 0,
) -> Trace:
    """Zipf-shaped loads: expert of popularity rank ``r`` gets weight ``r ** -s``.

    Each layer draws its exponent ``s`` uniformly from ``skew`` and its own random ranking of
    experts; each window samples ``tokens * top_k`` picks multinomially from those weights.
    ``counts: float64[windows, num_layers, num_experts]``.
    """
    _check_sizes(
        num_layers=num_layers, num_experts=num_experts, windows=windows, tokens=tokens, top_k=top_k
    )
    lo, hi = skew
    if not (0 <= lo <= hi):
        raise TraceError(f"skew must be (low, high) with 0 <= low <= high, got {skew}")
    rng = np.random.default_rng(seed)
    s = rng.uniform(lo, hi, size=num_layers)
    ranks = np.argsort(rng.random((num_layers, num_experts)), axis=1) + 1.0
    p = ranks ** -s[:, None]
    p /= p.sum(axis=1, keepdims=True)
    counts = np.stack([rng.multinomial(tokens * top_k, p) for _ in range(windows)]).astype(float)
    meta = {
        "model": "synthetic",
        "top_k": top_k,
        "provenance": {"generator": "zipf", "seed": seed, "skew": list(skew), "tokens": tokens},
    }
    return Trace(counts, meta=meta)
