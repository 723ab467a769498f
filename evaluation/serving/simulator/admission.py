"""Routing and admission: requests into the prefill queue and onto prefill ranks (the prefill
balancer, prefix-cache hits, store loads), and prefilled requests onto decode ranks (the decode
balancer reserves their KV; the KV moves from prefill to decode). The PD scheduler's room."""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from eplb.evaluation.serving import balancers
from eplb.evaluation.serving.balancers import RankState, RequestBatch
from eplb.evaluation.serving.config import DEFAULT_TOKEN_BUDGET, ClusterConfig
from eplb.evaluation.serving.kvcache import KVStore, RankCaches
from eplb.evaluation.serving.simulator.events import ARRIVE, D_WAKE

OFFER_CAP = 256  # waiting requests offered to a balancer at once (head of the queue)
_BALANCE_P, _BALANCE_D = 3, 4  # rng purposes (popularity = 1, step noise = 2: expert_loads)


class Admission:
    """The router's state over every rank of every unit.

    Queues: ``p_wait`` (requests no prefill rank took yet; retries at the head), ``d_wait``
    (prefilled requests waiting for a decode rank, FIFO); ``ptr`` the next arrival to route.
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
        it arrived: only prefill events change it)."""
        arrival = self.req.arrival
        if self.ptr >= self.req.n or arrival[self.ptr] > t:
            return
        stop = int(np.searchsorted(arrival, t, side="right"))
        fresh = range(self.ptr, stop)
        self.ptr = stop
        self.route_prefill(t, fresh)

    # ------------------------------------------------------------------ prefill routing
    def route_prefill(self, t: float, fresh=()) -> None:
        """Offer the head of the waiting queue (when something changed) and the ``fresh``
        arrivals to the prefill balancer; the placed ones join their rank's queue (their
        cached prefix loading from the store first), the rest wait in order."""
        req, rec = self.req, self.rec
        offer = []
        old = 0
        if self.p_wait and self.p_version != self.p_offered:
            old = min(len(self.p_wait), OFFER_CAP)
            offer = [self.p_wait[j] for j in range(old)]
            self.p_offered = self.p_version
        offer.extend(fresh)
        if not offer:
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
        cache_aware = self.p_state.caches is not None
        batch = RequestBatch(
            L,
            store_tok,
            np.maximum(req.out[idx] - req.gen[idx], 1),
            None,
            tuple(req.hashes[i] for i in offer) if cache_aware and req.hashes else None,
            idx,
        )
        pu = self.cfg.prefill
        ranks = balancers.assign(
            pu.balancer, batch, self.p_state, seed=self.p_rng, **pu.balancer_options
        )
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
            routed = arrival[i] if j >= old and fresh_l[j] else t
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
        # the waiting queue keeps its order: drop the routed among the offered old ones
        if old:
            keep = [self.p_wait.popleft() for _ in range(old)]
            for j in range(old - 1, -1, -1):
                if ranks[j] < 0:
                    self.p_wait.appendleft(keep[j])
        for j in range(old, len(offer)):
            if ranks[j] < 0:
                self.p_wait.append(offer[j])
        sim = self.sim
        for u in sorted(started):
            unit = self.prefill[u]
            if not unit.busy and not unit.dead:
                unit.start(sim, t)

    def requeue_prefill(self, idx: list[int], t: float) -> None:
        """Requests that must (re)run their prefill go back to the head of the router queue."""
        req = self.req
        for i in reversed(idx):
            req.retries[i] += 1
            req.p_len[i] = req.inp[i] + req.gen[i]  # prompt + tokens generated so far
            req.p_unit[i] = req.p_rank[i] = req.d_unit[i] = req.d_rank[i] = -1
            self.p_wait.appendleft(i)
        self.p_version += 1

    # ------------------------------------------------------------------ prefill -> decode
    def prefill_done(self, completed: list[int], t: float) -> None:
        """Prompts whose prefill finished at ``t``: the first token is out, their blocks enter
        the store and the rank's cache; they join the decode queue (or finish)."""
        req, rec, sim = self.req, self.rec, self.sim
        for i in completed:
            if math.isnan(rec.first_token_s[i]):
                rec.first_token_s[i] = t
            req.gen[i] += 1
            rec.prefills[i] += 1
            if req.hashes is not None:
                h = req.hashes[i]
                self.store.insert(h)
                if self.local is not None:
                    self.local.insert(int(req.p_unit[i] * self.Gp + req.p_rank[i]), h)
            if req.gen[i] >= req.out[i]:
                sim.finish(i, t)
            else:
                self.d_wait.append(i)
                self.d_new += 1
        self.route_decode(t, fresh=True)

    # ------------------------------------------------------------------ decode routing
    def route_decode(self, t: float, fresh: bool = False) -> None:
        """Offer the head of the decode queue (FIFO) to the decode balancer: as many requests
        as joined it plus twice as many as finished since the last offer (what can have room
        now), so a long queue costs nothing per step while nothing frees up. A placed
        request's KV moves to its decode rank (one transfer at a time per prefill rank)."""
        if not self.d_wait or (not fresh and self.d_version == self.d_offered):
            return
        req = self.req
        self.d_offered = self.d_version
        m = min(len(self.d_wait), OFFER_CAP * 4, self.d_new + 2 * self.d_freed + 8)
        self.d_new = self.d_freed = 0
        offer = [self.d_wait[j] for j in range(m)]
        idx = np.fromiter(offer, dtype=np.int64, count=m)
        batch = RequestBatch(
            req.p_len[idx],
            None,
            req.out[idx] - req.gen[idx],
            req.d_kv[idx],
            tuple(req.hashes[i] for i in offer)
            if self.d_state.caches is not None and req.hashes
            else None,
            idx,
        )
        du = self.cfg.decode
        ranks = balancers.assign(
            du.balancer, batch, self.d_state, seed=self.d_rng, **du.balancer_options
        )
        keep = [self.d_wait.popleft() for _ in range(m)]
        for j in range(m - 1, -1, -1):
            if ranks[j] < 0:
                self.d_wait.appendleft(keep[j])
        sel = ranks >= 0
        if not sel.any():
            return
        got, g = idx[sel], ranks[sel]
        v_arr, r_arr = np.divmod(g, self.Gd)
        req.d_unit[got], req.d_rank[got] = v_arr, r_arr
        src = (req.p_unit[got] * self.Gp + req.p_rank[got]).tolist()
        xfer = (req.p_len[got] * self.kvb / self.xfer_bw).tolist()
        busy = self.xfer_busy
        dec = self.decode
        woken = set()
        # one transfer at a time per prefill rank: in offer order
        rows = zip(got.tolist(), v_arr.tolist(), r_arr.tolist(), src, xfer, strict=True)
        for i, v, r, s, d in rows:
            b = float(busy[s])
            ready = (t if t >= b else b) + d
            busy[s] = ready
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

    def release_decode(self, unit, i: int, r: int) -> None:
        """Take request ``i``'s reservation off decode rank ``r`` of ``unit`` (balancer view)."""
        g = unit.index * self.Gd + r
        state, kv = self.d_state, float(self.req.d_kv[i])
        state.num_requests[g] -= 1
        state.running_tokens[g] -= kv
        state.kv_blocks_used[g] -= -(-kv // self.bs)
        state.attention_cost[g] -= kv
        for arr in (
            state.num_requests,
            state.running_tokens,
            state.kv_blocks_used,
            state.attention_cost,
        ):
            np.maximum(arr, 0.0, out=arr)
