"""Step-time model: seconds of one forward step of a prefill or decode unit, and why.

`batch` (`RankBatch`), `curves` (kernel tables as curves), `rank_side` (attention, shared
expert, dense layers, head per DP rank), `routing` (the step's expert load through the
placement, by the unit's `eplb.dispatch` policy), `gpu_side` (routed experts per EP rank),
`comm` (the all-to-all), `assemble` (overlap and breakdown), `breakdown` (`StepTime`), `model`
(`StepModel`, `step_time`). See docs/serving-calibration.md.
"""

from eplb.evaluation.serving.steptime.batch import RankBatch
from eplb.evaluation.serving.steptime.breakdown import BREAKDOWN, StepTime
from eplb.evaluation.serving.steptime.model import StepModel, step_time
from eplb.evaluation.serving.steptime.routing import RoutedPlacement

__all__ = ["BREAKDOWN", "RankBatch", "RoutedPlacement", "StepModel", "StepTime", "step_time"]
