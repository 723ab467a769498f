"""`simulate`: a discrete-event simulation of a PD-disaggregated MoE serving cluster.

`Simulation` builds the cluster (prefill and decode units, the router, EPLB, faults, records)
and `Simulation.run` is the event loop: it pops events in time order and hands each to the
entity it concerns (docs/serving.md, "Simulator", lists the events and the system)."""

from __future__ import annotations

import heapq
import math

import numpy as np

from eplb.errors import InputError
from eplb.evaluation.serving import balancers
from eplb.evaluation.serving.config import DEFAULT_TOKEN_BUDGET, ClusterConfig, limits
from eplb.evaluation.serving.results.result import SimResult
from eplb.evaluation.serving.simulator.admission import Admission
from eplb.evaluation.serving.simulator.decode import DecodeUnit
from eplb.evaluation.serving.simulator.eplb_loop import EplbLoop, Recorder
from eplb.evaluation.serving.simulator.events import (
    ARRIVE,
    D_END,
    D_WAKE,
    END,
    FAULT,
    LIVE,
    P_END,
    P_WAKE,
    PREFILL_EVENTS,
    REBAL,
    EventQueue,
)
from eplb.evaluation.serving.simulator.expert_loads import Popularity, StepLoads
from eplb.evaluation.serving.simulator.faults import Faults
from eplb.evaluation.serving.simulator.planner import Planner
from eplb.evaluation.serving.simulator.prefill import PrefillUnit
from eplb.evaluation.serving.simulator.records import Records
from eplb.evaluation.serving.simulator.requests import Requests
from eplb.evaluation.serving.steptime import StepModel
from eplb.evaluation.serving.workload.model import Workload

__all__ = ["Simulation", "check_args", "simulate"]


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
    if isinstance(bucket_s, bool) or not (isinstance(bucket_s, (int, float)) and bucket_s > 0
                                          and math.isfinite(bucket_s)):
        raise InputError(f"bucket_s must be a finite number of seconds > 0, got {bucket_s!r}")
    if workload.block_size != config.kv.block_size:
        raise InputError(
            f"the workload's block_size is {workload.block_size} tokens but kv.block_size is "
            f"{config.kv.block_size}; set kv.block_size = {workload.block_size} (block hashes "
            "are only comparable at the size they were made with)"
        )
    limits.check_work(config, workload, duration_s, bucket_s)  # bounded work, before starting
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


def build_units(config: ClusterConfig, popularity: dict, seed: int) -> dict[str, list]:
    """The prefill and decode units of ``config``, each with its step-time model, planner,
    expert-load draws (None under balanced routing) and load recorder (None when nothing
    rebalances from recorded load)."""
    model, hw, eplb = config.model_spec, config.hardware_spec, config.eplb
    keep_s = max(eplb.history_s, 1.0)
    units: dict[str, list] = {"prefill": [], "decode": []}
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
                lp_overhead_s=config.lp_overhead_s,
                shared_expert=config.shared_expert,
                duplicate=config.duplicate,
            )
            planner = Planner(
                eplb, model, topo, seed=seed, unit_key=(0 if phase == "prefill" else 1, u)
            )
            balanced = eplb.solver == "balanced"
            loads = None if balanced else StepLoads(popularity[phase], u, seed)
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
                    chunking=config.scheduler.prefill_chunking,
                )
            else:
                unit = DecodeUnit(
                    u,
                    sm,
                    loads,
                    planner,
                    rec,
                    query_tokens=1 + uc.mtp_draft_tokens,
                    drafts=uc.mtp_draft_tokens,
                    acceptance=uc.mtp_acceptance,
                    sampling=config.scheduler.mtp_sampling,
                    seed=seed,
                    max_running=uc.max_running_requests,
                )
            units[phase].append(unit)
    return units


