"""Checking load matrices at the API boundary, so bad input fails with a clear message."""

from __future__ import annotations

import numpy as np

from eplb.errors import InputError


def check_load(load, *, name: str = "load", ndim: int = 2) -> np.ndarray:
    """Return ``load`` as a read-only float64 array after checking it.

    ``load: float[L, E]`` (``ndim=2``) or ``float[T, L, E]`` (``ndim=3``): non-negative,
    finite token counts. Raises `InputError` naming the first bad entry.
    """
    try:
        arr = np.asarray(load, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{name} must be a numeric array, could not convert: {exc}") from None
    if arr.ndim != ndim:
        want = "[layers, experts]" if ndim == 2 else "[windows, layers, experts]"
        raise InputError(
            f"{name} must be a {ndim}-D array {want}, got shape {arr.shape}"
            + ("; wrap a single layer as [[...]]" if ndim == 2 and arr.ndim == 1 else "")
        )
    if 0 in arr.shape:
        need = "window, layer and expert" if ndim == 3 else "layer and expert"
        raise InputError(f"{name} is empty (shape {arr.shape}); it needs >= 1 {need}")
    bad = ~np.isfinite(arr)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise InputError(f"{name}{list(idx)} is {arr[idx]}; counts must be finite")
    neg = arr < 0
    if neg.any():
        idx = tuple(int(i) for i in np.argwhere(neg)[0])
        raise InputError(f"{name}{list(idx)} is {arr[idx]}; counts must be >= 0")
    if arr is load:
        arr = arr.copy()
    arr.flags.writeable = False
    return arr
