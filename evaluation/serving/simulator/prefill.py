"""Prefill units: a FIFO queue of prompts per rank; a step's chunks come from
`steptime.chunking.plan` (the rule `steady_state` runs too: per rank, chunks from the head of
its queue up to the token budget, attention-aware up to the work the budget costs at DeepSeek's
profile prompts, optionally context-parallel pieces on ranks with spare work), skipping prompts
whose cached blocks are still loading from the external store. Its handlers `start` and `end` a
step."""

from __future__ import annotations

import math

import numpy as np

from eplb.evaluation.serving.simulator.events import P_END, P_WAKE
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
    is loaded); ``inflight`` the running step's `steptime.chunking.Chunk` tuples;
    ``charged`` what that step adds to each rank in the balancer's view (tokens, attention)."""

    phase = "prefill"

    def __init__(
        self,
        index,
        step_model,
        loads,
        planner,
        recorder,
        *,
        token_budget: int,
        chunking: str = "attention",
    ):
        super().__init__(index, step_model, loads, planner, recorder)
        self.budget = int(token_budget)
        self.chunking = chunking  # steptime.chunking's mode: the rule steady_state runs too
        self.pairs_per_token = (
            attention_pairs_per_token(step_model) if chunking != "tokens" else 0.0
        )
        self.cost_cap = work_cap(self.budget, self.pairs_per_token)
        self.queues: list[list[list]] = [[] for _ in range(self.G)]
        self.inflight: list[tuple] = []  # steptime.chunking.Chunk
        self.charged = (0.0, 0.0)  # running step's tokens and attention per rank (balancer view)

    def queued(self) -> int:
        return sum(len(q) for q in self.queues)

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

    # ------------------------------------------------------------------ handlers
    def start(self, sim, t: float) -> None:
        """Run the next step at ``t`` if the unit is free and a chunk is ready (else wake up
        when the first queued prompt's prefix has loaded)."""
        if self.busy or self.dead:
            return
        if self.pending_stall is not None:
            sim.eplb.stall(self, t)
            return
        chunks, batch, min_ready = self.build(t)
        if not chunks:
            if min_ready < self.wake_at or self.wake_at <= t:
                self.wake_at = min_ready
                if min_ready < math.inf:
                    sim.events.push(min_ready, P_WAKE, self.index)
            return
        adm = sim.admission
        tokens = float(np.add.reduce(batch.tokens))
        st = self.step_time(batch, t, tokens)
        dur = st.total_s
        self.busy = True
        self.inflight = chunks
        self.wake_at = math.inf
        done_in = 0
        state = adm.p_state
        p_len = sim.req.p_len
        G = self.G
        g0 = self.index * G
        att = 0.0
        rows, new, pairs = [], [], []
        p_start = sim.records.prefill_start_s
        for _r, owner, e, n, c, last in chunks:
            if e[2] == 0 and p_start[e[0]] != p_start[e[0]]:  # NaN: its first chunk starts
                p_start[e[0]] = t
            # the chunk leaves its prompt's queue (the balancer fills the next step) ...
            a = n * c + n * n / 2
            rows.append(g0 + owner)
            new.append(n)
            pairs.append(a)
            att += a
            if last:
                done_in += int(p_len[e[0]])
        np.subtract.at(state.queued_tokens, rows, new)  # (in order, as one at a time)
        np.subtract.at(state.attention_cost, rows, pairs)
        # ... and the step's work is charged evenly to the unit's ranks until it ends: they
        # all wait for it, so it tells units apart without unbalancing the next step
        sl = slice(g0, g0 + G)
        self.charged = (tokens / G, att / G)
        state.running_tokens[sl] += self.charged[0]
        state.attention_cost[sl] += self.charged[1]
        np.maximum(state.queued_tokens, 0.0, out=state.queued_tokens)
        np.maximum(state.attention_cost, 0.0, out=state.attention_cost)
        adm.p_version += 1
        rec = sim.records
        rec.step(self, t, st, tokens, len(chunks), 0.0, float(done_in), 0.0)
        rec.busy(self, t, dur, batch.tokens / self.budget)
        sim.events.push(t + dur, P_END, self.index)
        adm.route_prefill(t)

    def end(self, sim, t: float) -> None:
        """The running step ends at ``t``: its chunks are done; finished prompts go on to
        decode; the next step starts."""
        self.busy = False
        self.k += 1
        adm = sim.admission
        state = adm.p_state
        p_blocks = sim.req.p_blocks
        G = self.G
        g0 = self.index * G
        sl = slice(g0, g0 + G)
        state.running_tokens[sl] -= self.charged[0]
        state.attention_cost[sl] -= self.charged[1]
        self.charged = (0.0, 0.0)
        completed = []
        for _r, owner, e, n, _c, _last in self.inflight:
            g = g0 + owner
            e[1] -= n
            e[2] += n
            if e[1] == 0:
                self.queues[owner].remove(e)
                i = e[0]
                completed.append(i)
                state.num_requests[g] -= 1
                state.kv_blocks_used[g] -= p_blocks[i]
        self.inflight = []
        for arr in (
            state.kv_blocks_used,
            state.num_requests,
            state.running_tokens,
            state.attention_cost,
        ):
            np.maximum(arr, 0.0, out=arr)
        adm.p_version += 1
        if completed:
            adm.prefill_done(completed, t)
        adm.route_prefill(t)
        self.start(sim, t)
