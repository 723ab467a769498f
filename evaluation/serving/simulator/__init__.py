"""The serving simulator: `simulate` runs a PD-disaggregated cluster event by event.

`loop` (`simulate`, the event loop), `events` (kinds, the queue), `requests` (each request's
working state), `admission` (routing and admission to prefill and decode ranks), `units`,
`prefill`, `decode` (the units and their step handlers), `expert_loads` (popularity and
per-step expert counts), `planner` and `eplb_loop` (EPLB), `faults` (GPU failures), `records`
(what is recorded, turned into a `SimResult`).
"""

from eplb.evaluation.serving.simulator.loop import simulate

__all__ = ["simulate"]
