"""Prefill and decode units inside the simulator: their queues, running requests and steps.

A unit is one EP group (``G`` GPUs, one DP attention rank per GPU) that steps all its ranks
together: every step's MoE layers are an all-to-all barrier, so the unit's step time is the
step-time model's (`StepModel`) for the batch of every rank.

- `PrefillUnit`: a FIFO queue of prompts per rank; a step takes, per rank, chunks from the
  head of its queue up to the token budget (chunked prefill: a prompt longer than what is left
  of the budget is split over steps), skipping prompts whose cached blocks are still loading
  from the external store.
- `DecodeUnit`: the running requests per rank as two arrays, ``n: float64[G]`` requests and
  ``kv: float64[G]`` context tokens, advanced in ``O(G)`` per step. Every request emits
  ``e_k = 1 + floor((k + 1) x) - floor(k x)`` tokens at the unit's step ``k``, ``x`` the
  expected accepted MTP drafts per step (``mtp_draft_tokens * mtp_acceptance``; 0 without
  MTP), so after ``j`` steps from the unit's first one ``cum(j) = j + floor(j x)`` tokens are
  out and the step a request finishes at is known when it is admitted (`first_reach`):
  per-step work is ``O(G + finishing requests)``, not ``O(running requests)``. Acceptance is
  thereby deterministic and the same for every request (per-request randomness of MTP
  acceptance is not modelled; its mean is).
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from eplb.evaluation.serving.simulator.eplb_loop import Planner, Recorder
from eplb.evaluation.serving.simulator.expert_loads import StepLoads
from eplb.evaluation.serving.steptime import RankBatch, RoutedPlacement, StepModel, StepTime
from eplb.placement import Placement

__all__ = ["DecodeUnit", "PrefillUnit", "cum", "cum_many", "first_reach", "first_reach_many"]


def cum(j: int, x: float) -> int:
    """Tokens a request present since the unit's step 0 has emitted after ``j`` steps."""
    return j + math.floor(j * x)


def first_reach(target: int, x: float) -> int:
    """Smallest ``j >= 0`` with ``cum(j, x) >= target``."""
    if target <= 0:
        return 0
    j = max(int(target / (1.0 + x)) - 2, 0)
    while cum(j, x) < target:
        j += 1
    return j


def cum_many(j: np.ndarray, x: float) -> np.ndarray:
    """`cum` of each ``j: int64[n]``."""
    return j + np.floor(j * x).astype(np.int64)


def first_reach_many(target: np.ndarray, x: float) -> np.ndarray:
    """`first_reach` of each ``target: int64[n]``."""
    j = np.maximum((target / (1.0 + x)).astype(np.int64) - 2, 0)
    short = cum_many(j, x) < target
    while short.any():
        j += short
        short = cum_many(j, x) < target
    return j


class _Unit:
    """What prefill and decode units share: placement, routing draws, recorder, step model."""

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
        self.fast = step_model.dispatch != "local_first"
        self.busy = False  # inside a step or a migration stall
        self.stalled = False
        self.pending_stall = None  # a plan waiting for the current step to end
        self.wake_at = math.inf
        self.k = 0  # steps run
        self.alive = np.ones(self.G, dtype=bool)
        self.dead = False
        self.picks_per_token = step_model.model.top_k

    @property
    def name(self) -> str:
        return f"{self.phase}{self.index}"

    def set_placement(self, placement: Placement | None) -> None:
        self.placement = placement
        self.version += 1
        self._routed = None

    def step_time(self, batch: RankBatch, t: float, tokens: float) -> StepTime:
        """The step's time: draw its expert counts, record them, time it."""
        if self.placement is None:  # perfectly balanced routing
            return self.sm.time_routed(batch, _BALANCED, None, check=False)
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


_BALANCED = RoutedPlacement(None, None, None, None, None, None)


class PrefillUnit(_Unit):
    """A prefill unit's rank queues (entries ``[request, todo, done, cached, ready_s]``)."""

    phase = "prefill"

    def __init__(self, index, step_model, loads, planner, recorder, *, token_budget: int):
        super().__init__(index, step_model, loads, planner, recorder)
        self.budget = int(token_budget)
        self.queues: list[list[list]] = [[] for _ in range(self.G)]
        self.inflight: list[tuple[int, list, int]] = []
        self.charged = (0.0, 0.0)  # running step's tokens and attention per rank (balancer view)

    def queued(self) -> int:
        return sum(len(q) for q in self.queues)

    def build(self, t: float):
        """The next step's chunks at ``t``: ``(chunks, batch, min_ready)``; ``chunks`` is a list
        of ``(rank, entry, tokens)`` (empty when nothing is ready; ``min_ready`` is then the
        earliest time an entry becomes ready, ``inf`` if none is queued)."""
        chunks = []
        new, ctx, rank, last = [], [], [], []
        min_ready = math.inf
        budget0 = self.budget
        for r, q in enumerate(self.queues):
            if not q:
                continue
            budget = budget0
            for e in q:
                if e[4] > t:
                    if e[4] < min_ready:
                        min_ready = e[4]
                    continue
                n = e[1] if e[1] < budget else budget
                chunks.append((r, e, n))
                new.append(n)
                ctx.append(e[3] + e[2])
                rank.append(r)
                last.append(n == e[1])
                budget -= n
                if budget <= 0:
                    break
        if not chunks:
            return chunks, None, min_ready
        batch = RankBatch.prefill(
            np.asarray(new, dtype=np.float64),
            np.asarray(ctx, dtype=np.float64),
            np.asarray(rank, dtype=np.int64),
            num_ranks=self.G,
            last_chunk=np.asarray(last, dtype=np.float64),
        )
        return chunks, batch, min_ready


class DecodeUnit(_Unit):
    """A decode unit's running requests per rank and the requests on their way in."""

    phase = "decode"

    def __init__(
        self,
        index,
        step_model,
        loads,
        planner,
        recorder,
        *,
        query_tokens: int,
        extra_per_step: float,
    ):
        super().__init__(index, step_model, loads, planner, recorder)
        self.q = float(query_tokens)
        self.x = float(extra_per_step)
        self.n = np.zeros(self.G)
        self.kv = np.zeros(self.G)
        self.finish_at: dict[int, list[int]] = {}
        self.pending: list[tuple[float, int, int, int]] = []  # (ready_s, seq, request, rank)
        self._seq = 0

    def emitted(self, k: int) -> int:
        """Tokens every running request emits at step ``k``."""
        return cum(k + 1, self.x) - cum(k, self.x)

    def push(self, ready_s: float, request: int, rank: int) -> None:
        self._seq += 1
        heapq.heappush(self.pending, (ready_s, self._seq, request, rank))

    def next_ready(self) -> float:
        return self.pending[0][0] if self.pending else math.inf

    def batch(self) -> RankBatch:
        tok = self.n * self.q
        return RankBatch.trusted(tok, self.kv * self.q, self.kv.copy(), tok.copy())
