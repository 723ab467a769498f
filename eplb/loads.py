"""Checking load matrices at the API boundary, so bad input fails with a clear message."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from eplb.errors import InputError

# float64 counts integers exactly up to 2**53; a token count beyond that is corrupt input
# (e.g. an int64 overflow in the file), and sums of such counts would lose or overflow
MAX_COUNT = float(2**53)


def as_real_array(
    value: Any, name: str, error: Callable[[str], Exception] = InputError
) -> np.ndarray:
    """``value`` as ``float64[...]`` (same shape); booleans, strings, complex numbers and other
    objects are refused (never silently cast: ``True`` is not a count, ``1+2j`` loses its
    imaginary part)."""
    try:
        raw = np.asarray(value)
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise error(f"{name} must be a numeric array, could not convert: {exc}") from None
    kind = raw.dtype.kind
    if kind == "O":
        flat = raw.ravel()
        bad = [v for v in flat if isinstance(v, (bool, np.bool_)) or not isinstance(
            v, (int, float, np.integer, np.floating))][:1]
        if bad:
            raise error(f"{name} must be a numeric array (rows of equal length), got "
                        f"{type(value).__name__} holding {bad[0]!r}")
        try:
            return raw.astype(np.float64)
        except (TypeError, ValueError, OverflowError) as exc:
            raise error(f"{name} holds a number float64 cannot represent: {exc}") from None
    if kind == "b":
        raise error(f"{name} holds booleans; counts must be numbers")
    if kind == "c":
        raise error(f"{name} holds complex numbers; counts must be real")
    if kind not in "iuf":
        raise error(f"{name} must be a numeric array, got dtype {raw.dtype}"
                    + (" (strings)" if kind in "SU" else ""))
    return raw.astype(np.float64, copy=False)


def check_load(load: Any, *, name: str = "load", ndim: int = 2) -> np.ndarray:
    """Return ``load`` as a read-only float64 array after checking it.

    ``load: float[L, E]`` (``ndim=2``), ``float[T, L, E]`` (``ndim=3``) or
    ``float[T, L, G_src, E]`` (``ndim=4``): real, finite token counts in ``0..2**53``, at least
    one entry per axis. Raises `InputError` naming the first bad entry.
    """
    if not isinstance(ndim, int) or isinstance(ndim, bool) or not 1 <= ndim <= 4:
        raise InputError(f"ndim must be 1..4, got {str(ndim)[:30]}")
    if not isinstance(name, str):
        raise InputError(f"name must be a string, got {type(name).__name__}")
    arr = as_real_array(load, name)
    if arr.ndim != ndim:
        want = {2: "[layers, experts]", 3: "[windows, layers, experts]",
                4: "[windows, layers, ranks, experts]"}.get(ndim, f"{ndim}-D")
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
    big = arr > MAX_COUNT
    if big.any():
        idx = tuple(int(i) for i in np.argwhere(big)[0])
        raise InputError(f"{name}{list(idx)} is {arr[idx]:.6g}; counts must be <= 2**53 "
                         "(9.0e15): larger values are corrupt (an integer overflow?) and lose "
                         "precision as float64")
    if arr is load or arr.base is not None:  # never freeze the caller's array
        arr = arr.copy()
    arr.flags.writeable = False
    return arr
