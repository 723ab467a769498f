"""What serving runs answer: `SimResult` (frames, summary, plots) and `steady_state`."""

from eplb.evaluation.serving.results.result import SimResult
from eplb.evaluation.serving.results.steady import steady_state

__all__ = ["SimResult", "steady_state"]
