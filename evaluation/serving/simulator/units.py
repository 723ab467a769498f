"""What prefill and decode units share (`Unit`): an EP group of ``G`` GPUs (one DP attention
rank per GPU) stepping all its ranks together, with its live placement, expert-load draws,
load recorder and step-time model; `PrefillUnit` and `DecodeUnit` are the two kinds. A bare
`Unit` is what a counterfactual replay steps (`counterfactual.replay`)."""

from __future__ import annotations

import math

import numpy as np

from eplb.evaluation.serving.simulator.events import LIVE, Event
from eplb.evaluation.serving.simulator.expert_loads import StepLoads
from eplb.evaluation.serving.simulator.planner import Planner
from eplb.evaluation.serving.simulator.recorder import Recorder
from eplb.evaluation.serving.steptime import RankBatch, RoutedPlacement, StepModel, StepTime
from eplb.placement import Placement

__all__ = ["Unit"]


class Unit:
    """What prefill and decode units share: placement, routing draws, recorder, step model,
    and the stepping state the cluster's handlers (`simulator.cluster`) read: a unit that is
    neither ``busy`` nor ``dead`` may start a step (a subclass's ``start``), or `stall`.

    State: ``busy`` (in a step or a migration stall), ``stalled``, ``pending_stall`` (a plan
    waiting for the running step to end), ``rebalance_due`` (the next scheduled rebalance
    may not be skipped: a failure patched the placement), ``wake_at`` (a wake-up event's time,
    or inf), ``k`` (steps run), ``alive: bool[G]`` (its GPUs), ``dead`` (none left), ``version``
    (placements set), ``row`` (its running step's row in the records).
    """

    phase = ""

    def __init__(
        self,
        index: int,
        step_model: StepModel,
        loads: StepLoads | None,
        planner: Planner,
        recorder: Recorder | None,
    ):
        self.index = index
        self.sm = step_model
        self.G = step_model.topology.num_gpus
        self.loads = loads
        self.planner = planner
        self.recorder = recorder
        self.placement: Placement | None = None
        self.version = 0
        self._routed: RoutedPlacement | None = None
        self._routed_w: int | None = None
        self.fast = step_model.policy.alike  # prepare() serves its steps
        self.busy = False  # inside a step or a migration stall
        self.stalled = False
        self.pending_stall = None  # a plan waiting for the current step to end
        self.rebalance_due = False  # a failure changed the placement: never skip the next
        self.wake_at = math.inf
        self.k = 0  # steps run
        self.alive = np.ones(self.G, dtype=bool)
        self.dead = False
        self.picks_per_token = step_model.model.top_k
        self.row = -1  # the running step's row in the records

    @property
    def name(self) -> str:
        return f"{self.phase}{self.index}"

    def set_placement(self, placement: Placement | None) -> None:
        self.placement = placement
        self.version += 1
        self._routed = None

    def woken(self, t: float) -> bool:
        """A wake-up event at ``t``: True (and the wake-up is spent) unless a newer one
        replaced it."""
        if self.wake_at == t:
            self.wake_at = math.inf
            return True
        return False

    def stall(self, t: float) -> Event:
        """Apply the pending stalling migration (``pending_stall``) at ``t``: the unit runs no
        step until the copy is done, when the returned event makes it live."""
        plan = self.pending_stall
        self.pending_stall = None
        self.busy = self.stalled = True
        return (t + plan.copy_s, LIVE, (self.phase, self.index, plan, True))

    def step_time(self, batch: RankBatch, t: float, tokens: float) -> StepTime:
        """The step's time: draw its expert counts, record them, time it."""
        if self.placement is None:  # perfectly balanced routing
            return self.sm.time_routed(batch, BALANCED, None, check=False)
        counts = self.loads.draw(t, self.picks_per_token * tokens)
        if self.recorder is not None:
            self.recorder.add(t, counts)
        if not self.fast:
            return self.sm.time(batch, self.placement, counts)
        w, p = self.loads.window(t)  # the window draw() used (cached there)
        if self._routed is None or self._routed_w != w:
            self._routed = self.sm.prepare(self.placement, p)
            self._routed_w = w
        return self.sm.time_routed(
            batch, self._routed, counts, check=False, tabulated=True, picks=True
        )


BALANCED = RoutedPlacement(None, None, None, None, None, None)  # perfectly balanced routing