class Simulation:
    """One simulation run (see `simulate`): the requests (`Requests`), the units, the router
    (`Admission`), EPLB (`EplbLoop`), faults (`Faults`), what it records (`Records`) and the
    event queue (`EventQueue`)."""

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
        self.end_time = float(duration_s) if duration_s is not None else math.inf
        self.req = Requests(workload, duration_s, config)
        self.records = Records(self.req.n, bucket_s)
        self.events = EventQueue()
        model = config.model_spec
        self.popularity = {
            ph: Popularity(config.routing, model, ph, self.seed) for ph in ("prefill", "decode")
        }
        self.units = build_units(config, self.popularity, self.seed)
        self.admission = Admission(self, config, self.seed)
        self.eplb = EplbLoop(self)
        self.faults = Faults(self)
        self.now = 0.0
        self.events_handled = 0

    def finish(self, i: int, t: float) -> None:
        """Request ``i`` emitted its last token at ``t``."""
        self.records.finished(i, t)
        self.req.finish(i)

    def finish_many(self, idx: np.ndarray, t: float) -> None:
        """The requests ``idx: int64[m]`` emitted their last tokens at ``t``."""
        self.records.finished_many(idx, t)
        self.req.finish_many(idx)

    def run(self) -> SimResult:
        """The event loop: every event goes to the entity it concerns; requests that arrived
        by a prefill event are routed before it (`Admission.flush`; with ``before_prefill``
        their decode reservation is decided then too)."""
        adm, req, queue = self.admission, self.req, self.events
        prefill, decode = self.units["prefill"], self.units["decode"]
        handlers = {  # event kind -> handler(arg, t) of the entity it changes
            ARRIVE: adm.on_arrive,
            P_END: lambda u, t: prefill[u].end(self, t),
            D_END: lambda u, t: decode[u].end(self, t),
            P_WAKE: lambda u, t: prefill[u].wake(self, t),
            D_WAKE: lambda u, t: decode[u].wake(self, t),
            REBAL: self.eplb.on_rebalance,
            LIVE: self.eplb.on_live,
            FAULT: self.faults.on_fault,
        }
        self.eplb.initial_placements()
        self.faults.schedule()
        if math.isfinite(self.end_time):
            queue.push(self.end_time, END)
        adm.maybe_arrival_event()
        heap, pop, end_time = queue.heap, heapq.heappop, self.end_time
        routing_events = PREFILL_EVENTS
        bar = _Progress(self) if self.progress else None
        try:
            while heap:
                t, _, kind, arg = pop(heap)
                if t > end_time:
                    break
                self.now = t
                self.events_handled += 1
                if kind in routing_events:
                    adm.flush(t)
                if kind == END:
                    break
                handlers[kind](arg, t)
                adm.maybe_arrival_event()
                if req.done >= req.n and adm.ptr >= req.n:
                    break
                if bar is not None:
                    bar.tick(t)
        finally:
            if bar is not None:
                bar.close(self.now)
        end = self.end_time if math.isfinite(self.end_time) else self.now
        return self.records.result(self, end)


class _Progress:
    """A tqdm bar over simulated seconds, updated every 2,000 events."""

    def __init__(self, sim: Simulation):
        from tqdm.auto import tqdm  # lazy: tqdm only when progress is shown

        horizon = sim.end_time if math.isfinite(sim.end_time) else float(sim.req.arrival[-1])
        self.sim = sim
        self.bar = tqdm(
            total=round(horizon), desc=f"simulate {sim.cfg.name}", unit="sim s", dynamic_ncols=True
        )
        self.shown = 0

    def tick(self, t: float) -> None:
        if self.sim.events_handled % 2000 == 0:
            step = int(t) - self.shown
            if step > 0:
                self.bar.update(step)
                self.shown += step

    def close(self, now: float) -> None:
        self.bar.update(max(int(now) - self.shown, 0))
        self.bar.close()


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
    the per-rank utilisation record (`SimResult.utilisation`). Under ``dispatch="duplicate"``
    the copies' spare HBM comes out of the KV cache (`config.budget.with_duplicate_memory`).
    """
    from eplb.evaluation.serving.config.budget import with_duplicate_memory

    if isinstance(config, ClusterConfig):
        config = with_duplicate_memory(config)
    return Simulation(config, workload, seed, duration_s, progress, bucket_s).run()
