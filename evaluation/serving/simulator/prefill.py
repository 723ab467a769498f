"""Prefill units: a FIFO queue of prompts per rank; a step's chunks come from
`steptime.chunking.plan` (the rule `steady_state` runs too: per rank, the partly prefilled
prompt first, then chunks from the head of its queue up to the token budget, attention-aware
up to the work the budget costs at DeepSeek's profile prompts, optionally context-parallel
pieces on ranks with spare work), skipping prompts not ready (their cached blocks still
loading from the external store, or their decode KV not reserved yet). The router hands it prompts
(`enqueue`); the cluster's handlers `start` and `end` its steps and the balancer's view follows
(`Admission.step_started`, `Admission.step_ended`)."""

from __future__ import annotations

import math

import numpy as np

from eplb.evaluation.serving.simulator.events import P_END, P_WAKE, Event
from eplb.evaluation.serving.simulator.records import COL_INPUT_DONE, Records
from eplb.evaluation.serving.simulator.requests import Requests
from eplb.evaluation.serving.simulator.units import BALANCED, Unit
from eplb.evaluation.serving.steptime.chunking import pairs_per_token, plan, to_batch, work_cap

__all__ = ["PrefillUnit", "attention_pairs_per_token"]


def attention_pairs_per_token(step_model) -> float:
    """``K`` of ``step_model`` (`steptime.chunking.pairs_per_token` on its balanced steps)."""
    return pairs_per_token(
        lambda b: step_model.time_routed(b, BALANCED, None, check=False).total_s,
        step_model.topology.num_gpus,
    )


class PrefillUnit(Unit):
    """A prefill unit: a FIFO queue of prompts per rank (entries ``[request, todo, done,
    cached, ready_s]``: tokens left to compute, computed, cached; ready once its cached prefix
    is loaded); ``inflight`` the running step's `steptime.chunking.Chunk` tuples and
    ``step_tokens`` its tokens; ``requests`` and ``records`` the run's."""

    phase = "prefill"

    def __init__(
        self,
        index,
        step_model,
        loads,
        planner,
        recorder,
        *,
        requests: Requests,
        records: Records,
        token_budget: int,
        chunking: str = "attention",
    ):
        super().__init__(index, step_model, loads, planner, recorder)
        self.req, self.records = requests, records
        self.budget = int(token_budget)
        self.chunking = chunking  # steptime.chunking's mode: the rule steady_state runs too
        self.pairs_per_token = (
            attention_pairs_per_token(step_model) if chunking != "tokens" else 0.0
        )
        self.cost_cap = work_cap(self.budget, self.pairs_per_token)
        self.queues: list[list[list]] = [[] for _ in range(self.G)]
        self.inflight: list[tuple] = []  # steptime.chunking.Chunk
        self.step_tokens = 0.0  # the running step's tokens

    def queued(self) -> int:
        return sum(len(q) for q in self.queues)

    def enqueue(self, rank: int, request: int, todo: int, cached: int, ready_s: float) -> list:
        """The router placed ``request`` on ``rank``: ``todo`` prompt tokens to compute beyond
        the ``cached`` ones, ready at ``ready_s`` (its cached prefix loaded; inf until the
        router makes it ready). Returns its queue entry."""
        entry = [request, todo, 0, cached, ready_s]
        self.queues[rank].append(entry)
        return entry

    def build(self, t: float):
        """The next step's chunks at ``t``: ``(chunks, batch, min_ready)``; ``chunks`` are
        `steptime.chunking.Chunk` tuples ``(rank, owner, entry, tokens, context, last)``
        (empty when nothing is ready; ``min_ready`` is then the earliest time an entry becomes
        ready, ``inf`` if none is queued); `steptime.chunking.plan` decides them."""
        chunks, min_ready = plan(self.queues, t, self.budget, self.pairs_per_token,
                                 self.chunking)
        if not chunks:
            return chunks, None, min_ready
        return chunks, to_batch(chunks, self.G), min_ready

    # ------------------------------------------------------------------ steps
    def start(self, t: float) -> Event | None:
        """Run the next step at ``t`` if a chunk is ready: its end event (the unit is then
        ``busy``); else its wake-up event when the first queued prompt's prefix has loaded
        (None when one is already set or nothing is queued). The caller checks the unit is
        free (neither ``busy`` nor ``dead``, no ``pending_stall``)."""
        chunks, batch, min_ready = self.build(t)
        if not chunks:
            if min_ready < self.wake_at or self.wake_at <= t:
                self.wake_at = min_ready
                if min_ready < math.inf:
                    return (min_ready, P_WAKE, self.index)
            return None
        tokens = float(np.add.reduce(batch.tokens))
        st = self.step_time(batch, t, tokens)
        dur = st.total_s
        self.busy = True
        self.inflight = chunks
        self.step_tokens = tokens
        self.wake_at = math.inf
        done_in = 0
        p_len = self.req.p_len
        rec = self.records
        p_start = rec.prefill_start_s
        for _r, _owner, e, _n, _c, last in chunks:
            if e[2] == 0 and p_start[e[0]] != p_start[e[0]]:  # NaN: its first chunk starts
                p_start[e[0]] = t
            if last:
                done_in += int(p_len[e[0]])
        rec.step(self, t, st, tokens, len(chunks), 0.0, float(done_in), 0.0)
        rec.busy(self, t, dur, batch.tokens / self.budget)
        return (t + dur, P_END, self.index)

    def end(self, t: float) -> list[tuple[int, int]]:
        """The running step ends at ``t``: its chunks are done; a prompt left partly
        prefilled moves to the head of its rank's queue, so a rank holds at most one and its
        next chunk goes first (SGLang's ``chunked_req``, admitted before the waiting queue:
        sglang v0.5.23 ``managers/scheduler.py``, ``Scheduler._get_new_batch_prefill_raw``).
        Returns the prompts it finished as ``(rank, request)``, in order."""
        self.busy = False
        self.k += 1
        done = []
        queues = self.queues
        for _r, owner, e, n, _c, _last in self.inflight:
            e[1] -= n
            e[2] += n
            q = queues[owner]
            if e[1] == 0:
                q.remove(e)
                done.append((owner, e[0]))
            elif q[0] is not e:  # partly prefilled: its rank's continuing chunk goes first
                q.remove(e)
                q.insert(0, e)
        self.inflight = []
        return done

    def lose_rank(self, g: int) -> list[int]:
        """Rank ``g`` failed: the prompts queued on it are lost (returned), and so is the
        running step's work on a prompt with a (context-parallel) piece on ``g`` or queued on
        ``g`` (its recorded step no longer finishes that prompt)."""
        lost = [e[0] for e in self.queues[g]]
        self.queues[g] = []
        if self.busy:
            hit = {id(c[2]) for c in self.inflight if g in (c[0], c[1])}
            for _r, _owner, e, _n, _c, last in self.inflight:
                if id(e) in hit and last:
                    self.records.patch_step(self.row, COL_INPUT_DONE, -float(self.req.p_len[e[0]]))
            self.inflight = [c for c in self.inflight if id(c[2]) not in hit]
        return lost
