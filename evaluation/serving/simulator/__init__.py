"""The serving simulator: `simulate` runs a PD-disaggregated cluster event by event."""

from eplb.evaluation.serving.simulator.loop import simulate

__all__ = ["simulate"]
