"""Checks of scalar arguments at the public API boundary: each raises `InputError` naming the
argument, its value and what it should be (never a TypeError from deep inside numpy)."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from eplb.errors import InputError
from eplb.loads import as_real_array

_Error = Callable[[str], Exception]  # InputError, or a factory naming the file
_INTS = (int, np.integer)
_REALS = (int, float, np.integer, np.floating)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def is_int(value: Any) -> bool:
    return isinstance(value, _INTS) and not isinstance(value, (bool, np.bool_))


def check_int(
    name: str, value: Any, lo: int | None = None, hi: int | None = None, error: _Error = InputError
) -> int:
    """``value`` as an ``int`` in ``lo..hi`` (bounds inclusive, ``None`` = open)."""
    if lo in (0, 1):
        want = ("a positive integer" if lo == 1 else "a non-negative integer") + (
            f" (at most {hi})" if hi is not None else ""
        )
    elif lo is not None and hi is not None:
        want = f"an integer in {lo}..{hi}"
    elif lo is not None:
        want = f"an integer >= {lo}"
    else:
        want = "an integer" if hi is None else f"an integer <= {hi}"
    if not is_int(value) or (lo is not None and value < lo) or (hi is not None and value > hi):
        raise error(f"{name} must be {want}, got {_show(value)}")
    return int(value)


def check_opt_int(
    name: str, value: Any, lo: int | None = None, hi: int | None = None, error: _Error = InputError
) -> int | None:
    return None if value is None else check_int(name, value, lo, hi, error)


def check_number(
    name: str,
    value: Any,
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
    error: _Error = InputError,
) -> float:
    """``value`` as a finite ``float`` in the range (``lo_open``/``hi_open``: bound excluded)."""
    low = None if lo is None else f"{'>' if lo_open else '>='} {lo:g}"
    high = None if hi is None else f"{'<' if hi_open else '<='} {hi:g}"
    if lo == 0 and hi == 1:  # a fraction: interval notation reads best
        want = f"in {'(' if lo_open else '['}0, 1{')' if hi_open else ']'}"
    elif low and high:
        want = f"{low} and {high}"
    else:
        want = low or high or "a finite number"
    bad = not isinstance(value, _REALS) or isinstance(value, (bool, np.bool_))
    if not bad:
        try:
            number = float(value)
        except OverflowError:
            bad = True
        else:
            bad = (
                not math.isfinite(number)
                or (lo is not None and (number <= lo if lo_open else number < lo))
                or (hi is not None and (number >= hi if hi_open else number > hi))
            )
    if bad:
        raise error(f"{name} must be {want}, got {_show(value)}")
    return number


def check_opt_number(
    name: str, value: Any, lo: float | None = None, hi: float | None = None, **kw: Any
) -> float | None:
    return None if value is None else check_number(name, value, lo, hi, **kw)


def check_bool(name: str, value: Any, error: _Error = InputError) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise error(f"{name} must be True or False, got {_show(value)}")
    return bool(value)


def check_seed(name: str, value: Any, error: _Error = InputError) -> int:
    """A seed for ``numpy.random.default_rng``: an integer in ``0..2**63-1``."""
    return check_int(name, value, 0, 2**63 - 1, error)


def check_str(
    name: str, value: Any, choices: Collection[Any] | None = None, error: _Error = InputError
) -> str:
    if not isinstance(value, str):
        raise error(f"{name} must be a string, got {_show(value)}")
    if choices is not None and value not in choices:
        raise error(f"{name} must be one of {', '.join(map(str, choices))}, got {value!r}")
    return value


def check_mapping(name: str, value: Any, error: _Error = InputError) -> dict:
    """``value`` as a dict (``None`` -> ``{}``)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise error(f"{name} must be a mapping (dict), got {_show(value)}")
    return dict(value)


def check_type(
    name: str, value: Any, cls: type | tuple[type, ...], what: str, error: _Error = InputError
) -> Any:
    if not isinstance(value, cls):
        raise error(f"{name} must be {what}, got {type(value).__name__}")
    return value


__all__ = [
    "check_bool",
    "check_int",
    "check_mapping",
    "check_number",
    "check_opt_int",
    "check_opt_number",
    "check_seed",
    "check_str",
    "check_type",
    "is_int",
]


def as_int_array(
    name: str, value: Any, ndim: int | None = None, error: _Error = InputError
) -> np.ndarray:
    """``value`` as ``int64[...]`` (of ``ndim`` dimensions if given); floats, booleans, strings
    and ragged lists are refused."""
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise error(f"{name} must be an integer array: {str(exc).splitlines()[0]}") from None
    if ndim is not None and arr.ndim != ndim:
        raise error(f"{name} must be a {ndim}-D integer array, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise error(f"{name} must be integers (an int array), got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and arr.size and arr.max() >= 2**63:
        raise error(f"{name} holds {arr.max()}, beyond int64")
    return arr.astype(np.int64, copy=False)


def as_float_array(
    name: str,
    value: Any,
    dtype: DTypeLike = np.float64,
    ndim: int | None = None,
    error: _Error = InputError,
) -> np.ndarray:
    """``value`` as a finite real ``dtype[...]`` array (values beyond its range are refused,
    not turned into ``inf`` with a warning)."""

    arr = as_real_array(value, name, error=error)
    if ndim is not None and arr.ndim != ndim:
        raise error(f"{name} must be a {ndim}-D array, got shape {arr.shape}")
    if arr.size and not np.isfinite(arr).all():
        idx = tuple(int(i) for i in np.argwhere(~np.isfinite(arr))[0])
        raise error(f"{name}{list(idx)} is {arr[idx]}; values must be finite")
    dt = np.dtype(dtype)
    if arr.size and dt != np.float64 and np.abs(arr).max() > np.finfo(dt).max:
        raise error(f"{name} holds {np.abs(arr).max():.3g}, beyond the {dt} range")
    return arr.astype(dt, copy=False)
