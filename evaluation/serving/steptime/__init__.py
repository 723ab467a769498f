"""Step-time model: seconds of one forward step of a prefill or decode unit, and why."""

from eplb.evaluation.serving.steptime.model import (
    BREAKDOWN,
    RankBatch,
    RoutedPlacement,
    StepModel,
    StepTime,
    step_time,
)

__all__ = ["BREAKDOWN", "RankBatch", "RoutedPlacement", "StepModel", "StepTime", "step_time"]
