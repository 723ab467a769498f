"""`Admission`, the PD router: the only writer of the router's state (`RouterState`). The
cluster's handlers (`simulator.cluster`) and faults call it; it calls no unit's handler: a
routing call returns the units it gave work to, and the caller starts them."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

import numpy as np

from eplb.evaluation.serving.config import ClusterConfig
from eplb.evaluation.serving.config.budget import kv_capacity_for_slots
from eplb.evaluation.serving.simulator.decode import DecodeUnit
from eplb.evaluation.serving.simulator.events import ARRIVE, Event
from eplb.evaluation.serving.simulator.prefill import PrefillUnit
from eplb.evaluation.serving.simulator.records import Records
from eplb.evaluation.serving.simulator.requests import Requests
from eplb.evaluation.serving.simulator.router import decode_reservation as reservations
from eplb.evaluation.serving.simulator.router import kv_transfer, prefill_routing
from eplb.evaluation.serving.simulator.router.queue_order import OFFER_CAP, requeue
from eplb.evaluation.serving.simulator.router.state import RouterState

__all__ = ["Admission"]


class Admission:
    """The router over every rank of every unit (its state: ``state``, a `RouterState`).

    Routing (each returns the units it gave work to, in index order): `flush` (arrivals),
    `route_prefill`, `route_reservations`, `reroute`, `route_decode`. What the units report:
    `step_due`, `step_started`, `step_ended` (a prefill step), `prefilled`, `admitted`, `finished`,
    `kv_over`, `retracted`. Faults: `requeue`, `prefill_rank_lost`, `decode_rank_lost`.
    """

    def __init__(self, config: ClusterConfig, seed: int, requests: Requests, records: Records,
                 prefill: Sequence[PrefillUnit], decode: Sequence[DecodeUnit]):
        self.cfg = config
        self.state = RouterState.of(config, seed)
        self.req, self.rec = requests, records
        self.prefill, self.decode = prefill, decode

    def size_kv(self, unit: int, expert_slots: int) -> None:
        """Decode unit ``unit``'s ranks hold at most ``expert_slots`` routed experts each,
        summed over layers (`Planner.reserve`), not ``slots_per_gpu`` in every layer: their KV
        capacity grows by the tokens the freed FP8 expert weights hold
        (`config.budget.kv_capacity_for_slots`). Sized once at the start, as an engine sizes
        its KV pool from the memory left after loading weights."""
        layers = self.cfg.model_spec.moe_layers
        cap = kv_capacity_for_slots(self.cfg, "decode", expert_slots, layers)
        if cap is None:
            return
        st = self.state
        Gd = st.settings.Gd
        sl = slice(unit * Gd, (unit + 1) * Gd)
        st.kv_cap[sl] = float(cap)
        st.d_state.kv_blocks_capacity[sl] = cap // st.settings.block_size

    # ------------------------------------------------------------------ arrivals
    def arrival_event(self) -> Event | None:
        """An arrival event for the next request, only while some prefill unit could start at
        once (else its request is routed by the next prefill event's `flush`)."""
        st, req = self.state, self.req
        if st.ptr >= req.n or st.arrive_at <= req.arrival[st.ptr]:
            return None
        if any(not u.busy and not u.dead for u in self.prefill):
            st.arrive_at = float(req.arrival[st.ptr])
            return (st.arrive_at, ARRIVE, None)
        return None

    def arrived(self) -> None:
        """The arrival event happened (its requests were routed by `flush` before it)."""
        self.state.arrive_at = math.inf

    def flush(self, t: float) -> list[int]:
        """Route every request that arrived by ``t`` (the router's state has not changed since
        it arrived: only the events `flush` runs before change it)."""
        st, arrival = self.state, self.req.arrival
        if st.ptr >= self.req.n or arrival[st.ptr] > t:
            return []
        stop = int(np.searchsorted(arrival, t, side="right"))
        fresh = range(st.ptr, stop)
        st.ptr = stop
        if st.settings.before:
            return self._reserve(t, fresh)
        return self.route_prefill(t, fresh)

    # ------------------------------------------------------------------ routing
    def route_prefill(self, t: float, fresh=(), late=()) -> list[int]:
        """Offer the waiting head (when the prefill view changed), the ``late`` requests
        (routed now) and the ``fresh`` arrivals to the prefill balancer
        (`prefill_routing.route`); the prefill units given requests."""
        return prefill_routing.route(self.state, self.req, self.rec, self.prefill, t, fresh, late)

    def _reserve(self, t: float, fresh=()) -> list[int]:
        """``before_prefill``: reserve decode KV (`decode_reservation.reserve`). Under
        ``global_queue`` the reserved requests go on to the prefill balancer; under
        ``rank_queues`` the reserved ones already on a prefill rank become ready there and
        every ``fresh`` arrival is dispatched (the unreserved ones unready). The prefill units
        given ready requests."""
        st = self.state
        late, placed = reservations.reserve(st, self.req, fresh)
        if st.settings.rank_queues:
            woken = prefill_routing.hold_cleared(st, self.prefill, [*late, *placed], t)
            started = self.route_prefill(t, fresh)
            return sorted({*woken, *started}) if woken else started
        if late or placed:
            return self.route_prefill(t, placed, late)
        return []

    def route_reservations(self, t: float) -> list[int]:
        """``before_prefill``: offer the reservation queue again when the decode view changed
        since it was last offered; the prefill units given requests."""
        st = self.state
        if st.settings.before and st.r_wait and st.d_version != st.r_offered:
            return self._reserve(t)
        return []

    def reroute(self, t: float) -> list[int]:
        """Offer the requests sent back to the head (`requeue`, `retracted`) again: through the
        reservation queue (``before_prefill``) or the prefill queue."""
        return self._reserve(t) if self.state.settings.before else self.route_prefill(t)

    def route_decode(self, t: float, fresh: bool = False) -> list[int]:
        """Offer the head of the decode queue to the decode balancer: as many requests as
        joined it plus twice as many as finished since the last offer (what can have room
        now), so a long queue costs nothing per step while nothing frees up; the placed ones'
        KV moves to their rank (`kv_transfer.send`). ``fresh``: requests joined the queue.
        Returns the decode units sent to."""
        st = self.state
        if not st.d_wait or (not fresh and st.d_version == st.d_offered):
            return []
        st.d_offered = st.d_version
        m = min(len(st.d_wait), OFFER_CAP * 4, st.d_new + 2 * st.d_freed + 8)
        st.d_new = st.d_freed = 0
        offer = [st.d_wait[j] for j in range(m)]
        idx = np.fromiter(offer, dtype=np.int64, count=m)
        ranks = reservations.place(st, self.req, idx)
        requeue(st.d_wait, offer, m, ranks)
        sel = ranks >= 0
        if sel.any():
            return kv_transfer.send(st, self.req, self.rec, self.decode, idx[sel], t)
        return []

    # ------------------------------------------------------------------ prefill steps
    def step_due(self, unit: PrefillUnit, t: float) -> None:
        """``unit`` may start a step at ``t``: under ``rank_queues`` the prompts it may
        schedule look up their cached prefix now (`prefill_routing.look_up`)."""
        if self.state.settings.rank_queues:
            prefill_routing.look_up(self.state, self.req, self.rec, unit, t)

    def step_started(self, unit: PrefillUnit) -> None:
        """``unit``'s step started with the chunks ``unit.inflight``: they leave their
        prompts' queues in the balancer's view (which fills the next step), and the step's work
        (``unit.step_tokens``, attention) is charged evenly to the unit's ranks until it ends:
        they all wait for it, so it tells units apart without unbalancing the next step."""
        st = self.state
        state = st.p_state
        G = unit.G
        g0 = unit.index * G
        att = 0.0
        rows, new, pairs = [], [], []
        for _r, owner, _e, n, c, _last in unit.inflight:
            a = n * c + n * n / 2
            rows.append(g0 + owner)
            new.append(n)
            pairs.append(a)
            att += a
        np.subtract.at(state.queued_tokens, rows, new)  # (in order, as one at a time)
        np.subtract.at(state.attention_cost, rows, pairs)
        sl = slice(g0, g0 + G)
        charged = st.p_charged[unit.index] = (unit.step_tokens / G, att / G)
        state.running_tokens[sl] += charged[0]
        state.attention_cost[sl] += charged[1]
        np.maximum(state.queued_tokens, 0.0, out=state.queued_tokens)
        np.maximum(state.attention_cost, 0.0, out=state.attention_cost)
        st.p_version += 1

    def step_ended(self, unit: PrefillUnit, done: list[tuple[int, int]]) -> None:
        """``unit``'s step ended: its charge comes off, and the prompts it finished, ``done``
        as ``(rank, request)``, leave their ranks."""
        st = self.state
        state, p_blocks = st.p_state, self.req.p_blocks
        g0 = unit.index * unit.G
        sl = slice(g0, g0 + unit.G)
        charged = st.p_charged[unit.index]
        state.running_tokens[sl] -= charged[0]
        state.attention_cost[sl] -= charged[1]
        st.p_charged[unit.index] = (0.0, 0.0)
        for r, i in done:
            g = g0 + r
            state.num_requests[g] -= 1
            state.kv_blocks_used[g] -= p_blocks[i]
        for arr in (
            state.kv_blocks_used,
            state.num_requests,
            state.running_tokens,
            state.attention_cost,
        ):
            np.maximum(arr, 0.0, out=arr)
        st.p_version += 1

    def prefilled(self, completed: list[int], t: float) -> list[int]:
        """Prompts whose prefill finished at ``t``: the first token is made, their blocks enter
        the store and the rank's cache; their KV moves to the decode rank they reserved (or
        they join the decode queue, or finish: one-token outputs, whose first token is out
        now). Returns the decode units sent to; then offer the decode queue (`route_decode`
        with ``fresh``)."""
        st, req, rec = self.state, self.req, self.rec
        Gp = st.settings.Gp
        send = []
        for i in completed:
            if math.isnan(rec.prefill_end_s[i]):
                rec.prefill_end_s[i] = t
            req.gen[i] += 1
            rec.prefills[i] += 1
            if req.hashes is not None:
                h = req.hashes[i]
                st.store.insert(h)
                if st.local is not None:
                    st.local.insert(int(req.p_unit[i] * Gp + req.p_rank[i]), h)
            if req.gen[i] >= req.out[i]:
                if req.d_phase[i] == 1:
                    reservations.release(st, req, i)
                if math.isnan(rec.first_token_s[i]):
                    rec.first_token_s[i] = t
                    rec.kv_ready_s[i] = t
                rec.finished(i, t)
                req.finish(i)
            elif req.d_phase[i] == 1:
                send.append(i)
            else:
                st.d_wait.append(i)
                st.d_new += 1
        if send:
            return kv_transfer.send(st, req, rec, self.decode, np.array(send, dtype=np.int64), t)
        return []

    # ------------------------------------------------------------------ decode steps
    def admitted(self, unit: DecodeUnit, ranks: list[int], p_len: np.ndarray) -> None:
        """Requests joined ``unit``'s running batch on ``ranks``: their prompt KV now counts
        in the unit's context sums, no longer as reserved prompts."""
        g = np.asarray(ranks, dtype=np.int64) + unit.index * self.state.settings.Gd
        np.subtract.at(self.state.d_prompt, g, p_len.astype(np.float64))

    def finished(self, unit: DecodeUnit, idx: np.ndarray, ranks: np.ndarray, t: float) -> None:
        """The requests ``idx: int64[m]`` finished on ``ranks: int64[m]`` of ``unit`` at
        ``t``: their reservations go."""
        st = self.state
        reservations.unreserve(st, unit.index * st.settings.Gd + ranks, self.req.d_kv[idx])
        st.d_version += 1
        st.d_freed += idx.size
        self.rec.finished_many(idx, t)
        self.req.finish_many(idx)

    def kv_over(self, unit: DecodeUnit) -> np.ndarray | None:
        """``float64[G]`` KV tokens ``unit``'s ranks hold beyond their capacity (running
        contexts + reserved prompts), or None when none is over; keeps the balancer's view at
        the larger of what is reserved and what is in use."""
        st = self.state
        s = st.settings
        if not s.retracts:
            return None
        sl = slice(unit.index * s.Gd, (unit.index + 1) * s.Gd)
        used = st.d_prompt[sl] + unit.kv
        np.maximum(st.d_res_blocks[sl], used / s.block_size, out=st.d_state.kv_blocks_used[sl])
        over = used - st.kv_cap[sl]
        return over if (over > 0).any() else None

    def retracted(self, unit: DecodeUnit, idx: list[int], t: float) -> None:
        """``unit`` retracted the running requests ``idx`` (newest first): their reservations
        go, they count in ``retractions`` and go back to the head to prefill again (prompt +
        tokens made so far); then `reroute`."""
        st, req = self.state, self.req
        Gd = st.settings.Gd
        for i in idx:
            g = int(req.d_unit[i] * Gd + req.d_rank[i])
            reservations.unreserve(st, g, float(req.d_kv[i]))
            self.rec.retractions[i] += 1
        st.d_version += 1
        st.d_freed += len(idx)
        self.requeue(sorted(idx), t, retry=False)

    # ------------------------------------------------------------------ failures
    def requeue(self, idx: list[int], t: float, *, retry: bool = True) -> None:
        """Requests that must (re)run their prefill (prompt + tokens made so far) go back to
        the head of the router queue (``before_prefill``: of the reservation queue; under
        ``rank_queues`` they are dispatched to a prefill rank again at the next routing, and
        ``before_prefill`` reserves their decode KV anew), their decode reservation given up;
        ``retry`` counts them in ``retries``."""
        st, req = self.state, self.req
        s = st.settings
        queue = st.r_wait if s.before and not s.rank_queues else st.p_wait
        for i in reversed(idx):
            if req.d_phase[i] == 1:
                reservations.release(st, req, i)
            req.d_phase[i] = 0
            if retry:
                req.retries[i] += 1
            req.p_len[i] = req.inp[i] + req.gen[i]  # prompt + tokens generated so far
            req.p_unit[i] = req.p_rank[i] = req.d_unit[i] = req.d_rank[i] = -1
            queue.appendleft(i)
            if s.rank_queues:  # dispatched again; a held one is still in the reservation queue
                st.cleared.discard(i)
                st.unlooked.discard(i)
                if st.held.pop(i, None) is None and s.before:
                    st.r_wait.appendleft(i)
        st.p_version += 1
        st.d_version += 1

    def prefill_rank_lost(self, unit: PrefillUnit, g: int, lost: list[int], t: float) -> int:
        """Rank ``g`` of prefill ``unit`` failed at ``t`` with the requests ``lost`` on it (its
        queue and running chunks, `PrefillUnit.lose_rank`): the rank leaves the balancer's
        view, its cache is gone, and so is the KV of prefilled requests still on it (waiting
        for decode room or in transfer). Those requests and ``lost`` prefill again; how many
        they are."""
        st, req = self.state, self.req
        Gp = st.settings.Gp
        gg = unit.index * Gp + g
        st.p_state.fail(gg)
        if st.local is not None:
            st.local.clear(gg)
        on_g = [i for i in st.d_wait if req.p_unit[i] * Gp + req.p_rank[i] == gg]
        if on_g:
            drop = set(on_g)
            st.d_wait = deque(i for i in st.d_wait if i not in drop)
        for du in self.decode:
            gone = du.drop_transfers(t, lambda i: req.p_unit[i] * Gp + req.p_rank[i] == gg)
            for i in gone:  # their KV had not arrived
                reservations.release(st, req, i)
            on_g += gone
        for i in on_g:  # their first token was out; the KV is gone: prefill again
            req.gen[i] = max(req.gen[i], 1)
        self.requeue(lost + on_g, t)
        return len(lost) + len(on_g)

    def decode_rank_lost(self, unit: DecodeUnit, g: int, lost: list[int], back: list[tuple],
                         t: float) -> int:
        """Rank ``g`` of decode ``unit`` failed at ``t`` (`DecodeUnit.lose_rank`): its running
        requests ``lost`` prefill again (prompt + tokens so far); the transfers on their way
        to it, ``back`` (its ``pending`` entries), retry from the decode queue (their KV is
        still on the prefill side); requests still in prefill with KV reserved on it give the
        reservation up (they join the decode queue when their prefill ends). How many requests
        it sent back."""
        st, req = self.state, self.req
        if back:
            for item in sorted(back):
                req.retries[item[2]] += 1
                req.d_unit[item[2]] = req.d_rank[item[2]] = -1
            st.d_wait.extendleft(item[2] for item in sorted(back, reverse=True))
            st.d_new += len(back)
        held = np.nonzero((np.asarray(req.d_phase) == 1) & (np.asarray(req.d_unit) == unit.index)
                          & (np.asarray(req.d_rank) == g))[0]
        for i in held.tolist():
            reservations.release(st, req, i)
            req.d_unit[i] = req.d_rank[i] = -1
        st.d_state.fail(unit.index * st.settings.Gd + g)
        st.d_version += 1
        self.requeue(lost, t)
        return len(lost) + len(back)
