"""Prefill units: a FIFO queue of prompts per rank; a step takes, per rank, chunks from the
head of its queue up to the token budget (chunked prefill: a prompt longer than what is left of
the budget is split over steps) and, attention-aware, up to the work the budget costs at
DeepSeek's profile prompts (a chunk deep in a long context is shorter, so one rank's attention
does not stall the step), skipping prompts whose cached blocks are still loading from the
external store. Its handlers `start` and `end` a step."""

from __future__ import annotations

import math

import numpy as np

from eplb.evaluation.serving.simulator.events import P_END, P_WAKE
from eplb.evaluation.serving.simulator.units import BALANCED, Unit
from eplb.evaluation.serving.steptime import RankBatch

__all__ = ["PrefillUnit", "attention_pairs_per_token"]

PROFILE_PROMPT = 4096  # DeepSeek's profile prompt length: the budget's reference work
MIN_CHUNK = 512  # a rank's first chunk of a step is at least this long (progress)
BALANCE_FLOOR = 0.25  # a rank's work is never cut below this share of the cap


def attention_pairs_per_token(step_model) -> float:
    """``K``: core-attention token pairs that cost as much as one token's linear work
    (GEMMs, MoE, communication) in ``step_model``: from two balanced steps of 4,096 tokens
    per rank at context 0 and 32,768 (``K = T0 * 32768 / (T1 - T0)``)."""
    G = step_model.topology.num_gpus
    ranks = np.arange(G)

    def step(ctx: float) -> float:
        b = RankBatch.prefill(np.full(G, 4096.0), np.full(G, ctx), ranks, num_ranks=G,
                              last_chunk=np.ones(G))
        return step_model.time_routed(b, BALANCED, None, check=False).total_s

    t0, t1 = step(0.0), step(32768.0)
    return t0 * 32768.0 / (t1 - t0) if t1 > t0 else 0.0


class PrefillUnit(Unit):
    """A prefill unit: a FIFO queue of prompts per rank (entries ``[request, todo, done,
    cached, ready_s]``: tokens left to compute, computed, cached; ready once its cached prefix
    is loaded); ``inflight`` the running step's ``(rank, entry, tokens)`` chunks;
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
        attention_aware: bool = True,
    ):
        super().__init__(index, step_model, loads, planner, recorder)
        self.budget = int(token_budget)
        # attention-aware chunk sizing: a rank's step work in linear-token units, n (1 + (ctx
        # + n / 2) / K), is capped at what the budget costs at DeepSeek's profile prompts
        self.pairs_per_token = attention_pairs_per_token(step_model) if attention_aware else 0.0
        K = self.pairs_per_token
        self.cost_cap = self.budget * (1.0 + (PROFILE_PROMPT + 1) / 2 / K) if K else math.inf
        self.queues: list[list[list]] = [[] for _ in range(self.G)]
        self.inflight: list[tuple[int, list, int]] = []
        self.charged = (0.0, 0.0)  # running step's tokens and attention per rank (balancer view)

    def queued(self) -> int:
        return sum(len(q) for q in self.queues)

    def _take(self, q: list, t: float, cap: float):
        """Rank queue ``q``'s chunks for a step at ``t`` under a work cap ``cap`` (linear-token
        units; inf: tokens only): ``([(entry, tokens)], work, min_ready)``."""
        out = []
        min_ready = math.inf
        budget0 = self.budget
        budget, cost, K = budget0, cap, self.pairs_per_token
        for e in q:
            if e[4] > t:
                if e[4] < min_ready:
                    min_ready = e[4]
                continue
            n = e[1] if e[1] < budget else budget
            if K:
                a = 1.0 + (e[3] + e[2]) / K
                # the largest n with n (1 + (c + n / 2) / K) <= cost
                fit = int(K * (math.sqrt(a * a + 2.0 * cost / K) - a)) if cost < math.inf else n
                if fit < n:
                    n = fit if fit >= MIN_CHUNK or budget < budget0 else min(e[1], MIN_CHUNK)
                if n <= 0:
                    break
                cost -= n * (a + n / (2.0 * K))
            out.append((e, n))
            budget -= n
            if budget <= 0 or cost <= 0:
                break
        return out, cap - cost, min_ready

    def build(self, t: float):
        """The next step's chunks at ``t``: ``(chunks, batch, min_ready)``; ``chunks`` is a list
        of ``(rank, entry, tokens)`` (empty when nothing is ready; ``min_ready`` is then the
        earliest time an entry becomes ready, ``inf`` if none is queued).

        Attention-aware (``pairs_per_token > 0``): each rank's work is capped at ``cost_cap``;
        then the ranks above the mean work of the ranks with work (but at least
        ``BALANCE_FLOOR x cost_cap``) are cut down to it, so a long prompt deep in its
        context takes several shorter steps instead of stalling every rank's step."""
        chunks = []
        new, ctx, rank, last = [], [], [], []
        min_ready = math.inf
        cap0 = self.cost_cap
        picks = {}
        for r, q in enumerate(self.queues):
            if not q:
                continue
            got, work, mr = self._take(q, t, cap0)
            if mr < min_ready:
                min_ready = mr
            if got:
                picks[r] = (got, work)
        if self.pairs_per_token and len(picks) > 0:
            works = [w for _, w in picks.values()]
            target = max(sum(works) / len(works), BALANCE_FLOOR * cap0)
            for r, (_got, work) in list(picks.items()):
                if work > target * (1 + 1e-9):
                    picks[r] = (self._take(self.queues[r], t, target)[0], target)
        for r in sorted(picks):
            for e, n in picks[r][0]:
                chunks.append((r, e, n))
                new.append(n)
                ctx.append(e[3] + e[2])
                rank.append(r)
                last.append(n == e[1])
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
        for r, e, n in chunks:
            if e[2] == 0 and p_start[e[0]] != p_start[e[0]]:  # NaN: its first chunk starts
                p_start[e[0]] = t
            # the chunk leaves its rank's queue (the balancer fills the next step) ...
            a = n * (e[3] + e[2]) + n * n / 2
            rows.append(g0 + r)
            new.append(n)
            pairs.append(a)
            att += a
            if n == e[1]:
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
        for r, e, n in self.inflight:
            g = g0 + r
            e[1] -= n
            e[2] += n
            if e[1] == 0:
                self.queues[r].remove(e)
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
