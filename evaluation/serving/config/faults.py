"""Faults a config injects: ``GpuFailure(time_s, unit=("decode", 0), gpu=5)`` stops GPU ``gpu``
(also its DP rank) of unit ``(phase, index)`` at ``time_s`` for good; in TOML a ``[[faults]]``
table (``time_s``, ``unit = ["decode", 0]``, ``gpu``). The simulator's side: `simulator.faults`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eplb.errors import InputError

__all__ = ["FAULT_KINDS", "GpuFailure", "as_fault"]

PHASES = ("prefill", "decode")
FAULT_KINDS = ("gpu_failure",)


@dataclass(frozen=True)
class GpuFailure:
    """GPU ``gpu`` of unit ``unit = (phase, index)`` fails at ``time_s`` seconds (for good)."""

    time_s: float
    unit: tuple[str, int] = ("decode", 0)
    gpu: int = 0

    def __post_init__(self) -> None:
        t = self.time_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise InputError(f"GpuFailure.time_s must be finite seconds >= 0, got {t!r}")
        object.__setattr__(self, "time_s", float(t))
        unit = self.unit
        if (
            not isinstance(unit, (tuple, list))
            or len(unit) != 2
            or unit[0] not in PHASES
            or isinstance(unit[1], bool)
            or not isinstance(unit[1], int)
            or unit[1] < 0
        ):
            raise InputError(
                f"GpuFailure.unit must be (phase, index) with phase 'prefill' or 'decode' and "
                f"index >= 0, e.g. ('decode', 0); got {unit!r}"
            )
        object.__setattr__(self, "unit", (str(unit[0]), int(unit[1])))
        g = self.gpu
        if isinstance(g, bool) or not isinstance(g, int) or g < 0:
            raise InputError(f"GpuFailure.gpu must be a GPU index >= 0, got {g!r}")

    @property
    def kind(self) -> str:
        return "gpu_failure"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "time_s": self.time_s, "unit": list(self.unit), "gpu": self.gpu}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GpuFailure:
        known = {"kind", "time_s", "unit", "gpu"}
        bad = sorted(set(data) - known)
        if bad:
            raise InputError(
                f"unknown key faults.{bad[0]}; a GPU failure has time_s, unit, gpu (and kind)"
            )
        if data.get("kind", "gpu_failure") != "gpu_failure":
            raise InputError(
                f"faults.kind {data.get('kind')!r} is unknown; use one of {', '.join(FAULT_KINDS)}"
            )
        if "time_s" not in data:
            raise InputError("a fault needs time_s (seconds after the start)")
        unit = data.get("unit", ("decode", 0))
        return cls(
            data["time_s"], tuple(unit) if isinstance(unit, list) else unit, data.get("gpu", 0)
        )


def as_fault(value) -> GpuFailure:
    """A fault object from a `GpuFailure` or its table."""
    if isinstance(value, GpuFailure):
        return value
    if isinstance(value, Mapping):
        return GpuFailure.from_dict(value)
    raise InputError(
        f"faults hold GpuFailure objects or tables, got {type(value).__name__}: {value!r}"
    )
