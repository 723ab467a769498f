"""Checks of what users pass to solvers (loads, layer ids, groups, seeds, options) and the
option annotations (``NonNegInt``, ``Range``, ...): every check raises an `InputError` naming
the argument. docs/solvers.md, "How the building blocks work".
"""

from __future__ import annotations

import math
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

import numpy as np

from eplb.errors import InputError
from eplb.loads import check_load

MAX_LAYER_TOTAL = float(2**53)  # tokens per layer: beyond this float64 counts lose integers
MAX_ELEMENTS = 2**28  # largest [L, P] or [L, E, G] table a solver may allocate


def _bound(value: float) -> str:
    """A bound as text: integers in full (``2147483647``), other numbers as ``%g``."""
    return str(int(value)) if float(value).is_integer() and abs(value) < 2**53 else f"{value:g}"


@dataclass(frozen=True)
class Range:
    """Bounds of a numeric option: ``lo <= value`` (``lo < value`` if ``open_lo``), ``<= hi``."""

    lo: float | None = None
    hi: float | None = None
    open_lo: bool = False

    def describe(self) -> str:
        parts = []
        if self.lo is not None:
            parts.append(f"{'>' if self.open_lo else '>='} {_bound(self.lo)}")
        if self.hi is not None:
            parts.append(f"<= {_bound(self.hi)}")
        return " and ".join(parts)

    def holds(self, value: float) -> bool:
        if self.lo is not None and (value <= self.lo if self.open_lo else value < self.lo):
            return False
        return self.hi is None or value <= self.hi


NonNegInt = Annotated[int, Range(0)]
PositiveInt = Annotated[int, Range(1)]
# threads per layer: CP-SAT's num_workers and SCIP's thread count are 32-bit integers
Threads = Annotated[int, Range(1, 2**31 - 1)]
NonNegFloat = Annotated[float, Range(0.0)]
PositiveFloat = Annotated[float, Range(0.0, open_lo=True)]


# --------------------------------------------------------------------------- scalars
def _is_bool(value) -> bool:
    return isinstance(value, (bool, np.bool_))


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not _is_bool(value)


