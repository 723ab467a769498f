"""The serving simulator: `simulate` runs a PD-disaggregated cluster event by event.

`loop` (`simulate`, the event loop), `events` (kinds, the queue), `requests` (each request's
working state), `router` (`Admission`: routing and admission to prefill and decode ranks, the
only writer of its documented `RouterState`), `cluster` (the units' event handlers), `units`,
`prefill`, `decode` (the units and their steps), `expert_loads` (popularity and per-step
expert counts), `recorder`, `planner` and `eplb_loop` (EPLB), `faults` (GPU failures),
`records` (what is recorded, turned into a `SimResult`).
"""

from eplb.evaluation.serving.simulator.loop import simulate

__all__ = ["simulate"]
