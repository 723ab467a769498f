"""`simulate`: a discrete-event simulation of a PD-disaggregated MoE serving cluster.

The system (docs/serving.md, "Simulator"):

1. **API server**: requests arrive at their workload times; each prompt's prefix blocks are
   looked up in the external KV store (`KVStore`, prompt blocks of finished prefills).
2. **Prefill balancer** (`serving.balancers`, over every rank of every prefill unit) places
   each request on a prefill rank, or lets it wait (``-1``) until a rank has room. Cached tokens
   are the larger of the store's hit and the rank's GPU-local prefix cache hit
   (``kv.gpu_cache_blocks``); store hits are loaded at ``kv.store_load_gbps`` per node (shared
   by the node's GPUs, one load at a time per rank) before the prompt's first chunk runs.
3. **Prefill units** step (`units.PrefillUnit`): chunked prefill up to the token budget per
   rank; a step's time comes from the step-time model with the unit's live placement and the
   step's expert counts. A finished prompt produces the first token (TTFT), its blocks go into
   the store and the rank's local cache.
4. **Decode balancer** (over every decode rank) reserves the request's KV (prompt + output) on a
   rank within its KV capacity and running-request limit, else the request waits at the
   prefill side; the KV moves at ``kv.transfer_gbps`` (one transfer at a time per prefill rank).
5. **Decode units** (`units.DecodeUnit`) admit arrived requests at each step boundary
   (continuous batching) and emit tokens until each request has its output.
6. **EPLB** per unit (`eplb_loop`): the unit records the expert counts it served; every
   ``eplb.rebalance_interval_s`` its policy places from the last ``eplb.history_s`` and the
   weights move (stall or overlap).
7. **Faults**: `GpuFailure` (see `evaluation.serving.faults`).

**Events** (a heap, ties in insertion order): arrivals (only while some prefill unit is idle;
otherwise arrivals are routed in one batch before the next prefill event, which gives the
decisions routing at each arrival would, since nothing the router reads changes between prefill
events), prefill and decode step ends, wake-ups (store loads, KV transfers, migration stalls),
rebalances, migrations going live, faults and the end. **Determinism**: every random stream is
``np.random.default_rng([seed, purpose, ...])``: the popularity of each phase depends on the
seed only, each unit's per-step draws on the seed and the unit; runs of different configs with
the same seed (`serving.compare`) share arrivals (the workload), popularity and noise banks.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np

from eplb.errors import InputError
from eplb.evaluation.serving import balancers
from eplb.evaluation.serving.balancers import RankState, RequestBatch
from eplb.evaluation.serving.config import DEFAULT_TOKEN_BUDGET, ClusterConfig
from eplb.evaluation.serving.kvcache import KVStore, RankCaches
from eplb.evaluation.serving.simulator.eplb_loop import Planner, Recorder, emptied
from eplb.evaluation.serving.simulator.expert_loads import Popularity, StepLoads
from eplb.evaluation.serving.simulator.units import (
    DecodeUnit,
    PrefillUnit,
    cum,
    cum_many,
    first_reach_many,
)
from eplb.evaluation.serving.steptime import BREAKDOWN, StepModel
from eplb.evaluation.serving.workload.model import Workload

__all__ = ["simulate"]

# event kinds
_ARRIVE, _P_END, _D_END, _P_WAKE, _D_WAKE, _REBAL, _LIVE, _FAULT, _END = range(9)
_PREFILL_EVENTS = (_ARRIVE, _P_END, _P_WAKE, _FAULT, _END)
# rng purposes (popularity = 1 and step noise = 2 live in routing_source)
_BALANCE_P, _BALANCE_D = 3, 4
_OFFER_CAP = 256  # waiting requests offered to a balancer at once (head of the queue)
_COL_INPUT_DONE, _COL_OUTPUT = 8, 9  # positions in a recorded step (result.STEP_COLUMNS)


def check_args(config, workload, seed, duration_s, bucket_s):
    if not isinstance(config, ClusterConfig):
        raise InputError(f"config must be a ClusterConfig, got {type(config).__name__}")
    if not isinstance(workload, Workload):
        raise InputError(f"workload must be a Workload, got {type(workload).__name__}")
    if len(workload) == 0:
        raise InputError("the workload has no requests")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"seed must be a whole number >= 0, got {seed!r}")
    if duration_s is not None and (
        isinstance(duration_s, bool)
        or not isinstance(duration_s, (int, float))
        or not (duration_s > 0 and math.isfinite(duration_s))
    ):
        raise InputError(
            f"duration_s must be a number of seconds > 0 (or None), got {duration_s!r}"
        )
    if not (isinstance(bucket_s, (int, float)) and bucket_s > 0):
        raise InputError(f"bucket_s must be seconds > 0, got {bucket_s!r}")
    if workload.block_size != config.kv.block_size:
        raise InputError(
            f"the workload's block_size is {workload.block_size} tokens but kv.block_size is "
            f"{config.kv.block_size}; set kv.block_size = {workload.block_size} (block hashes "
            "are only comparable at the size they were made with)"
        )
    for phase in ("prefill", "decode"):
        name = config.unit(phase).balancer
        try:
            balancers.get(name)
        except InputError as exc:
            raise InputError(f"{phase}.balancer: {exc}") from None
        unknown = sorted(set(config.unit(phase).balancer_options) - set(balancers.options(name)))
        if unknown:
            raise InputError(
                f"{phase}.balancer_options: balancer {name} does not take {', '.join(unknown)}; "
                f"its options are {', '.join(balancers.options(name)) or 'none'}"
            )


class _Sim:
    """One simulation run (see `simulate`)."""

    def __init__(
        self,
        config: ClusterConfig,
        workload: Workload,
        seed: int,
        duration_s,
        progress: bool,
        bucket_s: float,
    ):
        check_args(config, workload, seed, duration_s, bucket_s)
        self.cfg = config
        self.seed = int(seed)
        self.progress = progress
        self.bucket_s = float(bucket_s)
        model, hw = config.model_spec, config.hardware_spec
        self.model = model
        df = workload.requests
        arr = df["arrival_s"].to_numpy(dtype=np.float64)
        if duration_s is not None:
            keep = int(np.searchsorted(arr, float(duration_s), side="left"))
            df = df.iloc[:keep]
            arr = arr[:keep]
        self.end_time = float(duration_s) if duration_s is not None else math.inf
        n = self.n = len(df)
        self.frame = df
        self.arrival = arr
        self.arrival_l = arr.tolist()
        self.inp = df["input_tokens"].to_numpy(dtype=np.int64)
        self.out = df["output_tokens"].to_numpy(dtype=np.int64)
        self.hashes = (
            [h.tolist() for h in df["block_hashes"]] if "block_hashes" in df.columns else None
        )
        self.bs = config.kv.block_size
        # per-request results and working state
        self.cached = np.zeros(n, dtype=np.int64)
        self.store_tokens = np.zeros(n, dtype=np.int64)
        self.routed_s = np.full(n, np.nan)
        self.first_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.p_unit = np.full(n, -1, dtype=np.int64)
        self.p_rank = np.full(n, -1, dtype=np.int64)
        self.d_unit = np.full(n, -1, dtype=np.int64)
        self.d_rank = np.full(n, -1, dtype=np.int64)
        self.retries = np.zeros(n, dtype=np.int64)
        self.gen = np.zeros(n, dtype=np.int64)  # output tokens produced so far
        self.prefills = np.zeros(n, dtype=np.int64)  # prefills completed (retries re-prefill)
        self.p_len = self.inp.copy()  # tokens the (latest) prefill covers
        self.p_blocks = np.zeros(n)  # KV blocks the request adds to its prefill rank's state
        self.d_kv = self.inp + self.out  # KV reserved on the decode rank
        self.decode_start_s = np.full(n, np.nan)  # its first decode step began (last attempt)
        self.d_k0 = np.zeros(n, dtype=np.int64)  # decode step the request joined at
        self.d_need = np.zeros(n, dtype=np.int64)  # tokens to emit in decode
        self.d_final = np.zeros(n)  # its context at the end (taken off the rank's kv sum)
        self.done = 0
        self._check_fits()
        # units
        self.kvb = model.kv_bytes_per_token * model.num_layers  # KV bytes per token, all layers
        pop = {ph: Popularity(config.routing, model, ph, self.seed) for ph in ("prefill", "decode")}
        self.popularity = pop
        eplb = config.eplb
        keep_s = max(eplb.history_s, 1.0)
        self.units: dict[str, list] = {"prefill": [], "decode": []}
        for phase in ("prefill", "decode"):
            uc = config.unit(phase)
            topo = config.topology(phase)
            for u in range(uc.count):
                sm = StepModel(
                    phase,
                    topo,
                    model=model,
                    hardware=hw,
                    dispatch=config.dispatch,
                    micro_batches=uc.micro_batches,
                )
                planner = Planner(
                    eplb, model, topo, seed=self.seed, unit_key=(0 if phase == "prefill" else 1, u)
                )
                balanced = eplb.solver == "balanced"
                loads = None if balanced else StepLoads(pop[phase], u, self.seed)
                rec = (
                    Recorder(
                        model.moe_layers, model.num_experts, min(10.0, eplb.history_s / 10), keep_s
                    )
                    if planner.rebalances and eplb.solver != "oracle"
                    else None
                )
                if phase == "prefill":
                    unit = PrefillUnit(
                        u,
                        sm,
                        loads,
                        planner,
                        rec,
                        token_budget=uc.token_budget or DEFAULT_TOKEN_BUDGET,
                    )
                else:
                    unit = DecodeUnit(
                        u,
                        sm,
                        loads,
                        planner,
                        rec,
                        query_tokens=1 + uc.mtp_draft_tokens,
                        extra_per_step=uc.mtp_draft_tokens * uc.mtp_acceptance,
                    )
                self.units[phase].append(unit)
        self.Gp = config.prefill.num_gpus
        self.Gd = config.decode.num_gpus
        # balancer views over every rank of every unit
        pu, du = config.prefill, config.decode
        caches = None
        if pu.balancer == "cache_aware":
            caches = RankCaches(pu.count * self.Gp, config.kv.gpu_cache_blocks or None, self.bs)
        self.p_state = RankState(
            pu.count * self.Gp,
            "prefill",
            token_budget=pu.token_budget or DEFAULT_TOKEN_BUDGET,
            block_size=self.bs,
            caches=caches,
        )
        kv_cap = math.inf if du.kv_capacity_tokens is None else du.kv_capacity_tokens // self.bs
        dcaches = None
        if du.balancer == "cache_aware":
            dcaches = RankCaches(du.count * self.Gd, None, self.bs)
        self.d_state = RankState(
            du.count * self.Gd,
            "decode",
            kv_blocks_capacity=kv_cap,
            max_requests=math.inf if du.max_running_requests is None else du.max_running_requests,
            block_size=self.bs,
            caches=dcaches,
        )
        self.p_rng = np.random.default_rng([self.seed, _BALANCE_P])
        self.d_rng = np.random.default_rng([self.seed, _BALANCE_D])
        # KV store, GPU-local caches, loaders
        self.store = KVStore(config.kv.store_capacity_blocks, self.bs)
        self.local = (
            RankCaches(pu.count * self.Gp, config.kv.gpu_cache_blocks, self.bs)
            if config.kv.gpu_cache_blocks
            else None
        )
        self.load_bw = config.kv.store_load_gbps * 1e9 / pu.gpus_per_node
        self.xfer_bw = config.kv.transfer_gbps * 1e9
        self.loader_busy = np.zeros(pu.count * self.Gp)
        self.xfer_busy = np.zeros(pu.count * self.Gp)
        # queues and events
        self.ptr = 0  # next arrival
        self.p_wait: deque[int] = deque()
        self.d_wait: deque[int] = deque()
        self.p_version = self.p_offered = 0
        self.d_version = self.d_offered = 0
        self.d_new = self.d_freed = 0  # joined the decode queue / finished since the last offer
        self.heap: list = []
        self._seq = 0
        self.arrive_at = math.inf
        self.now = 0.0
        # records
        self.step_rows: list[tuple] = []
        self.rebalance_rows: list[dict] = []
        self.fault_rows: list[dict] = []
        self.util: dict[str, dict[int, np.ndarray]] = {}
        self.events = 0

    # ------------------------------------------------------------------ helpers
    def _check_fits(self) -> None:
        du = self.cfg.decode
        if du.kv_capacity_tokens is not None:
            need = -(-self.d_kv // self.bs) * self.bs
            bad = np.flatnonzero(need > du.kv_capacity_tokens)
            if bad.size:
                i = int(bad[0])
                raise InputError(
                    f"request {self.frame['request_id'].iloc[i]} needs {int(self.d_kv[i]):,} KV "
                    f"tokens (prompt + output) but a decode rank holds "
                    f"decode.kv_capacity_tokens = {du.kv_capacity_tokens:,}; it could never be "
                    "served: raise the capacity or drop the request"
                )

    def _push(self, t: float, kind: int, arg=None) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (t, self._seq, kind, arg))

    def _finish_many(self, idx: np.ndarray, t: float) -> None:
        if not np.isnan(self.finish_s[idx]).all() or len(set(idx.tolist())) != idx.size:
            raise AssertionError("a request finished twice")  # pragma: no cover - a bug
        self.finish_s[idx] = t
        self.gen[idx] = self.out[idx]
        self.done += idx.size

    def _finish(self, i: int, t: float) -> None:
        if not math.isnan(self.finish_s[i]):  # pragma: no cover - a simulator bug
            raise AssertionError(f"request {i} finished twice")
        self.finish_s[i] = t
        self.gen[i] = self.out[i]
        self.done += 1

    # ------------------------------------------------------------------ arrivals, prefill routing
    def _maybe_arrival_event(self) -> None:
        """Arrivals are events only while some prefill unit could start at once."""
        if self.ptr >= self.n or self.arrive_at <= self.arrival[self.ptr]:
            return
        if any(not u.busy and not u.dead for u in self.units["prefill"]):
            self.arrive_at = float(self.arrival[self.ptr])
            self._push(self.arrive_at, _ARRIVE)

    def _flush(self, t: float) -> None:
        """Route every request that arrived by ``t`` (the router's state has not changed since
        it arrived: only prefill events change it)."""
        if self.ptr >= self.n or self.arrival[self.ptr] > t:
            return
        stop = int(np.searchsorted(self.arrival, t, side="right"))
        fresh = range(self.ptr, stop)
        self.ptr = stop
        self._route_prefill(t, fresh)

    def _route_prefill(self, t: float, fresh=()) -> None:
        offer = []
        old = 0
        if self.p_wait and self.p_version != self.p_offered:
            old = min(len(self.p_wait), _OFFER_CAP)
            offer = [self.p_wait[j] for j in range(old)]
            self.p_offered = self.p_version
        offer.extend(fresh)
        if not offer:
            return
        idx = np.fromiter(offer, dtype=np.int64, count=len(offer))
        L = self.p_len[idx]
        if self.hashes is not None:
            match = self.store.match
            hs = self.hashes
            store_blocks = np.array([match(hs[i], touch=False) for i in offer], dtype=np.int64)
        else:
            store_blocks = np.zeros(idx.size, dtype=np.int64)
        store_tok = np.minimum(store_blocks * self.bs, L - 1)
        cache_aware = self.p_state.caches is not None
        batch = RequestBatch(
            L,
            store_tok,
            np.maximum(self.out[idx] - self.gen[idx], 1),
            None,
            tuple(self.hashes[i] for i in offer) if cache_aware and self.hashes else None,
            idx,
        )
        pu = self.cfg.prefill
        ranks = balancers.assign(
            pu.balancer, batch, self.p_state, seed=self.p_rng, **pu.balancer_options
        )
        state = self.p_state
        started = set()
        ranks_l, store_l, L_l = ranks.tolist(), store_tok.tolist(), L.tolist()
        fresh_l = (self.retries[idx] == 0).tolist()
        arrival, hashes, local = self.arrival_l, self.hashes, self.local
        store_match = self.store.match
        Gp, bs, kvb, load_bw = self.Gp, self.bs, self.kvb, self.load_bw
        queues = [unit.queues for unit in self.units["prefill"]]
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
            self.cached[got] = cached
            self.store_tokens[got] = loaded
            self.routed_s[got] = routed_s
            self.p_unit[got] = units_
            self.p_rank[got] = ranks_
            self.p_blocks[got] = -(-L[sel] // bs)
        # the waiting queue keeps its order: drop the routed among the offered old ones
        if old:
            keep = [self.p_wait.popleft() for _ in range(old)]
            for j in range(old - 1, -1, -1):
                if ranks[j] < 0:
                    self.p_wait.appendleft(keep[j])
        for j in range(old, len(offer)):
            if ranks[j] < 0:
                self.p_wait.append(offer[j])
        for u in sorted(started):
            unit = self.units["prefill"][u]
            if not unit.busy and not unit.dead:
                self._start_prefill(unit, t)

    # ------------------------------------------------------------------ prefill
    def _start_prefill(self, unit: PrefillUnit, t: float) -> None:
        if unit.busy or unit.dead:
            return
        if unit.pending_stall is not None:
            self._stall(unit, t)
            return
        chunks, batch, min_ready = unit.build(t)
        if not chunks:
            if min_ready < unit.wake_at or unit.wake_at <= t:
                unit.wake_at = min_ready
                if min_ready < math.inf:
                    self._push(min_ready, _P_WAKE, unit.index)
            return
        tokens = float(np.add.reduce(batch.tokens))
        st = unit.step_time(batch, t, tokens)
        dur = st.total_s
        unit.busy = True
        unit.inflight = chunks
        unit.wake_at = math.inf
        done_in = 0
        state = self.p_state
        g0 = unit.index * self.Gp
        att = 0.0
        rows, new, pairs = [], [], []
        for r, e, n in chunks:
            # the chunk leaves its rank's queue (the balancer fills the next step) ...
            a = n * (e[3] + e[2]) + n * n / 2
            rows.append(g0 + r)
            new.append(n)
            pairs.append(a)
            att += a
            if n == e[1]:
                done_in += int(self.p_len[e[0]])
        np.subtract.at(state.queued_tokens, rows, new)  # (in order, as one at a time)
        np.subtract.at(state.attention_cost, rows, pairs)
        # ... and the step's work is charged evenly to the unit's ranks until it ends: they
        # all wait for it, so it tells units apart without unbalancing the next step
        sl = slice(g0, g0 + self.Gp)
        unit.charged = (tokens / self.Gp, att / self.Gp)
        state.running_tokens[sl] += unit.charged[0]
        state.attention_cost[sl] += unit.charged[1]
        np.maximum(state.queued_tokens, 0.0, out=state.queued_tokens)
        np.maximum(state.attention_cost, 0.0, out=state.attention_cost)
        self.p_version += 1
        self._record_step(unit, t, st, tokens, len(chunks), 0.0, float(done_in), 0.0)
        self._util(unit, t, dur, batch.tokens / unit.budget)
        self._push(t + dur, _P_END, unit.index)
        self._route_prefill(t)

    def _end_prefill(self, unit: PrefillUnit, t: float) -> None:
        unit.busy = False
        unit.k += 1
        state = self.p_state
        g0 = unit.index * self.Gp
        sl = slice(g0, g0 + self.Gp)
        state.running_tokens[sl] -= unit.charged[0]
        state.attention_cost[sl] -= unit.charged[1]
        unit.charged = (0.0, 0.0)
        completed = []
        for r, e, n in unit.inflight:
            g = g0 + r
            e[1] -= n
            e[2] += n
            if e[1] == 0:
                unit.queues[r].remove(e)
                i = e[0]
                completed.append(i)
                state.num_requests[g] -= 1
                state.kv_blocks_used[g] -= self.p_blocks[i]
        unit.inflight = []
        for arr in (
            state.kv_blocks_used,
            state.num_requests,
            state.running_tokens,
            state.attention_cost,
        ):
            np.maximum(arr, 0.0, out=arr)
        self.p_version += 1
        if completed:
            self._prefill_done(completed, t)
        self._route_prefill(t)
        self._start_prefill(unit, t)

    def _prefill_done(self, completed: list[int], t: float) -> None:
        for i in completed:
            if math.isnan(self.first_token_s[i]):
                self.first_token_s[i] = t
            self.gen[i] += 1
            self.prefills[i] += 1
            if self.hashes is not None:
                h = self.hashes[i]
                self.store.insert(h)
                if self.local is not None:
                    self.local.insert(int(self.p_unit[i] * self.Gp + self.p_rank[i]), h)
            if self.gen[i] >= self.out[i]:
                self._finish(i, t)
            else:
                self.d_wait.append(i)
                self.d_new += 1
        self._route_decode(t, fresh=True)

    # ------------------------------------------------------------------ decode routing
    def _route_decode(self, t: float, fresh: bool = False) -> None:
        """Offer the head of the decode queue (FIFO) to the decode balancer: as many requests
        as joined it plus twice as many as finished since the last offer (what can have room
        now), so a long queue costs nothing per step while nothing frees up."""
        if not self.d_wait or (not fresh and self.d_version == self.d_offered):
            return
        self.d_offered = self.d_version
        m = min(len(self.d_wait), _OFFER_CAP * 4, self.d_new + 2 * self.d_freed + 8)
        self.d_new = self.d_freed = 0
        offer = [self.d_wait[j] for j in range(m)]
        idx = np.fromiter(offer, dtype=np.int64, count=m)
        batch = RequestBatch(
            self.p_len[idx],
            None,
            self.out[idx] - self.gen[idx],
            self.d_kv[idx],
            tuple(self.hashes[i] for i in offer)
            if self.d_state.caches is not None and self.hashes
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
        self.d_unit[got], self.d_rank[got] = v_arr, r_arr
        src = (self.p_unit[got] * self.Gp + self.p_rank[got]).tolist()
        xfer = (self.p_len[got] * self.kvb / self.xfer_bw).tolist()
        busy = self.xfer_busy
        dec = self.units["decode"]
        woken = set()
        # one transfer at a time per prefill rank: in offer order
        rows = zip(got.tolist(), v_arr.tolist(), r_arr.tolist(), src, xfer, strict=True)
        for i, v, r, s, d in rows:
            b = float(busy[s])
            ready = (t if t >= b else b) + d
            busy[s] = ready
            dec[v].push(ready, i, r)
            woken.add(v)
        for v in sorted(woken):
            unit = self.units["decode"][v]
            if not unit.busy and not unit.dead:
                ready = unit.next_ready()
                if ready <= t:
                    self._start_decode(unit, t)
                elif ready < unit.wake_at:
                    unit.wake_at = ready
                    self._push(ready, _D_WAKE, v)

    # ------------------------------------------------------------------ decode
    def _admit(self, unit: DecodeUnit, t: float) -> None:
        """Requests whose KV has arrived join the running batch (their finishing step is
        known now: `first_reach`). Counts and contexts are whole numbers: exact sums."""
        pend = unit.pending
        if not pend or pend[0][0] > t:
            return
        got, ranks = [], []
        pop = heapq.heappop
        while pend and pend[0][0] <= t:
            _, _, i, r = pop(pend)
            got.append(i)
            ranks.append(r)
        k0, x = unit.k, unit.x
        base = cum(k0, x)
        idx = np.array(got, dtype=np.int64)
        need = self.out[idx] - self.gen[idx]
        jf = first_reach_many(need + base, x)  # steps k0..jf-1
        self.d_k0[idx] = k0
        self.d_need[idx] = need
        self.decode_start_s[idx] = t
        start_ctx = (self.p_len[idx] + 1).astype(np.float64)
        self.d_final[idx] = start_ctx + (cum_many(jf, x) - base)
        finish_at = unit.finish_at
        for i, kf in zip(got, (jf - 1).tolist(), strict=True):
            finish_at.setdefault(kf, []).append(i)
        G = unit.G
        unit.n += np.bincount(ranks, minlength=G)
        unit.kv += np.bincount(ranks, start_ctx, G)

    def _start_decode(self, unit: DecodeUnit, t: float) -> None:
        if unit.busy or unit.dead:
            return
        if unit.pending_stall is not None:
            self._stall(unit, t)
            return
        self._admit(unit, t)
        total = float(np.add.reduce(unit.n))
        if total <= 0:
            ready = unit.next_ready()
            if ready < math.inf and (ready < unit.wake_at or unit.wake_at <= t):
                unit.wake_at = ready
                self._push(ready, _D_WAKE, unit.index)
            return
        batch = unit.batch()
        tokens = total * unit.q
        st = unit.step_time(batch, t, tokens)
        dur = st.total_s
        k = unit.k
        e = unit.emitted(k)
        out_tokens = total * e
        fin = unit.finish_at.get(k)
        if fin:  # a request's last step may emit more than it needs (whole numbers: exact)
            idx = np.array(fin, dtype=np.int64)
            over = cum(k + 1, unit.x) - cum_many(self.d_k0[idx], unit.x) - self.d_need[idx]
            out_tokens -= int(over.sum())
        unit.busy = True
        unit.wake_at = math.inf
        kv_tokens = float(np.add.reduce(unit.kv))
        self._record_step(unit, t, st, tokens, total, kv_tokens, 0.0, out_tokens)
        cap = self.cfg.decode.max_running_requests or 1.0
        self._util(unit, t, dur, unit.n / cap)
        self._push(t + dur, _D_END, unit.index)

    def _end_decode(self, unit: DecodeUnit, t: float) -> None:
        unit.busy = False
        k = unit.k
        e = unit.emitted(k)
        unit.kv += unit.n * e
        fin = unit.finish_at.pop(k, None)
        unit.k = k + 1
        if fin:
            # their reservations leave the ranks (whole numbers: sums are exact in any order)
            state = self.d_state
            idx = np.array(fin, dtype=np.int64)
            r = self.d_rank[idx]
            G = unit.G
            unit.n -= np.bincount(r, minlength=G)
            unit.kv -= np.bincount(r, self.d_final[idx], G)
            sl = slice(unit.index * G, (unit.index + 1) * G)
            kv = self.d_kv[idx]
            state.num_requests[sl] -= np.bincount(r, minlength=G)
            kv_sum = np.bincount(r, kv.astype(np.float64), G)
            state.running_tokens[sl] -= kv_sum
            state.kv_blocks_used[sl] -= np.bincount(r, (-(-kv // self.bs)).astype(np.float64), G)
            state.attention_cost[sl] -= kv_sum
            self._finish_many(idx, t)
            self.d_version += 1
            self.d_freed += len(fin)
            self._route_decode(t)
        self._start_decode(unit, t)

    # ------------------------------------------------------------------ EPLB
    def _stall(self, unit, t: float) -> None:
        """Apply a stalling migration now: the unit runs no step until the copy is done."""
        plan = unit.pending_stall
        unit.pending_stall = None
        unit.busy = unit.stalled = True
        self._push(t + plan.copy_s, _LIVE, (unit.phase, unit.index, plan, True))

    def _rebalance(self, phase: str, u: int, t: float) -> None:
        unit = self.units[phase][u]
        eplb = self.cfg.eplb
        self._push(t + eplb.rebalance_interval_s, _REBAL, (phase, u))
        if unit.dead or unit.placement is None:
            return
        pop = self.popularity[phase]
        future = pop.mean(t, t + eplb.rebalance_interval_s)
        if eplb.solver == "oracle":
            load = future
        else:
            load = unit.recorder.load(t - eplb.history_s, t)
        plan = unit.planner.plan(unit.placement, load, future)
        if plan is None:
            return
        stall = eplb.migration == "stall"
        self.rebalance_rows.append(
            {
                "time_s": t,
                "phase": phase,
                "unit": u,
                "solver": eplb.solver,
                "replicas_moved": plan.replicas_moved,
                "bytes_moved": plan.bytes_moved,
                "max_gpu_bytes": plan.max_gpu_bytes,
                "copy_s": plan.copy_s,
                "stall_s": plan.copy_s if stall else 0.0,
                "solve_wall_s": plan.solve_wall_s,
                "expected_balance_before": plan.balance_before,
                "expected_balance_after": plan.balance_after,
            }
        )
        if stall:
            unit.pending_stall = plan
            if not unit.busy:
                self._stall(unit, t)
        else:
            self._push(t + plan.copy_s, _LIVE, (phase, u, plan, False))

    def _go_live(self, phase: str, u: int, plan, stalled: bool, t: float) -> None:
        unit = self.units[phase][u]
        if unit.dead:
            return
        if plan.placement.topology == unit.planner.topology:  # else solved before a failure
            unit.set_placement(plan.placement)
        if stalled:
            unit.busy = unit.stalled = False
            if phase == "prefill":
                self._route_prefill(t)
                self._start_prefill(unit, t)
            else:
                self._start_decode(unit, t)

    # ------------------------------------------------------------------ records
    def _record_step(self, unit, t, st, tokens, requests, kv_tokens, input_done, out_tokens):
        unit.row = len(self.step_rows)
        ratio = st.gpu_load_max / np.where(st.gpu_load_mean > 0, st.gpu_load_mean, 1.0)
        b = st.breakdown
        self.step_rows.append(
            (
                unit.phase,
                unit.index,
                unit.k,
                t,
                st.total_s,
                tokens,
                requests,
                kv_tokens,
                input_done,
                out_tokens,
                float(np.add.reduce(ratio) / ratio.size),  # (ratio.mean())
                unit.version,
                *(b[key] for key in BREAKDOWN),
            )
        )

    def _util(self, unit, t: float, dur: float, per_rank: np.ndarray) -> None:
        """Add ``per_rank`` load over ``[t, t + dur)`` to the utilisation buckets it spans."""
        buckets = self.util.setdefault(unit.name, {})
        bs = self.bucket_s
        key = int(t // bs)
        end = t + dur
        while True:
            lo, hi = max(t, key * bs), min(end, (key + 1) * bs)
            if hi > lo or dur == 0:
                arr = buckets.get(key)
                if arr is None:
                    arr = buckets[key] = np.zeros(per_rank.size)
                arr += per_rank * (hi - lo)
            if end <= (key + 1) * bs:
                break
            key += 1

    # ------------------------------------------------------------------ run
    def _initial_placements(self) -> None:
        eplb = self.cfg.eplb
        for phase in ("prefill", "decode"):
            pop = self.popularity[phase]
            for unit in self.units[phase]:
                unit.set_placement(
                    unit.planner.initial(
                        lambda pop=pop: pop.mean(-eplb.history_s, 0.0),
                        lambda pop=pop: pop.mean(0.0, eplb.rebalance_interval_s),
                    )
                )
                if unit.planner.rebalances:
                    self._push(eplb.rebalance_interval_s, _REBAL, (phase, unit.index))

    def run(self):
        from eplb.evaluation.serving.results.result import SimResult

        self._initial_placements()
        for j, fault in enumerate(self.cfg.faults):
            if fault.time_s < self.end_time:
                self._push(fault.time_s, _FAULT, j)
        if math.isfinite(self.end_time):
            self._push(self.end_time, _END)
        self._maybe_arrival_event()
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            horizon = self.end_time if math.isfinite(self.end_time) else float(self.arrival[-1])
            bar = tqdm(
                total=round(horizon),
                desc=f"simulate {self.cfg.name}",
                unit="sim s",
                dynamic_ncols=True,
            )
        shown = 0
        heap = self.heap
        pop = heapq.heappop
        try:
            while heap:
                t, _, kind, arg = pop(heap)
                if t > self.end_time:
                    break
                self.now = t
                self.events += 1
                if kind in _PREFILL_EVENTS:
                    self._flush(t)
                if kind == _D_END:
                    self._end_decode(self.units["decode"][arg], t)
                elif kind == _P_END:
                    self._end_prefill(self.units["prefill"][arg], t)
                elif kind == _ARRIVE:
                    self.arrive_at = math.inf
                elif kind == _P_WAKE:
                    unit = self.units["prefill"][arg]
                    if unit.wake_at == t:
                        unit.wake_at = math.inf
                        self._start_prefill(unit, t)
                elif kind == _D_WAKE:
                    unit = self.units["decode"][arg]
                    if unit.wake_at == t:
                        unit.wake_at = math.inf
                        self._start_decode(unit, t)
                elif kind == _REBAL:
                    self._rebalance(arg[0], arg[1], t)
                elif kind == _LIVE:
                    self._go_live(*arg, t)
                elif kind == _FAULT:
                    self._fault(self.cfg.faults[arg], t)
                elif kind == _END:
                    break
                self._maybe_arrival_event()
                if self.done >= self.n and self.ptr >= self.n:
                    break
                if bar is not None and self.events % 2000 == 0:
                    step = int(t) - shown
                    if step > 0:
                        bar.update(step)
                        shown += step
        finally:
            if bar is not None:
                bar.update(max(int(self.now) - shown, 0))
                bar.close()
        end = self.end_time if math.isfinite(self.end_time) else self.now
        return SimResult.from_sim(self, end)

    # ------------------------------------------------------------------ faults
    def _patch_row(self, row: int, column: int, delta: float) -> None:
        """Correct a recorded step (work a failure took away from its running step)."""
        rec = list(self.step_rows[row])
        rec[column] += delta
        self.step_rows[row] = tuple(rec)

    def _requeue_prefill(self, idx: list[int], t: float) -> None:
        """Requests that must (re)run their prefill go back to the head of the router queue."""
        for i in reversed(idx):
            self.retries[i] += 1
            self.p_len[i] = self.inp[i] + self.gen[i]  # prompt + tokens generated so far
            self.p_unit[i] = self.p_rank[i] = self.d_unit[i] = self.d_rank[i] = -1
            self.p_wait.appendleft(i)
        self.p_version += 1

    def _fault(self, fault, t: float) -> None:
        """GPU ``fault.gpu`` of unit ``fault.unit`` stops for good (module doc, step 7)."""
        phase, u = fault.unit
        g = fault.gpu
        unit = self.units[phase][u]
        row = {
            "time_s": t,
            "phase": phase,
            "unit": u,
            "gpu": g,
            "requests_requeued": 0,
            "orphaned_experts": 0,
            "emergency_replicas_moved": 0,
            "stall_s": 0.0,
        }
        if not unit.alive[g]:
            self.fault_rows.append(row)
            return
        unit.alive[g] = False
        requeued = (
            self._fail_prefill_rank(unit, g, t)
            if phase == "prefill"
            else (self._fail_decode_rank(unit, g, t))
        )
        row["requests_requeued"] = requeued
        self._emergency(unit, t, row)
        self.fault_rows.append(row)
        if not unit.alive.any():
            unit.dead = True
        self._route_prefill(t)
        self._route_decode(t, fresh=True)
        for pu in self.units["prefill"]:
            if not pu.busy and not pu.dead:
                self._start_prefill(pu, t)

    def _fail_prefill_rank(self, unit: PrefillUnit, g: int, t: float) -> int:
        gg = unit.index * self.Gp + g
        lost = [e[0] for e in unit.queues[g]]
        unit.queues[g] = []
        if unit.busy:  # the running step's chunks on g are lost with the GPU
            for r, e, n in unit.inflight:
                if r == g and n == e[1]:
                    self._patch_row(unit.row, _COL_INPUT_DONE, -float(self.p_len[e[0]]))
            unit.inflight = [c for c in unit.inflight if c[0] != g]
        self.p_state.fail(gg)
        if self.local is not None:
            self.local.clear(gg)
        # prefilled requests whose KV was still on g (waiting for decode room or in transfer)
        on_g = [i for i in self.d_wait if self.p_unit[i] * self.Gp + self.p_rank[i] == gg]
        if on_g:
            drop = set(on_g)
            self.d_wait = deque(i for i in self.d_wait if i not in drop)
        for du in self.units["decode"]:
            keep = []
            for item in du.pending:
                i = item[2]
                if item[0] > t and self.p_unit[i] * self.Gp + self.p_rank[i] == gg:
                    on_g.append(i)
                    self._release_decode(du, i, item[3])
                else:
                    keep.append(item)
            if len(keep) != len(du.pending):
                heapq.heapify(keep)
                du.pending = keep
        for i in on_g:  # their first token was out; the KV is gone: prefill again
            self.gen[i] = max(self.gen[i], 1)
        self._requeue_prefill(lost + on_g, t)
        return len(lost) + len(on_g)

    def _release_decode(self, unit: DecodeUnit, i: int, r: int) -> None:
        """Take a request's reservation off decode rank ``r`` of ``unit`` (balancer view)."""
        g = unit.index * self.Gd + r
        state, kv = self.d_state, float(self.d_kv[i])
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

    def _fail_decode_rank(self, unit: DecodeUnit, g: int, t: float) -> int:
        gg = unit.index * self.Gd + g
        x = unit.x
        done_steps = unit.k  # steps finished; a running step is lost for the failed rank
        lost, lost_tokens = [], 0
        for kf in list(unit.finish_at):
            reqs = unit.finish_at[kf]
            mine = [i for i in reqs if self.d_rank[i] == g]
            if not mine:
                continue
            unit.finish_at[kf] = [i for i in reqs if self.d_rank[i] != g]
            if not unit.finish_at[kf]:
                del unit.finish_at[kf]
            for i in mine:
                emitted = cum(done_steps, x) - cum(int(self.d_k0[i]), x)
                self.gen[i] += emitted
                lost.append(i)
                if unit.busy:  # what the running step would have emitted for it
                    step_out = cum(done_steps + 1, x) - cum(done_steps, x)
                    if kf == done_steps:
                        step_out -= (cum(done_steps + 1, x) - cum(int(self.d_k0[i]), x)) - int(
                            self.d_need[i]
                        )
                    lost_tokens += step_out
        if unit.busy and lost_tokens:
            self._patch_row(unit.row, _COL_OUTPUT, -float(lost_tokens))
        unit.n[g] = 0.0
        unit.kv[g] = 0.0
        # requests on their way to g go back to the decode queue (their KV is still on the
        # prefill side): a retry of the transfer
        back, keep = [], []
        for item in unit.pending:
            (back if item[3] == g else keep).append(item)
        if back:
            heapq.heapify(keep)
            unit.pending = keep
            for item in sorted(back):
                self.retries[item[2]] += 1
                self.d_unit[item[2]] = self.d_rank[item[2]] = -1
            self.d_wait.extendleft(item[2] for item in sorted(back, reverse=True))
            self.d_new += len(back)
        self.d_state.fail(gg)
        self.d_version += 1
        self._requeue_prefill(lost, t)
        return len(lost) + len(back)

    def _emergency(self, unit, t: float, row: dict) -> None:
        """The failed GPUs' slots empty at once (surviving replicas take their tokens); experts
        left without a replica force an emergency placement, and the unit stalls until it is
        copied in."""
        if unit.placement is None:  # balanced routing: spread over the GPUs left
            return
        failed = tuple(int(x) for x in np.flatnonzero(~unit.alive))
        topo = unit.placement.topology.with_failed(failed)
        unit.planner.topology = topo
        degraded = emptied(unit.placement, topo)
        orphans = int((degraded.logcnt == 0).sum())
        row["orphaned_experts"] = orphans
        if not orphans:
            unit.set_placement(degraded)
            return
        eplb = self.cfg.eplb
        load = unit.recorder.load(t - eplb.history_s, t) if unit.recorder is not None else None
        if load is None or not load.sum() > 0:
            load = self.popularity[unit.phase].mean(t - eplb.history_s, t)
        plan = unit.planner.emergency(degraded, load)
        row["emergency_replicas_moved"] = plan.replicas_moved
        row["stall_s"] = plan.copy_s
        unit.set_placement(degraded)  # (never stepped on: the unit stalls first)
        unit.pending_stall = plan
        if not unit.busy:
            self._stall(unit, t)


def simulate(
    config: ClusterConfig,
    workload: Workload,
    *,
    seed: int = 0,
    duration_s: float | None = None,
    progress: bool = True,
    bucket_s: float = 10.0,
):
    """Simulate ``workload`` on the cluster ``config``; a `SimResult`.

    ``seed``: every random draw (popularity, per-step expert counts, random balancers, solver
    seeds) comes from it. ``duration_s``: stop at that simulated time (requests arriving later
    are not simulated; unfinished ones keep NaN times); None runs until every request has
    finished. ``progress``: a tqdm bar over simulated seconds. ``bucket_s``: time resolution of
    the per-rank utilisation record (`SimResult.utilisation`).
    """
    return _Sim(config, workload, seed, duration_s, progress, bucket_s).run()