def _is_real(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not _is_bool(value)


def check_int(name: str, value, *, lo: int | None = None, hi: int | None = None) -> int:
    """``value`` as an ``int`` in ``[lo, hi]``; `InputError` otherwise."""
    if not _is_int(value):
        raise InputError(f"{name} must be an integer, got {value!r}")
    v = int(value)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = Range(lo, hi).describe()
        raise InputError(f"{name} must be an integer {rng}, got {v}")
    return v


def check_number(
    name: str, value, *, lo: float | None = None, open_lo: bool = False, hi: float | None = None
) -> float:
    """``value`` as a finite ``float`` within the bounds; `InputError` otherwise."""
    if not _is_real(value):
        raise InputError(f"{name} must be a number, got {value!r}")
    try:
        v = float(value)
    except OverflowError:
        raise InputError(f"{name} is too large: {value!r}") from None
    if not math.isfinite(v):
        raise InputError(f"{name} must be a finite number, got {value!r}")
    rng = Range(lo, hi, open_lo)
    if not rng.holds(v):
        raise InputError(f"{name} must be a number {rng.describe()}, got {value!r}")
    return v


def check_seed(seed, *, hi: int | None = None) -> int:
    """A seed: an integer ``>= 0`` (and ``<= hi`` when the solver has a limit)."""
    if not _is_int(seed):
        raise InputError(f"seed must be a non-negative integer, got {seed!r}")
    s = int(seed)
    if s < 0:
        raise InputError(f"seed must be a non-negative integer, got {s}")
    if hi is not None and s > hi:
        raise InputError(f"seed {s} is too large for this solver; use a seed in 0..{hi}")
    return s


def check_time_limit(time_limit) -> float | None:
    """``None`` or a finite number of seconds ``> 0`` (``inf`` is refused: omit the limit)."""
    if time_limit is None:
        return None
    if not _is_real(time_limit):
        raise InputError(f"time_limit must be a number of seconds, got {time_limit!r}")
    t = float(time_limit)
    if math.isinf(t):
        raise InputError(
            "time_limit must be a finite number of seconds > 0, got inf; omit it (None) for "
            "the solver's default limit"
        )
    if not t > 0:
        raise InputError(f"time_limit must be a finite number of seconds > 0, got {time_limit!r}")
    return t


# --------------------------------------------------------------------------- arrays
def check_solver_load(load, *, name: str = "load") -> np.ndarray:
    """``load: float64[L, E]`` read-only: real numbers only (no booleans, complex numbers or
    strings), finite, ``>= 0``, every layer total ``<= 2**53``."""
    if not isinstance(load, np.ndarray):
        try:
            arr = np.asarray(load)
        except (TypeError, ValueError, OverflowError) as exc:
            raise InputError(f"{name} must be a numeric array [layers, experts]: {exc}") from None
    else:
        arr = load
    if arr.dtype.kind not in "iuf":
        what = {
            "b": "booleans",
            "c": "complex numbers",
            "U": "strings",
            "S": "bytes",
            "O": "Python objects",
            "M": "dates",
            "m": "time deltas",
        }.get(arr.dtype.kind, str(arr.dtype))
        raise InputError(
            f"{name} must hold real token counts (integers or floats), got {what} "
            f"(dtype {arr.dtype})"
        )
    out = check_load(arr, name=name)
    with np.errstate(over="ignore"):
        total = out.sum(1)
    big = ~(total <= MAX_LAYER_TOTAL)
    if big.any():
        layer = int(np.argmax(big))
        raise InputError(
            f"{name} row {layer} totals {total[layer]:.3g} tokens, above the limit 2**53 "
            f"(~9.0e15) where float64 counts stop being exact; rescale the loads"
        )
    return out


def check_solver_windows(load, *, name: str = "load") -> np.ndarray:
    """``load: float64[W, L, E]`` read-only for a policy that takes windows: a ``[L, E]`` load
    is one window; each window is checked as `check_solver_load` checks a load."""
    arr = load if isinstance(load, np.ndarray) else None
    if arr is None:
        try:
            arr = np.asarray(load)
        except (TypeError, ValueError, OverflowError) as exc:
            raise InputError(
                f"{name} must be a numeric array [windows, layers, experts]: {exc}"
            ) from None
    if arr.ndim == 2:
        arr = arr[None]
    if arr.ndim != 3 or 0 in arr.shape:
        raise InputError(
            f"{name} must be [windows, layers, experts] (or one window [layers, experts]), "
            f"got shape {arr.shape}"
        )
    W, L, E = arr.shape
    flat = check_solver_load(arr.reshape(W * L, E), name=name)
    out = flat.reshape(W, L, E)
    out.flags.writeable = False
    return out


def check_layer_ids(layer_ids, num_layers: int) -> np.ndarray:
    """``int64[L]`` distinct non-negative model layer ids, one per row."""
    try:
        ids = np.asarray(layer_ids)
    except (TypeError, ValueError) as exc:
        raise InputError(f"layer_ids must be {num_layers} integers: {exc}") from None
    if ids.dtype.kind not in "iu" or ids.shape != (num_layers,):
        raise InputError(
            f"layer_ids must be {num_layers} integers (one model layer id per load row), got "
            f"{layer_ids!r}"
        )
    if ids.size and ids.min() < 0:
        raise InputError(f"layer_ids must be >= 0, got {ids.tolist()}")
    if len(np.unique(ids)) != num_layers:
        raise InputError(f"layer_ids must be distinct, got {ids.tolist()}")
    out = ids.astype(np.int64)
    out.flags.writeable = False
    return out


def check_num_groups(num_groups, num_experts: int, *, divides: bool = True) -> int | None:
    """``None`` or an integer ``>= 1`` dividing the experts (``divides=False``: any integer
    ``>= 1``, for a policy that falls back where the groups do not apply)."""
    if num_groups is None:
        return None
    g = check_int("num_groups", num_groups, lo=1)
    if divides and num_experts % g:
        divisors = [d for d in range(1, num_experts + 1) if num_experts % d == 0]
        near = min(divisors, key=lambda d: (abs(d - g), d))
        raise InputError(
            f"num_groups {g} does not divide {num_experts} experts (groups are equal "
            f"blocks of consecutive experts); use a divisor such as {near}"
        )
    return g


def check_groups(num_groups, num_experts: int, num_nodes: int) -> int:
    """``num_groups`` for the group-to-node contract (required, divides the experts; whether
    the contract can hold on the nodes is `group_placement.contract_fallback`'s question)."""
    if num_groups is None:
        raise InputError(
            "hierarchical placement needs num_groups (expert groups, e.g. 8; CLI: --groups 8)"
        )
    return check_num_groups(num_groups, num_experts)


def check_size(num_layers: int, num_experts: int, topology) -> None:
    """Refuse problems whose tables would not fit in memory (before allocating them)."""
    L, E = num_layers, num_experts
    n = max(L * topology.num_slots, L * E * topology.num_gpus)
    if n > MAX_ELEMENTS:
        raise InputError(
            f"problem too large: {L} layers x {E} experts on {topology.num_gpus} GPUs x "
            f"{topology.num_slots} slots needs tables of {n:,} entries (limit {MAX_ELEMENTS:,}); "
            "solve fewer layers at a time or use a smaller topology"
        )


# --------------------------------------------------------------------------- options
def check_option(solver: str, key: str, value: Any, hint: Any) -> Any:
    """``value`` of option ``key`` checked against its annotation ``hint`` (docs/solvers.md,
    "How the building blocks work"); returns it normalised (numpy scalars become Python
    ones)."""
    where = f"{solver}: option {key}"
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            return value
        hint, origin = rest[0], typing.get_origin(rest[0])
        if value is None:
            raise InputError(f"{where} must not be None")
    rng = None
    if origin is Annotated:
        hint, *extra = typing.get_args(hint)
        rng = next((m for m in extra if isinstance(m, Range)), None)
        origin = typing.get_origin(hint)
    if origin is Literal:
        allowed = typing.get_args(hint)
        if not isinstance(value, str) or value not in allowed:
            raise InputError(
                f"{where} must be one of {', '.join(map(repr, allowed))}, got {value!r}"
            )
        return value
    if hint is bool:
        if not _is_bool(value):
            raise InputError(f"{where} must be true or false, got {value!r}")
        return bool(value)
    raw = value
    if hint is int:
        kind = "an integer"
        if not _is_int(value):
            raise InputError(f"{where} must be {kind}, got {value!r}")
        value = int(value)
    elif hint is float:
        kind = "a number"
        if not _is_real(value):
            raise InputError(f"{where} must be {kind}, got {value!r}")
        try:
            value = float(value)
        except OverflowError:
            raise InputError(f"{where} is too large: {value!r}") from None
        if not math.isfinite(value):
            raise InputError(f"{where} must be a finite number, got {value!r}")
    elif hint is str:
        if not isinstance(value, str):
            raise InputError(f"{where} must be a string, got {value!r}")
        return value
    else:
        return value
    if rng is not None and not rng.holds(value):
        raise InputError(f"{where} must be {kind} {rng.describe()}, got {raw!r}")
    return value
