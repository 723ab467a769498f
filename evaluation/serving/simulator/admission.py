"""Routing and admission: decode KV reserved (before prefill, as SGLang's PD decode server
pre-allocates it, or after), requests into the prefill queue and onto prefill ranks (the
prefill balancer, prefix-cache hits, store loads), prefilled requests' KV moved to their
decode rank, retraction when a decode rank's KV runs out. The PD scheduler's room."""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from eplb.evaluation.serving import balancers
from eplb.evaluation.serving.balancers import RankState, RequestBatch
from eplb.evaluation.serving.config import DEFAULT_TOKEN_BUDGET, ClusterConfig
from eplb.evaluation.serving.config.budget import kv_capacity_for_slots
from eplb.evaluation.serving.kvcache import KVStore, RankCaches
from eplb.evaluation.serving.simulator.events import ARRIVE, D_WAKE

OFFER_CAP = 256  # waiting requests offered to a balancer at once (head of the queue)
_FCFS_RUNS = 6  # balancer runs per offer at most under fcfs / lpm (`Admission._assign`)
_BALANCE_P, _BALANCE_D = 3, 4  # rng purposes (popularity = 1, step noise = 2: expert_loads)


class Admission:
    """The router's state over every rank of every unit.

    Queues: ``r_wait`` (``before_prefill``: requests waiting for their decode KV reservation),
    ``p_wait`` (requests no prefill rank took yet; retries at the head), ``d_wait``
    (prefilled requests waiting for a decode rank); ``ptr`` the next arrival to route. Order:
    ``scheduler.policy`` (`SchedulerConfig`). Decode KV: ``d_res_blocks: float64[R_decode]``
    blocks reserved per rank, ``d_prompt: float64[R_decode]`` prompt tokens of reserved
    requests not running yet (their KV is allocated: SGLang pre-allocates it).
    Balancer views (`RankState`): ``p_state`` over the ``count * G_prefill`` prefill ranks,
    ``d_state`` over the decode ranks. KV: the external ``store`` (`KVStore`), the prefill
    ranks' ``local`` caches (`RankCaches` or None), ``loader_busy: float64[R_prefill]`` (a
    rank's store load in flight until then), ``xfer_busy: float64[R_prefill]`` (its KV
    transfer to decode in flight until then).
    """

    def __init__(self, sim, config: ClusterConfig, seed: int):
        self.sim = sim
        self.req, self.rec, self.events = sim.req, sim.records, sim.events
        self.prefill, self.decode = sim.units["prefill"], sim.units["decode"]
        self.cfg = config
        model = config.model_spec
        bs = self.bs = config.kv.block_size
        self.kvb = model.kv_bytes_per_token * model.num_layers  # KV bytes per token, all layers
        pu, du = config.prefill, config.decode
        Gp, Gd = self.Gp, self.Gd = pu.num_gpus, du.num_gpus
        # balancer views over every rank of every unit
        caches = None
        if pu.balancer == "cache_aware":
            caches = RankCaches(pu.count * Gp, config.kv.gpu_cache_blocks or None, bs)
        self.p_state = RankState(
            pu.count * Gp,
            "prefill",
            token_budget=pu.token_budget or DEFAULT_TOKEN_BUDGET,
            block_size=bs,
            caches=caches,
        )
        kv_cap = math.inf if du.kv_capacity_tokens is None else du.kv_capacity_tokens // bs
        dcaches = None
        if du.balancer == "cache_aware":
            dcaches = RankCaches(du.count * Gd, None, bs)
        self.d_state = RankState(
            du.count * Gd,
            "decode",
            kv_blocks_capacity=kv_cap,
            max_requests=math.inf if du.max_running_requests is None else du.max_running_requests,
            block_size=bs,
            caches=dcaches,
        )
        self.p_rng = np.random.default_rng([seed, _BALANCE_P])
        self.d_rng = np.random.default_rng([seed, _BALANCE_D])
        # KV store, GPU-local caches, loaders
        self.store = KVStore(config.kv.store_capacity_blocks, bs)
        self.local = (
            RankCaches(pu.count * Gp, config.kv.gpu_cache_blocks, bs)
            if config.kv.gpu_cache_blocks
            else None
        )
        self.load_bw = config.kv.store_load_gbps * 1e9 / pu.gpus_per_node
        self.xfer_bw = config.kv.transfer_gbps * 1e9
        self.loader_busy = np.zeros(pu.count * Gp)
        self.xfer_busy = np.zeros(pu.count * Gp)
        # queues
        self.ptr = 0  # next arrival
        self.arrive_at = math.inf  # the pending arrival event's time
        self.p_wait: deque[int] = deque()
        self.d_wait: deque[int] = deque()
        self.p_version = self.p_offered = 0
        self.d_version = self.d_offered = 0
        self.d_new = self.d_freed = 0  # joined the decode queue / finished since the last offer
        # the scheduler (`SchedulerConfig`)
        sch = config.scheduler
        self.before = sch.decode_reservation == "before_prefill"
        self.policy = sch.policy
        self.reserve_out = sch.reserved_decode_tokens  # None: the whole output
        cap = du.kv_capacity_tokens
        self.kv_cap = np.full(du.count * Gd, math.inf if cap is None else float(cap))
        self.retracts = self.reserve_out is not None and cap is not None
        Rd = du.count * Gd
        self.d_res_blocks = np.zeros(Rd)  # KV blocks reserved per decode rank
        self.d_prompt = np.zeros(Rd)  # prompt KV of reserved, not yet running requests
        self.r_wait: deque[int] = deque()  # waiting for a decode reservation (before_prefill)
        self.r_offered = -1

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
        sl = slice(unit * self.Gd, (unit + 1) * self.Gd)
        self.kv_cap[sl] = float(cap)
        self.d_state.kv_blocks_capacity[sl] = cap // self.bs

    # ------------------------------------------------------------------ arrivals
    def maybe_arrival_event(self) -> None:
        """Arrivals are events only while some prefill unit could start at once."""
        req = self.req
        if self.ptr >= req.n or self.arrive_at <= req.arrival[self.ptr]:
            return
        if any(not u.busy and not u.dead for u in self.prefill):
            self.arrive_at = float(req.arrival[self.ptr])
            self.events.push(self.arrive_at, ARRIVE)

    def on_arrive(self, arg, t: float) -> None:
        """The arrival event (its requests were routed by `flush` before it)."""
        self.arrive_at = math.inf

    def flush(self, t: float) -> None:
        """Route every request that arrived by ``t`` (the router's state has not changed since
        it arrived: only the events `flush` runs before change it)."""
        arrival = self.req.arrival
        if self.ptr >= self.req.n or arrival[self.ptr] > t:
            return
        stop = int(np.searchsorted(arrival, t, side="right"))
        fresh = range(self.ptr, stop)
        self.ptr = stop
        if self.before:
            self.route_reserve(t, fresh)
        else:
            self.route_prefill(t, fresh)

    # ------------------------------------------------------------------ order
    def _assign(self, name, batch, state, rng, options) -> np.ndarray:
        """The balancer's ranks for ``batch`` (committed to ``state``). ``first_fit``: as the
        balancer placed them (a newer request that fits may overtake an older one that does
        not). ``fcfs`` / ``lpm``: only a prefix of the queue is placed: the balancer's
        placements before the first request it left out are kept (valid: dropping the later
        ones only lowers loads), then the rest is offered again, its head alone if it does
        not fit beside the others, until the head fits nowhere (at most ``_FCFS_RUNS``
        runs)."""
        if self.policy == "first_fit":
            ranks = balancers.assign(name, batch, state, seed=rng, commit=False, **options)
            state.add(batch, ranks)
            return ranks
        n = len(batch)
        out = np.full(n, -1, dtype=np.int64)
        pos = 0
        for _ in range(_FCFS_RUNS):
            sub = batch if pos == 0 else batch.take(np.arange(pos, n))
            ranks = balancers.assign(name, sub, state, seed=rng, commit=False, **options)
            miss = np.flatnonzero(ranks < 0)
            k = int(miss[0]) if miss.size else ranks.size
            if k == 0:  # the head did not fit beside the others: alone, so it never starves
                ranks = balancers.assign(
                    name, batch.take(np.arange(pos, pos + 1)), state, seed=rng, commit=False,
                    **options,
                )
                k = 1 if ranks[0] >= 0 else 0
                if not k:
                    break
            out[pos:pos + k] = ranks[:k]
            state.add(batch.take(np.arange(pos, pos + k)), ranks[:k])
            pos += k
            if pos >= n or not miss.size:
                break
        return out

    # ------------------------------------------------------------------ decode reservation
    def _reservation(self, idx: np.ndarray) -> np.ndarray:
        """``int64[m]``: decode KV tokens the requests ``idx`` reserve: prompt (+ tokens made
        so far) + the output still to come, at most ``reserved_decode_tokens`` of it."""
        req = self.req
        rest = req.out[idx] - req.gen[idx]
        if self.reserve_out is not None:
            rest = np.minimum(rest, self.reserve_out)
        return req.p_len[idx] + rest

    def _offer_head(self, queue: deque, version_changed: bool, fresh, cap: int):
        """The head of ``queue`` (when something changed) and the ``fresh`` requests to offer;
        under ``fcfs``/``lpm`` fresh requests join the back unoffered while older ones wait
        unoffered (nothing overtakes). Returns ``(offer, old, skipped_fresh)``."""
        old = 0
        offer: list[int] = []
        if queue and version_changed:
            old = min(len(queue), cap)
            offer = [queue[j] for j in range(old)]
        fresh = list(fresh)
        if self.policy != "first_fit" and len(queue) > old:
            return offer, old, fresh
        offer.extend(fresh)
        return offer, old, []

    def _requeue(self, queue: deque, offer: list, old: int, ranks) -> None:
        """``queue`` keeps its order: the offered old ones not placed stay at its head, the
        new ones not placed join its back."""
        if old:
            keep = [queue.popleft() for _ in range(old)]
            for j in range(old - 1, -1, -1):
                if ranks[j] < 0:
                    queue.appendleft(keep[j])
        for j in range(old, len(offer)):
            if ranks[j] < 0:
                queue.append(offer[j])

    def route_reserve(self, t: float, fresh=()) -> None:
        """``before_prefill``: reserve decode KV for the head of the reservation queue and the
        ``fresh`` arrivals (the decode balancer picks the rank); the reserved ones go on to
        the prefill balancer. One-token outputs need no decode KV: they pass, in their turn
        (under ``fcfs`` not past a request still waiting)."""
        req = self.req
        changed = self.d_version != self.r_offered
        offer, old, skipped = self._offer_head(self.r_wait, changed, fresh, OFFER_CAP * 4)
        if self.r_wait and changed:
            self.r_offered = self.d_version
        if offer:
            idx = np.fromiter(offer, dtype=np.int64, count=len(offer))
            one = (req.out[idx] - req.gen[idx]) <= 1
            ranks = np.zeros(idx.size, dtype=np.int64)  # one-token ones: placed (0)
            multi = np.flatnonzero(~one)
            if multi.size:
                ranks[multi] = self._place_decode(idx[multi])
                if self.policy != "first_fit":
                    miss = multi[ranks[multi] < 0]
                    if miss.size:
                        later = one & (np.arange(idx.size) > miss[0])
                        ranks[later] = -1
            self._requeue(self.r_wait, offer, old, ranks)
            placed_late = [i for j, i in enumerate(offer) if j < old and ranks[j] >= 0]
            placed_fresh = [i for j, i in enumerate(offer) if j >= old and ranks[j] >= 0]
        else:
            placed_late = placed_fresh = []
        self.r_wait.extend(skipped)
        if placed_late or placed_fresh:
            self.route_prefill(t, placed_fresh, placed_late)

    def _place_decode(self, idx: np.ndarray) -> np.ndarray:
        """Offer the requests ``idx`` to the decode balancer with their reservations; the
        placed ones hold KV on their rank (``d_phase`` 1). ``int64[m]`` global ranks."""
        req = self.req
        kv = self._reservation(idx)
        req.d_kv[idx] = kv
        batch = RequestBatch(
            req.p_len[idx],
            None,
            np.maximum(req.out[idx] - req.gen[idx], 0),
            kv,
            tuple(req.hashes[i] for i in idx.tolist())
            if self.d_state.caches is not None and req.hashes
            else None,
            idx,
        )
        du = self.cfg.decode
        ranks = self._assign(du.balancer, batch, self.d_state, self.d_rng, du.balancer_options)
        sel = ranks >= 0
        if sel.any():
            got, g = idx[sel], ranks[sel]
            v, r = np.divmod(g, self.Gd)
            req.d_unit[got], req.d_rank[got] = v, r
            req.d_phase[got] = 1
            np.add.at(self.d_prompt, g, req.p_len[got].astype(np.float64))
            np.add.at(self.d_res_blocks, g, (-(-kv[sel] // self.bs)).astype(np.float64))
        return ranks

    # ------------------------------------------------------------------ prefill routing
    def route_prefill(self, t: float, fresh=(), late=()) -> None:
        """Offer the head of the waiting queue (when something changed), the ``late``
        requests (routed now) and the ``fresh`` arrivals (routed at their arrival) to the
        prefill balancer in ``scheduler.policy`` order; the placed ones join their rank's
        queue (their cached prefix loading from the store first), the rest wait in order."""
        req, rec = self.req, self.rec
        changed = self.p_version != self.p_offered
        offer, old, skipped = self._offer_head(
            self.p_wait, changed, [*late, *fresh], OFFER_CAP
        )
        if self.p_wait and changed:
            self.p_offered = self.p_version
        n_late = len(late) if not skipped else 0
        if not offer:
            self.p_wait.extend(skipped)
            return
        idx = np.fromiter(offer, dtype=np.int64, count=len(offer))
        L = req.p_len[idx]
        if req.hashes is not None:
            match = self.store.match
            hs = req.hashes
            store_blocks = np.array([match(hs[i], touch=False) for i in offer], dtype=np.int64)
        else:
            store_blocks = np.zeros(idx.size, dtype=np.int64)
        store_tok = np.minimum(store_blocks * self.bs, L - 1)
        perm = None
        if self.policy == "lpm" and idx.size > 1:
            perm = np.argsort(-store_tok, kind="stable")  # longest cached prefix first
            if (perm == np.arange(perm.size)).all():
                perm = None
        o_idx = idx if perm is None else idx[perm]
        o_store = store_tok if perm is None else store_tok[perm]
        o_L = L if perm is None else L[perm]
        cache_aware = self.p_state.caches is not None
        batch = RequestBatch(
            o_L,
            o_store,
            np.maximum(req.out[o_idx] - req.gen[o_idx], 1),
            None,
            tuple(req.hashes[i] for i in o_idx.tolist()) if cache_aware and req.hashes else None,
            o_idx,
        )
        pu = self.cfg.prefill
        o_ranks = self._assign(pu.balancer, batch, self.p_state, self.p_rng, pu.balancer_options)
        if perm is None:
            ranks = o_ranks
        else:
            ranks = np.empty_like(o_ranks)
            ranks[perm] = o_ranks
        state = self.p_state
        started = set()
        ranks_l, store_l, L_l = ranks.tolist(), store_tok.tolist(), L.tolist()
        fresh_l = (req.retries[idx] == 0).tolist()
        arrival, hashes, local = req.arrival_l, req.hashes, self.local
        store_match = self.store.match
        Gp, bs, kvb, load_bw = self.Gp, self.bs, self.kvb, self.load_bw
        queues = [unit.queues for unit in self.prefill]
        sel, cached, loaded, routed_s, units_, ranks_ = [], [], [], [], [], []
        for j, i in enumerate(offer):
            g = ranks_l[j]
            if g < 0:
                continue
            u, r = divmod(g, Gp)
            c_store = store_l[j]
            c = c_store
            c_local = 0
            Lj = L_l[j]
            if hashes is not None:
                store_match(hashes[i])  # the counted, touching lookup
                if local is not None:
                    c_local = min(local.touch(g, hashes[i]) * bs, Lj - 1)
                    c = max(c, c_local)
            if c != c_store:  # the local cache covered more than the router knew
                u0, u1 = Lj - c_store, Lj - c
                state.queued_tokens[g] -= u0 - u1
                state.attention_cost[g] += u1 * (c + u1 / 2) - u0 * (c_store + u0 / 2)
            routed = arrival[i] if j >= old + n_late and fresh_l[j] else t
            ready = routed
            load_tok = c_store - c_local if c_store > c_local else 0
            if load_tok > 0:
                busy = float(self.loader_busy[g])
                ready = (routed if routed >= busy else busy) + load_tok * kvb / load_bw
                self.loader_busy[g] = ready
            sel.append(j)
            cached.append(c)
            loaded.append(load_tok)
            routed_s.append(routed)
            units_.append(u)
            ranks_.append(r)
            queues[u][r].append([i, Lj - c, 0, c, ready])
            started.add(u)
        if sel:
            got = idx[sel]
            rec.cached[got] = cached
            rec.store_tokens[got] = loaded
            rec.routed_s[got] = routed_s
            req.p_unit[got] = units_
            req.p_rank[got] = ranks_
            req.p_blocks[got] = -(-L[sel] // bs)
        self._requeue(self.p_wait, offer, old, ranks)
        self.p_wait.extend(skipped)
        sim = self.sim
        for u in sorted(started):
            unit = self.prefill[u]
            if not unit.busy and not unit.dead:
                unit.start(sim, t)

    def requeue_prefill(self, idx: list[int], t: float, *, retry: bool = True) -> None:
        """Requests that must (re)run their prefill (prompt + tokens made so far) go back to
        the head of the router queue (``before_prefill``: of the reservation queue), their
        decode reservation given up; ``retry`` counts them in ``retries``."""
        req = self.req
        queue = self.r_wait if self.before else self.p_wait
        for i in reversed(idx):
            if req.d_phase[i] == 1:
                self.release(i)
            req.d_phase[i] = 0
            if retry:
                req.retries[i] += 1
            req.p_len[i] = req.inp[i] + req.gen[i]  # prompt + tokens generated so far
            req.p_unit[i] = req.p_rank[i] = req.d_unit[i] = req.d_rank[i] = -1
            queue.appendleft(i)
        self.p_version += 1
        self.d_version += 1

    # ------------------------------------------------------------------ prefill -> decode
    def prefill_done(self, completed: list[int], t: float) -> None:
        """Prompts whose prefill finished at ``t``: the first token is made, their blocks enter
        the store and the rank's cache; their KV moves to the decode rank they reserved (or
        they join the decode queue, or finish: one-token outputs, whose first token is out
        now)."""
        req, rec, sim = self.req, self.rec, self.sim
        send = []
        for i in completed:
            if math.isnan(rec.prefill_end_s[i]):
                rec.prefill_end_s[i] = t
            req.gen[i] += 1
            rec.prefills[i] += 1
            if req.hashes is not None:
                h = req.hashes[i]
                self.store.insert(h)
                if self.local is not None:
                    self.local.insert(int(req.p_unit[i] * self.Gp + req.p_rank[i]), h)
            if req.gen[i] >= req.out[i]:
                if req.d_phase[i] == 1:
                    self.release(i)
                if math.isnan(rec.first_token_s[i]):
                    rec.first_token_s[i] = t
                    rec.kv_ready_s[i] = t
                sim.finish(i, t)
            elif req.d_phase[i] == 1:
                send.append(i)
            else:
                self.d_wait.append(i)
                self.d_new += 1
        if send:
            self._send(np.array(send, dtype=np.int64), t)
        self.route_decode(t, fresh=True)

    # ------------------------------------------------------------------ decode routing
    def route_decode(self, t: float, fresh: bool = False) -> None:
        """Offer the head of the decode queue to the decode balancer: as many requests as
        joined it plus twice as many as finished since the last offer (what can have room
        now), so a long queue costs nothing per step while nothing frees up; the placed ones'
        KV moves to their rank. ``before_prefill``: the reservation queue is offered too."""
        if self.before and self.r_wait and self.d_version != self.r_offered:
            self.route_reserve(t)
        if not self.d_wait or (not fresh and self.d_version == self.d_offered):
            return
        self.d_offered = self.d_version
        m = min(len(self.d_wait), OFFER_CAP * 4, self.d_new + 2 * self.d_freed + 8)
        self.d_new = self.d_freed = 0
        offer = [self.d_wait[j] for j in range(m)]
        idx = np.fromiter(offer, dtype=np.int64, count=m)
        ranks = self._place_decode(idx)
        self._requeue(self.d_wait, offer, m, ranks)
        sel = ranks >= 0
        if sel.any():
            self._send(idx[sel], t)

    def _send(self, got: np.ndarray, t: float) -> None:
        """Move the prefilled requests ``got``'s KV to their decode ranks (one transfer at a
        time per prefill rank, in order); wake the decode units."""
        req, rec = self.req, self.rec
        src = (req.p_unit[got] * self.Gp + req.p_rank[got]).tolist()
        xfer = (req.p_len[got] * self.kvb / self.xfer_bw).tolist()
        busy = self.xfer_busy
        dec = self.decode
        woken = set()
        kv_ready = rec.kv_ready_s
        rows = zip(got.tolist(), req.d_unit[got].tolist(), req.d_rank[got].tolist(), src, xfer,
                   strict=True)
        for i, v, r, s, d in rows:
            b = float(busy[s])
            ready = (t if t >= b else b) + d
            busy[s] = ready
            if kv_ready[i] != kv_ready[i]:  # NaN: the first attempt
                kv_ready[i] = ready
            dec[v].push(ready, i, r)
            woken.add(v)
        sim = self.sim
        for v in sorted(woken):
            unit = dec[v]
            if not unit.busy and not unit.dead:
                ready = unit.next_ready()
                if ready <= t:
                    unit.start(sim, t)
                elif ready < unit.wake_at:
                    unit.wake_at = ready
                    self.events.push(ready, D_WAKE, v)

    # ------------------------------------------------------------------ decode memory
    def admitted(self, unit, ranks: list[int], p_len: np.ndarray) -> None:
        """Requests joined ``unit``'s running batch on ``ranks``: their prompt KV now counts
        in the unit's context sums."""
        g = np.asarray(ranks, dtype=np.int64) + unit.index * self.Gd
        np.subtract.at(self.d_prompt, g, p_len.astype(np.float64))

    def _unreserve(self, g, kv) -> None:
        """Take reservations of ``kv`` tokens off decode ranks ``g`` (balancer view)."""
        state, bs = self.d_state, self.bs
        g = np.atleast_1d(np.asarray(g, dtype=np.int64))
        kv = np.atleast_1d(np.asarray(kv, dtype=np.float64))
        if g.size == 1:
            r, k = int(g[0]), float(kv[0])
            b = -(-k // bs)
            for arr, d in (
                (state.num_requests, 1.0),
                (state.running_tokens, k),
                (state.kv_blocks_used, b),
                (state.attention_cost, k),
                (self.d_res_blocks, b),
            ):
                arr[r] = max(arr[r] - d, 0.0)
            return
        lo = int(g.min())
        n = int(g.max()) - lo + 1
        gl = g - lo
        sl = slice(lo, lo + n)
        count = np.bincount(gl, minlength=n)
        toks = np.bincount(gl, kv, n)
        blocks = np.bincount(gl, -(-kv // bs), n)
        for arr, d in (
            (state.num_requests, count),
            (state.running_tokens, toks),
            (state.kv_blocks_used, blocks),
            (state.attention_cost, toks),
            (self.d_res_blocks, blocks),
        ):
            part = arr[sl]
            part -= d
            np.maximum(part, 0.0, out=part)

    def release(self, i: int) -> None:
        """Request ``i`` gives up its decode reservation (it is not running)."""
        req = self.req
        g = int(req.d_unit[i] * self.Gd + req.d_rank[i])
        if g < 0:
            return
        if req.d_phase[i] == 1:
            self.d_prompt[g] = max(self.d_prompt[g] - float(req.p_len[i]), 0.0)
        req.d_phase[i] = 0
        self._unreserve(g, float(req.d_kv[i]))
        self.d_version += 1

    def release_decode(self, unit, i: int, r: int) -> None:
        """Take request ``i``'s reservation off decode rank ``r`` of ``unit`` (balancer view;
        its KV had not arrived)."""
        self.release(i)

    def decode_finished(self, unit, idx: np.ndarray, r: np.ndarray) -> None:
        """The requests ``idx`` finished on ranks ``r`` of ``unit``: their reservations go."""
        self._unreserve(unit.index * self.Gd + r, self.req.d_kv[idx])
        self.d_version += 1
        self.d_freed += idx.size

    def kv_over(self, unit):
        """``float64[G]`` KV tokens ``unit``'s ranks hold beyond their capacity (running
        contexts + reserved prompts), or None when none is over; keeps the balancer's view at
        the larger of what is reserved and what is in use."""
        if not self.retracts:
            return None
        sl = slice(unit.index * self.Gd, (unit.index + 1) * self.Gd)
        used = self.d_prompt[sl] + unit.kv
        np.maximum(self.d_res_blocks[sl], used / self.bs, out=self.d_state.kv_blocks_used[sl])
        over = used - self.kv_cap[sl]
        return over if (over > 0).any() else None

    def retracted(self, unit, idx: list[int], t: float) -> None:
        """``unit`` retracted the running requests ``idx`` (newest first): their reservations
        go, they prefill again (prompt + tokens made so far) and count in ``retractions``."""
        req = self.req
        for i in idx:
            g = int(req.d_unit[i] * self.Gd + req.d_rank[i])
            self._unreserve(g, float(req.d_kv[i]))
            self.rec.retractions[i] += 1
        self.d_version += 1
        self.d_freed += len(idx)
        self.requeue_prefill(sorted(idx), t, retry=False)
        if self.before:
            self.route_reserve(t)
        else:
            self.route_prefill(t)
