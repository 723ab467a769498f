"""The router's state in one place, every field with its shape and meaning (`RouterState`),
and what it reads from the config once (`RouterSettings`). `Admission` is its only writer
(the modules beside it are its parts); units, faults and EPLB go through `Admission`."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from eplb.evaluation.serving.balancers import RankState
from eplb.evaluation.serving.config import DEFAULT_TOKEN_BUDGET, ClusterConfig, UnitConfig
from eplb.evaluation.serving.kvcache import KVStore, RankCaches

__all__ = ["RouterSettings", "RouterState"]

_BALANCE_P, _BALANCE_D = 3, 4  # rng purposes (popularity = 1, step noise = 2: expert_loads)


@dataclass(frozen=True)
class RouterSettings:
    """What the router reads from the config, fixed for a run (``R_p = prefill.count * Gp``
    prefill ranks, ``R_d = decode.count * Gd`` decode ranks, numbered unit by unit)."""

    prefill: UnitConfig
    """the prefill units (their ``balancer`` and ``balancer_options``)"""
    decode: UnitConfig
    """the decode units (their ``balancer`` and ``balancer_options``)"""
    Gp: int
    """ranks (GPUs) per prefill unit"""
    Gd: int
    """ranks (GPUs) per decode unit"""
    block_size: int
    """tokens per KV block (``kv.block_size``)"""
    kv_bytes: float
    """KV bytes per token, all layers"""
    load_bw: float
    """bytes/s a prefill rank loads from the store (its share of a node's store bandwidth)"""
    xfer_bw: float
    """bytes/s of one prefill rank's KV transfer to decode"""
    before: bool
    """``scheduler.decode_reservation == "before_prefill"``: decode KV reserved first"""
    policy: str
    """``scheduler.policy``: ``fcfs``, ``lpm`` or ``first_fit``"""
    rank_queues: bool
    """``scheduler.prefill_admission == "rank_queues"``: arrivals go at once to a prefill
    rank's unbounded queue (else ``global_queue``: they wait in ``p_wait`` until a rank has
    room within its ``token_budget``)"""
    reserve_out: int | None
    """``scheduler.reserved_decode_tokens``: output tokens reserved (None: the whole output)"""
    retracts: bool
    """a decode rank can run out of KV (a reservation smaller than the output, a capacity)"""

    @classmethod
    def of(cls, config: ClusterConfig) -> RouterSettings:
        model, pu, du, sch = config.model_spec, config.prefill, config.decode, config.scheduler
        return cls(
            prefill=pu,
            decode=du,
            Gp=pu.num_gpus,
            Gd=du.num_gpus,
            block_size=config.kv.block_size,
            kv_bytes=model.kv_bytes_per_token * model.num_layers,
            load_bw=config.kv.store_load_gbps * 1e9 / pu.gpus_per_node,
            xfer_bw=config.kv.transfer_gbps * 1e9,
            before=sch.decode_reservation == "before_prefill",
            policy=sch.policy,
            rank_queues=sch.prefill_admission == "rank_queues",
            reserve_out=sch.reserved_decode_tokens,
            retracts=sch.reserved_decode_tokens is not None
            and du.kv_capacity_tokens is not None,
        )


@dataclass(eq=False)
class RouterState:
    """The router's view of every rank of every unit and its queues (vLLM's ``EplbState`` is
    the model: one line per field). Shapes: ``R_p`` prefill ranks, ``R_d`` decode ranks,
    ``U_p`` prefill units (`RouterSettings`)."""

    settings: RouterSettings
    """what it reads from the config"""
    p_state: RankState
    """the prefill balancer's view over the ``R_p`` prefill ranks (loads are ``float64[R_p]``)"""
    d_state: RankState
    """the decode balancer's view over the ``R_d`` decode ranks (loads are ``float64[R_d]``)"""
    p_rng: np.random.Generator
    """the prefill balancer's draws"""
    d_rng: np.random.Generator
    """the decode balancer's draws"""
    store: KVStore
    """the external prefix KV store"""
    local: RankCaches | None
    """the prefill ranks' GPU-local prefix caches (None: ``kv.gpu_cache_blocks = 0``)"""
    loader_busy: np.ndarray
    """float64[R_p]: seconds until which a prefill rank's store load is in flight"""
    xfer_busy: np.ndarray
    """float64[R_p]: seconds until which a prefill rank's KV transfer to decode is in flight"""
    kv_cap: np.ndarray
    """float64[R_d]: KV tokens a decode rank holds (inf: no limit; `Admission.size_kv`)"""
    d_res_blocks: np.ndarray
    """float64[R_d]: KV blocks reserved on a decode rank"""
    d_prompt: np.ndarray
    """float64[R_d]: prompt tokens of the requests reserved on a decode rank, not running yet"""
    p_charged: list[tuple[float, float]]
    """[U_p]: tokens and attention a prefill unit's running step charges each of its ranks"""
    ptr: int = 0
    """the next arrival to route (requests ``[0, ptr)`` have been offered)"""
    arrive_at: float = math.inf
    """the time of the pending arrival event (inf: none pending)"""
    r_wait: deque[int] = field(default_factory=deque)
    """``before_prefill``: requests waiting for their decode reservation, in order"""
    p_wait: deque[int] = field(default_factory=deque)
    """requests no prefill rank took yet, in order (requeued ones at the head; under
    ``rank_queues`` only requeued ones, dispatched at the next routing)"""
    held: dict[int, tuple[int, list, float]] = field(default_factory=dict)
    """``rank_queues`` + ``before_prefill``: requests on a prefill rank still waiting for
    their decode reservation (skipped there, not blocking): request -> ``(unit, queue entry,
    the time its cached prefix is loaded)``"""
    unlooked: set[int] = field(default_factory=set)
    """``rank_queues``: requests on a prefill rank whose cached prefix is not looked up yet
    (their entry holds the store's estimate at dispatch; `prefill_routing.look_up`)"""
    cleared: set[int] = field(default_factory=set)
    """``rank_queues`` + ``before_prefill``: requests whose reservation is held (or that need
    none) but that no prefill rank took yet (requeued ones): they join a rank ready"""
    d_wait: deque[int] = field(default_factory=deque)
    """prefilled requests waiting for a decode rank, in order"""
    p_version: int = 0
    """changes of ``p_state`` (a waiting queue is offered again only after one)"""
    p_offered: int = 0
    """``p_version`` when ``p_wait``'s head was last offered"""
    d_version: int = 0
    """changes of ``d_state``"""
    d_offered: int = 0
    """``d_version`` when ``d_wait``'s head was last offered"""
    r_offered: int = -1
    """``d_version`` when ``r_wait``'s head was last offered"""
    d_new: int = 0
    """requests that joined ``d_wait`` since it was last offered"""
    d_freed: int = 0
    """requests that left a decode rank since ``d_wait`` was last offered"""

    @classmethod
    def of(cls, config: ClusterConfig, seed: int) -> RouterState:
        """The state at the start of a run: empty queues and loads, decode KV capacities from
        ``decode.kv_capacity_tokens`` (``inf`` without one)."""
        s = RouterSettings.of(config)
        pu, du, bs = s.prefill, s.decode, s.block_size
        Rp, Rd = pu.count * s.Gp, du.count * s.Gd
        caches = None
        if pu.balancer == "cache_aware":
            caches = RankCaches(Rp, config.kv.gpu_cache_blocks or None, bs)
        p_state = RankState(
            Rp,
            "prefill",
            # rank_queues: a rank's queue is unbounded (the budget is per step only)
            token_budget=math.inf if s.rank_queues else pu.token_budget or DEFAULT_TOKEN_BUDGET,
            block_size=bs,
            caches=caches,
        )
        cap = du.kv_capacity_tokens
        d_state = RankState(
            Rd,
            "decode",
            kv_blocks_capacity=math.inf if cap is None else cap // bs,
            max_requests=math.inf if du.max_running_requests is None else du.max_running_requests,
            block_size=bs,
            caches=RankCaches(Rd, None, bs) if du.balancer == "cache_aware" else None,
        )
        gpu_blocks = config.kv.gpu_cache_blocks
        return cls(
            settings=s,
            p_state=p_state,
            d_state=d_state,
            p_rng=np.random.default_rng([seed, _BALANCE_P]),
            d_rng=np.random.default_rng([seed, _BALANCE_D]),
            store=KVStore(config.kv.store_capacity_blocks, bs),
            local=RankCaches(Rp, gpu_blocks, bs) if gpu_blocks else None,
            loader_busy=np.zeros(Rp),
            xfer_busy=np.zeros(Rp),
            kv_cap=np.full(Rd, math.inf if cap is None else float(cap)),
            d_res_blocks=np.zeros(Rd),
            d_prompt=np.zeros(Rd),
            p_charged=[(0.0, 0.0)] * pu.count,
        )
