"""Decode units: the running requests per rank as two arrays, advanced in ``O(G)`` per step.

Every running request emits one token per step plus its accepted MTP drafts. A request's
number of steps ``J`` is drawn when it is admitted (`steps_to_emit`: each step's accepted
drafts drawn per request, seeded; or the mean, ``scheduler.mtp_sampling = "mean"``), so the
step it finishes at is known then and per-step work is ``O(G + finishing requests)``; the
ranks' context sums grow by the expected ``1 + x`` tokens per running request per step
(docs/serving.md, "Simulator"). The router sends it requests' KV (`push`); the cluster's
handlers `admit` arrived requests, `start` and `end` its steps, and `retract` takes the newest
requests off a rank whose KV ran out; `lose_rank` and `drop_transfers` are a failure's."""

from __future__ import annotations

import heapq
import math

import numpy as np

from eplb.evaluation.serving.simulator.events import D_END, D_WAKE, Event
from eplb.evaluation.serving.simulator.records import COL_OUTPUT, Records
from eplb.evaluation.serving.simulator.requests import Requests
from eplb.evaluation.serving.simulator.units import Unit
from eplb.evaluation.serving.steptime import RankBatch

__all__ = ["DecodeUnit", "accepted_mean", "steps_to_emit"]

_MTP = 5  # rng purpose of the MTP acceptance draws


def accepted_mean(drafts: int, p: float) -> float:
    """Expected accepted drafts per step: draft ``k`` counts only if drafts ``1..k`` were all
    accepted, each with probability ``p`` (``sum_k p^k``)."""
    return float(sum(p**k for k in range(1, drafts + 1)))


