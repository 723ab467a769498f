"""`StepTime`: one step's seconds and their breakdown (the keys of `BREAKDOWN`, summing to
``total_s``; what each key holds is in docs/serving-calibration.md, "Breakdown")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

BREAKDOWN = (
    "attention",
    "shared_expert",
    "moe",
    "comm_exposed",
    "dp_wait",
    "ep_wait",
    "dense_layers",
    "lm_head",
    "overhead",
)


@dataclass(frozen=True, eq=False)
class StepTime:
    """One step: ``total_s`` and a ``breakdown`` (keys `BREAKDOWN`, seconds) summing to it.

    ``layer_s: float[L]`` seconds of each MoE layer; ``gpu_load_max`` / ``gpu_load_mean:
    float[L]`` routed picks on the busiest / mean GPU (expected, both micro-batches);
    ``tokens`` query tokens of the step over all ranks.
    """

    phase: str
    total_s: float
    breakdown: dict[str, float]
    layer_s: np.ndarray
    gpu_load_max: np.ndarray
    gpu_load_mean: np.ndarray
    tokens: float
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, float]:
        """``step_s`` plus the breakdown, as plain floats."""
        return {"step_s": self.total_s, **self.breakdown}
