"""Decode units: the running requests per rank as two arrays, advanced in ``O(G)`` per step.

Every request emits ``e_k = 1 + floor((k + 1) x) - floor(k x)`` tokens at the unit's step
``k``, ``x`` the expected accepted MTP drafts per step, so after ``j`` steps ``cum(j) = j +
floor(j x)`` tokens are out and the step a request finishes at is known when it is admitted
(`first_reach`): per-step work is ``O(G + finishing requests)`` (docs/serving.md,
"Simulator"). Its handlers `admit` arrived requests, `start` and `end` a step."""

from __future__ import annotations

import heapq
import math

import numpy as np

from eplb.evaluation.serving.simulator.events import D_END, D_WAKE
from eplb.evaluation.serving.simulator.units import Unit
from eplb.evaluation.serving.steptime import RankBatch

__all__ = ["DecodeUnit", "cum", "cum_many", "first_reach", "first_reach_many"]


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


class DecodeUnit(Unit):
    """A decode unit: its running requests per rank as ``n: float64[G]`` requests and ``kv:
    float64[G]`` context tokens; ``finish_at``: step -> requests that finish at it;
    ``pending``: a heap of ``(ready_s, seq, request, rank)`` whose KV is on its way in."""

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
        max_running: int | None = None,
    ):
        super().__init__(index, step_model, loads, planner, recorder)
        self.cap = max_running or 1.0  # running requests per rank at full utilisation
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

    # ------------------------------------------------------------------ handlers
    def admit(self, sim, t: float) -> None:
        """Requests whose KV has arrived join the running batch (their finishing step is
        known now: `first_reach`). Counts and contexts are whole numbers: exact sums."""
        pend = self.pending
        if not pend or pend[0][0] > t:
            return
        req = sim.req
        got, ranks = [], []
        pop = heapq.heappop
        while pend and pend[0][0] <= t:
            _, _, i, r = pop(pend)
            got.append(i)
            ranks.append(r)
        k0, x = self.k, self.x
        base = cum(k0, x)
        idx = np.array(got, dtype=np.int64)
        need = req.out[idx] - req.gen[idx]
        jf = first_reach_many(need + base, x)  # steps k0..jf-1
        req.d_k0[idx] = k0
        req.d_need[idx] = need
        sim.records.decode_start_s[idx] = t
        start_ctx = (req.p_len[idx] + 1).astype(np.float64)
        req.d_final[idx] = start_ctx + (cum_many(jf, x) - base)
        finish_at = self.finish_at
        for i, kf in zip(got, (jf - 1).tolist(), strict=True):
            finish_at.setdefault(kf, []).append(i)
        G = self.G
        self.n += np.bincount(ranks, minlength=G)
        self.kv += np.bincount(ranks, start_ctx, G)

    def start(self, sim, t: float) -> None:
        """Admit what has arrived and run the next step at ``t`` (else wake up when the next
        request's KV arrives)."""
        if self.busy or self.dead:
            return
        if self.pending_stall is not None:
            sim.eplb.stall(self, t)
            return
        self.admit(sim, t)
        total = float(np.add.reduce(self.n))
        if total <= 0:
            ready = self.next_ready()
            if ready < math.inf and (ready < self.wake_at or self.wake_at <= t):
                self.wake_at = ready
                sim.events.push(ready, D_WAKE, self.index)
            return
        batch = self.batch()
        tokens = total * self.q
        st = self.step_time(batch, t, tokens)
        dur = st.total_s
        k = self.k
        e = self.emitted(k)
        out_tokens = total * e
        fin = self.finish_at.get(k)
        if fin:  # a request's last step may emit more than it needs (whole numbers: exact)
            req = sim.req
            idx = np.array(fin, dtype=np.int64)
            over = cum(k + 1, self.x) - cum_many(req.d_k0[idx], self.x) - req.d_need[idx]
            out_tokens -= int(over.sum())
        self.busy = True
        self.wake_at = math.inf
        kv_tokens = float(np.add.reduce(self.kv))
        rec = sim.records
        rec.step(self, t, st, tokens, total, kv_tokens, 0.0, out_tokens)
        rec.busy(self, t, dur, self.n / self.cap)
        sim.events.push(t + dur, D_END, self.index)

    def end(self, sim, t: float) -> None:
        """The running step ends at ``t``: every request emitted its tokens; the finishing
        ones leave (their reservations free decode room); the next step starts."""
        self.busy = False
        k = self.k
        e = self.emitted(k)
        self.kv += self.n * e
        fin = self.finish_at.pop(k, None)
        self.k = k + 1
        if fin:
            # their reservations leave the ranks (whole numbers: sums are exact in any order)
            adm, req = sim.admission, sim.req
            state = adm.d_state
            idx = np.array(fin, dtype=np.int64)
            r = req.d_rank[idx]
            G = self.G
            self.n -= np.bincount(r, minlength=G)
            self.kv -= np.bincount(r, req.d_final[idx], G)
            sl = slice(self.index * G, (self.index + 1) * G)
            kv = req.d_kv[idx]
            state.num_requests[sl] -= np.bincount(r, minlength=G)
            kv_sum = np.bincount(r, kv.astype(np.float64), G)
            state.running_tokens[sl] -= kv_sum
            state.kv_blocks_used[sl] -= np.bincount(r, (-(-kv // adm.bs)).astype(np.float64), G)
            state.attention_cost[sl] -= kv_sum
            sim.finish_many(idx, t)
            adm.d_version += 1
            adm.d_freed += len(fin)
            adm.route_decode(t)
        self.start(sim, t)
