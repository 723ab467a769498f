"""What a unit's steps routed, recorded as its engine's expert-distribution recorder does
(`Recorder`: SGLang's sums each forward pass's counts): the load EPLB places from."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["Recorder"]


class Recorder:
    """Recorded expert load ``float64[L, E]`` per bucket of ``bucket_s`` seconds."""

    def __init__(self, num_layers: int, num_experts: int, bucket_s: float, keep_s: float):
        self.shape = (num_layers, num_experts)
        self.bucket_s = float(bucket_s)
        self.keep = max(int(math.ceil(keep_s / self.bucket_s)) + 2, 2)
        self._buckets: dict[int, np.ndarray] = {}
        self._cur_key: int | None = None
        self._cur: np.ndarray | None = None

    def add(self, t: float, counts: np.ndarray) -> None:
        """Record a step's ``counts: float[L, E]`` at time ``t`` (the step's start)."""
        key = math.floor(t / self.bucket_s)
        if key != self._cur_key:
            cur = self._buckets.get(key)
            if cur is None:
                cur = self._buckets[key] = np.zeros(self.shape)
                for old in [k for k in self._buckets if k < key - self.keep]:
                    del self._buckets[old]
            self._cur_key, self._cur = key, cur
        self._cur += counts

    def load(self, t0: float, t1: float) -> np.ndarray:
        """``float64[L, E]``: counts of the buckets starting in ``[t0, t1)``."""
        out = np.zeros(self.shape)
        lo, hi = t0 / self.bucket_s, t1 / self.bucket_s
        for key, arr in self._buckets.items():
            if lo <= key < hi:
                out += arr
        return out