def steps_to_emit(need: np.ndarray, drafts: int, p: float, rng) -> np.ndarray:
    """``int64[m]``: steps until each request has emitted ``need: int64[m]`` tokens, each step
    emitting ``1 + a`` tokens, ``a`` its accepted drafts (``P(a = k) = p^k (1 - p)`` for ``k <
    drafts``, ``p^drafts`` for ``k = drafts``), drawn independently per request and step from
    ``rng``; ``rng=None`` takes the mean (``ceil(need / (1 + accepted_mean))``).

    Exact first passage in blocks: ``s = max(rest // (1 + drafts), 1)`` steps cannot pass
    ``rest`` before their last one, so their token sum is drawn at once (a binomial or a
    multinomial) and the loop runs a few times whatever ``need`` is."""
    need = np.asarray(need, dtype=np.int64)
    if drafts == 0 or p <= 0.0:
        return need.copy()
    if rng is None:
        return np.ceil(need / (1.0 + accepted_mean(drafts, p)) - 1e-9).astype(np.int64)
    steps = np.zeros(need.size, dtype=np.int64)
    rest = need.copy()
    act = np.flatnonzero(rest > 0)
    probs = None
    if drafts > 1:
        probs = np.array([p**k * (1 - p) for k in range(drafts)] + [p**drafts])
        gain = np.arange(drafts + 1)
    while act.size:
        s = np.maximum(rest[act] // (1 + drafts), 1)
        if drafts == 1:
            acc = rng.binomial(s, p)
        else:
            acc = rng.multinomial(s, probs) @ gain
        steps[act] += s
        rest[act] -= s + acc
        act = act[rest[act] > 0]
    return steps


class DecodeUnit(Unit):
    """A decode unit: its running requests per rank as ``n: float64[G]`` requests and ``kv:
    float64[G]`` context tokens; ``finish_at``: step -> requests that finish at it;
    ``running``: per rank the requests admitted, oldest first (finished ones are dropped
    lazily); ``pending``: a heap of ``(ready_s, seq, request, rank)`` whose KV is on its way
    in. ``x`` expected accepted drafts per step; ``requests`` and ``records`` the run's."""

    phase = "decode"

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
        query_tokens: int,
        drafts: int = 0,
        acceptance: float = 0.0,
        sampling: str = "per_step",
        seed: int = 0,
        max_running: int | None = None,
    ):
        super().__init__(index, step_model, loads, planner, recorder)
        self.req, self.records = requests, records
        self.cap = max_running or 1.0  # running requests per rank at full utilisation
        self.q = float(query_tokens)
        self.drafts = int(drafts)
        self.p = float(acceptance)
        self.x = accepted_mean(self.drafts, self.p)
        self.e = 1.0 + self.x  # expected tokens per request per step
        self.rng = np.random.default_rng([seed, _MTP, index]) if sampling == "per_step" else None
        self.n = np.zeros(self.G)
        self.kv = np.zeros(self.G)
        self.finish_at: dict[int, list[int]] = {}
        self.running: list[list[int]] = [[] for _ in range(self.G)]
        self.pending: list[tuple[float, int, int, int]] = []  # (ready_s, seq, request, rank)
        self.gone = 0  # retracted requests still listed in finish_at
        self._seq = 0

    def push(self, ready_s: float, request: int, rank: int) -> None:
        """``request``'s KV arrives on ``rank`` at ``ready_s``."""
        self._seq += 1
        heapq.heappush(self.pending, (ready_s, self._seq, request, rank))

    def next_ready(self) -> float:
        return self.pending[0][0] if self.pending else math.inf

    def kv_wake(self) -> Event | None:
        """A wake-up event for when the next request's KV arrives (None: a wake-up is set for
        then or earlier)."""
        ready = self.next_ready()
        if ready < self.wake_at:
            self.wake_at = ready
            return (ready, D_WAKE, self.index)
        return None

    def batch(self) -> RankBatch:
        tok = self.n * self.q
        return RankBatch.trusted(tok, self.kv * self.q, self.kv.copy(), tok.copy())

    def context(self, i: int) -> float:
        """Request ``i``'s context now (prompt + first token + expected tokens so far)."""
        req = self.req
        return float(req.p_len[i] + 1) + (self.k - int(req.d_k0[i])) * self.e

    def emitted_so_far(self, i: int) -> int:
        """Whole tokens request ``i`` has emitted in this decode attempt (fewer than it
        needs)."""
        req = self.req
        made = math.floor((self.k - int(req.d_k0[i])) * self.e + 1e-9)
        return int(min(made, int(req.d_need[i]) - 1))

    def live(self, idx: np.ndarray, k: int) -> np.ndarray:
        """``bool[m]``: which of ``finish_at[k]``'s requests ``idx`` still finish here at step
        ``k`` (a retracted request's entry stays behind, and it may run again elsewhere)."""
        req = self.req
        return (
            (req.d_phase[idx] == 2)
            & (req.d_unit[idx] == self.index)
            & (req.d_k0[idx] + req.d_steps[idx] - 1 == k)
        )

    def settle(self, i: int) -> int:
        """Request ``i`` leaves mid-way (retracted, or its rank failed): the whole tokens it
        emitted so far (`emitted_so_far`); the recorded steps, which counted ``1 + x`` per
        step for it, are corrected to that (so recorded output tokens stay exact)."""
        req = self.req
        made = self.emitted_so_far(i)
        frac = (self.k - int(req.d_k0[i])) * self.e - made
        if frac and self.row >= 0:
            self.records.patch_step(self.row, COL_OUTPUT, -frac)
        return made

    # ------------------------------------------------------------------ steps
    def admit(self, t: float) -> tuple[list[int], np.ndarray] | None:
        """Requests whose KV has arrived join the running batch: their first token goes out to
        the client now (TTFT) and their finishing step is drawn (`steps_to_emit`). Returns
        their ``(ranks, p_len: int64[m])`` (for `Admission.admitted`), None when none."""
        pend = self.pending
        if not pend or pend[0][0] > t:
            return None
        req = self.req
        got, ranks = [], []
        pop = heapq.heappop
        while pend and pend[0][0] <= t:
            _, _, i, r = pop(pend)
            got.append(i)
            ranks.append(r)
        k0 = self.k
        idx = np.array(got, dtype=np.int64)
        need = req.out[idx] - req.gen[idx]
        J = steps_to_emit(need, self.drafts, self.p, self.rng)
        req.d_k0[idx] = k0
        req.d_need[idx] = need
        req.d_steps[idx] = J
        req.d_phase[idx] = 2
        rec = self.records
        rec.decode_start_s[idx] = t
        first = idx[np.isnan(rec.first_token_s[idx])]
        rec.first_token_s[first] = t
        p_len = req.p_len[idx]
        start_ctx = (p_len + 1).astype(np.float64)
        req.d_final[idx] = start_ctx + J * self.e
        finish_at = self.finish_at
        running = self.running
        for i, kf, r in zip(got, (k0 + J - 1).tolist(), ranks, strict=True):
            finish_at.setdefault(kf, []).append(i)
            running[r].append(i)
        G = self.G
        self.n += np.bincount(ranks, minlength=G)
        self.kv += np.bincount(ranks, start_ctx, G)
        return ranks, p_len

    def start(self, t: float) -> Event | None:
        """Run the next step at ``t`` over the running requests (`admit` first): its end
        event; with none running, a wake-up event when the next request's KV arrives (None if
        none is on its way or one is set). The caller checks the unit is free."""
        total = float(np.add.reduce(self.n))
        if total <= 0.5:
            ready = self.next_ready()
            if ready < math.inf and (ready < self.wake_at or self.wake_at <= t):
                self.wake_at = ready
                return (ready, D_WAKE, self.index)
            return None
        batch = self.batch()
        tokens = total * self.q
        st = self.step_time(batch, t, tokens)
        dur = st.total_s
        out_tokens = total * self.e
        fin = self.finish_at.get(self.k)
        if fin:  # a request's last step emits what it still needs (exact sums over a life)
            req = self.req
            idx = np.array(fin, dtype=np.int64)
            if self.gone:  # (a request may sit twice in a list: once stale, once live)
                idx = np.unique(idx[self.live(idx, self.k)])
            over = req.d_steps[idx] * self.e - req.d_need[idx]
            out_tokens -= float(over.sum())
        self.busy = True
        self.wake_at = math.inf
        kv_tokens = float(np.add.reduce(self.kv))
        rec = self.records
        rec.step(self, t, st, tokens, total, kv_tokens, 0.0, out_tokens)
        rec.busy(self, t, dur, self.n / self.cap)
        return (t + dur, D_END, self.index)

    def end(self, t: float) -> tuple[np.ndarray, np.ndarray] | None:
        """The running step ends at ``t``: every request emitted its tokens; the finishing
        ones leave. Returns them and their ranks, ``(idx, ranks): int64[m]`` (None: none);
        their reservations free decode room (`Admission.finished`)."""
        self.busy = False
        k = self.k
        self.kv += self.n * self.e
        fin = self.finish_at.pop(k, None)
        self.k = k + 1
        req = self.req
        done = None
        if fin:
            idx = np.array(fin, dtype=np.int64)
            if self.gone:
                live = np.unique(idx[self.live(idx, k)])
                self.gone -= idx.size - live.size
                idx = live
            if idx.size:
                r = req.d_rank[idx]
                G = self.G
                self.n -= np.bincount(r, minlength=G)
                self.kv -= np.bincount(r, req.d_final[idx], G)
                np.maximum(self.kv, 0.0, out=self.kv)
                req.d_phase[idx] = 0
                done = (idx, r)
        if not self.k & 255:
            self.compact()
        return done

    def retract(self, over: np.ndarray, t: float) -> list[int]:
        """Ranks short of KV (``over: float64[G]`` tokens too many) retract their newest
        running requests until they fit (SGLang's retraction); returns them, newest first
        (they prefill again, prompt + tokens so far: `Admission.retracted`)."""
        req = self.req
        out = []
        for r in np.flatnonzero(over > 0).tolist():
            need = float(over[r])
            lst = self.running[r]
            while need > 0 and lst:
                i = lst.pop()
                if req.d_phase[i] != 2 or req.d_unit[i] != self.index or req.d_rank[i] != r:
                    continue
                ctx = self.context(i)
                self.kv[r] -= ctx
                self.n[r] -= 1
                need -= ctx
                req.gen[i] += self.settle(i)
                req.d_phase[i] = 0
                self.gone += 1
                out.append(i)
        np.maximum(self.kv, 0.0, out=self.kv)
        return out

    def compact(self) -> None:
        """Drop requests no longer running here from the per-rank admission lists."""
        req = self.req
        me = self.index
        for r, lst in enumerate(self.running):
            if len(lst) > 2 * self.n[r] + 64:
                self.running[r] = [
                    i
                    for i in lst
                    if req.d_phase[i] == 2 and req.d_unit[i] == me and req.d_rank[i] == r
                ]

    # ------------------------------------------------------------------ failures
    def lose_rank(self, g: int) -> tuple[list[int], list[tuple]]:
        """Rank ``g`` failed: its running requests leave with the tokens they emitted
        (`settle`; the running step's share for them comes off its record) and so do the
        transfers on their way to it. Returns ``(lost, back)``: those requests and those
        ``pending`` entries."""
        req = self.req
        done_steps = self.k  # steps finished; a running step is lost for the failed rank
        lost, lost_tokens = [], 0.0
        for kf in list(self.finish_at):
            reqs = self.finish_at[kf]
            live = self.live(np.array(reqs, dtype=np.int64), kf).tolist()
            mine = [i for i, ok in zip(reqs, live, strict=True) if ok and req.d_rank[i] == g]
            if not mine:
                continue
            self.finish_at[kf] = [i for i in reqs if i not in set(mine)]
            if not self.finish_at[kf]:
                del self.finish_at[kf]
            for i in mine:
                req.gen[i] += self.settle(i)
                req.d_phase[i] = 0
                lost.append(i)
                if self.busy:  # what the running step would have emitted for it
                    step_out = self.e
                    if kf == done_steps:
                        step_out -= req.d_steps[i] * self.e - req.d_need[i]
                    lost_tokens += step_out
        self.running[g] = []
        if self.busy and lost_tokens:
            self.records.patch_step(self.row, COL_OUTPUT, -float(lost_tokens))
        self.n[g] = 0.0
        self.kv[g] = 0.0
        back, keep = [], []
        for item in self.pending:
            (back if item[3] == g else keep).append(item)
        if back:
            heapq.heapify(keep)
            self.pending = keep
        return lost, back

    def drop_transfers(self, t: float, lost) -> list[int]:
        """Transfers still on their way at ``t`` (arriving after it) of the requests for which
        ``lost(request)`` holds are cancelled (their KV was lost at the source); returns those
        requests in ``pending`` order."""
        keep, gone = [], []
        for item in self.pending:
            if item[0] > t and lost(item[2]):
                gone.append(item[2])
            else:
                keep.append(item)
        if len(keep) != len(self.pending):
            heapq.heapify(keep)
            self.pending = keep
        return gone
