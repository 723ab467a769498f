"""Balance metrics of a placement on a load.

Definitions (per layer, over GPUs): balancedness = mean / max GPU load (what vLLM and SGLang
log; 1.0 is perfect), max/mean (its inverse), imbalance = (max - mean) / mean (TensorRT-LLM's).
A layer with no load counts as perfectly balanced.
"""

from __future__ import annotations

import numpy as np


def balancedness(gpu_load: np.ndarray) -> np.ndarray:
    """``float64[L]`` mean/max over GPUs of ``gpu_load: float[L, G]`` (1.0 for an idle layer)."""
    gpu_load = np.asarray(gpu_load, dtype=np.float64)
    mx = gpu_load.max(axis=-1)
    mean = gpu_load.mean(axis=-1)
    return np.divide(mean, mx, out=np.ones_like(mx), where=mx > 0)


def max_over_mean(gpu_load: np.ndarray) -> np.ndarray:
    """``float64[L]`` max/mean over GPUs of ``gpu_load: float[L, G]`` (1.0 for an idle layer)."""
    gpu_load = np.asarray(gpu_load, dtype=np.float64)
    mx = gpu_load.max(axis=-1)
    mean = gpu_load.mean(axis=-1)
    return np.divide(mx, mean, out=np.ones_like(mx), where=mean > 0)
