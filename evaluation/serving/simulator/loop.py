"""`simulate`: a discrete-event simulation of a PD-disaggregated MoE serving cluster.

`Simulation` builds the cluster (prefill and decode units, the router, EPLB, faults, records)
and `Simulation.run` is the event loop: the one owner of the event queue, it pops events in
time order, hands each to the entity it concerns and pushes the events the handler returns
(docs/serving.md, "Simulator", lists the events and the system)."""

from __future__ import annotations

import heapq
import math

import numpy as np

from eplb.errors import InputError
from eplb.evaluation.serving import balancers
from eplb.evaluation.serving.config import DEFAULT_TOKEN_BUDGET, ClusterConfig, EplbMode, limits
from eplb.evaluation.serving.results.result import SimResult
from eplb.evaluation.serving.simulator.cluster import Cluster
from eplb.evaluation.serving.simulator.decode import DecodeUnit
from eplb.evaluation.serving.simulator.eplb_loop import EplbLoop
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
from eplb.evaluation.serving.simulator.recorder import Recorder
from eplb.evaluation.serving.simulator.records import Records
from eplb.evaluation.serving.simulator.requests import Requests
from eplb.evaluation.serving.simulator.router import Admission
from eplb.evaluation.serving.simulator.units import Unit
from eplb.evaluation.serving.steptime import StepModel
from eplb.evaluation.serving.workload.model import Workload

__all__ = ["DRAIN_MIN_S", "Simulation", "build_engines", "build_units", "check_args", "drain_cap",
           "simulate"]


DRAIN_MIN_S = 600.0  # the default drain cap is never shorter (s): long outputs finish


def drain_cap(duration_s: float | None, drain_s: float | None) -> float:
    """Seconds a run may go on after its arrivals stop, to finish what was admitted (the
    stated cap): ``drain_s`` when given; else, with ``duration_s``, as long again as the
    arrivals lasted and at least `DRAIN_MIN_S` (``max(duration_s, 600)``); without it, no
    cap (the workload is finite: every admitted request finishes)."""
    if drain_s is not None:
        return float(drain_s)
    return max(float(duration_s), DRAIN_MIN_S) if duration_s is not None else math.inf


def check_args(config, workload, seed, duration_s, bucket_s, drain_s=None):
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
    if drain_s is not None and (
        isinstance(drain_s, bool)
        or not isinstance(drain_s, (int, float))
        or not (0 <= drain_s <= limits.MAX_SIM_S)
    ):
        raise InputError(
            f"drain_s must be seconds in [0, {limits.MAX_SIM_S:g}] (or None: "
            f"max(duration_s, {DRAIN_MIN_S:g})), got {drain_s!r}"
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


def _engine(config: ClusterConfig, popularity: dict, seed: int, phase: str, u: int) -> dict:
    """Unit ``u`` of ``phase``'s engine: its step-time model, planner, expert-load draws (None
    under balanced routing) and load recorder (None when nothing rebalances from recorded
    load), as `Unit`'s arguments."""
    model, eplb = config.model_spec, config.eplb_for(phase)
    topo = config.topology(phase)
    uc = config.unit(phase)
    sm = StepModel(
        phase,
        topo,
        model=model,
        hardware=config.hardware_spec,
        dispatch=config.dispatch,
        micro_batches=uc.micro_batches,
        lp_overhead_s=config.lp_overhead_s,
        shared_expert=config.shared_expert,
        duplicate=config.duplicate,
    )
    planner = Planner(eplb, model, topo, seed=seed, unit_key=(0 if phase == "prefill" else 1, u),
                      phase=phase)
    loads = None if eplb.mode is EplbMode.BALANCED else StepLoads(popularity[phase], u, seed)
    rec = (
        Recorder(model.moe_layers, model.num_experts, min(10.0, eplb.history_s / 10),
                 max(eplb.history_s, 1.0))
        if eplb.mode.records_load
        else None
    )
    return {"index": u, "step_model": sm, "loads": loads, "planner": planner, "recorder": rec}


def build_engines(config: ClusterConfig, popularity: dict, seed: int) -> dict[str, list[Unit]]:
    """Every unit of ``config`` as a bare engine (`Unit`: placement, expert-load draws,
    recorder, step time), as a counterfactual replay steps them: the simulator's draws and
    seeds, unit by unit."""
    return {ph: [Unit(**_engine(config, popularity, seed, ph, u))
                 for u in range(config.unit(ph).count)] for ph in ("prefill", "decode")}


def build_units(config: ClusterConfig, popularity: dict, seed: int, requests: Requests,
                records: Records) -> dict[str, list]:
    """The prefill and decode units of ``config`` (`PrefillUnit`, `DecodeUnit`) serving
    ``requests`` into ``records``."""
    units: dict[str, list] = {"prefill": [], "decode": []}
    sch = config.scheduler
    for phase in ("prefill", "decode"):
        uc = config.unit(phase)
        for u in range(uc.count):
            parts = _engine(config, popularity, seed, phase, u)
            if phase == "prefill":
                unit = PrefillUnit(
                    **parts,
                    requests=requests,
                    records=records,
                    token_budget=uc.token_budget or DEFAULT_TOKEN_BUDGET,
                    chunking=sch.prefill_chunking,
                )
            else:
                unit = DecodeUnit(
                    **parts,
                    requests=requests,
                    records=records,
                    query_tokens=1 + uc.mtp_draft_tokens,
                    drafts=uc.mtp_draft_tokens,
                    acceptance=uc.mtp_acceptance,
                    sampling=sch.mtp_sampling,
                    seed=seed,
                    max_running=uc.max_running_requests,
                )
            units[phase].append(unit)
    return units


class Simulation:
    """One simulation run (see `simulate`): the requests (`Requests`), the units, the router
    (`Admission`), the handlers of the units' events (`Cluster`), EPLB (`EplbLoop`), faults
    (`Faults`), what it records (`Records`) and the event queue (`EventQueue`)."""

    def __init__(
        self,
        config: ClusterConfig,
        workload: Workload,
        seed: int,
        duration_s,
        progress: bool,
        bucket_s: float,
        drain_s: float | None = None,
    ):
        check_args(config, workload, seed, duration_s, bucket_s, drain_s)
        self.cfg = config
        self.seed = int(seed)
        self.progress = progress
        self.req = Requests(workload, duration_s, config)
        # arrivals stop at duration_s (or with the workload); the run then drains what was
        # admitted for at most `drain_cap` seconds (as a benchmark client waits for its
        # requests). Rebalances and faults happen while requests arrive.
        self.duration_s = None if duration_s is None else float(duration_s)
        self.arrivals_end = self.req.arrivals_end(self.duration_s)
        self.drain_cap = drain_cap(duration_s, drain_s)
        last = float(self.req.arrival[-1]) if self.req.n else 0.0
        horizon = self.duration_s if self.duration_s is not None else last
        self.end_time = horizon + self.drain_cap
        self.event_horizon = self.duration_s if self.duration_s is not None else math.inf
        self.records = Records(self.req.n, bucket_s)
        self.events = EventQueue()
        model = config.model_spec
        self.popularity = {
            ph: Popularity(config.routing, model, ph, self.seed) for ph in ("prefill", "decode")
        }
        units = self.units = build_units(config, self.popularity, self.seed, self.req,
                                         self.records)
        self.admission = Admission(config, self.seed, self.req, self.records,
                                   units["prefill"], units["decode"])
        self.cluster = Cluster(units["prefill"], units["decode"], self.admission)
        self.eplb = EplbLoop(units, self.popularity, self.records, self.admission,
                             self.cluster, self.event_horizon)
        self.faults = Faults(config.faults, units, self.admission, self.cluster,
                             self.records, self.popularity)
        self.now = 0.0
        self.events_handled = 0

    def run(self) -> SimResult:
        """The event loop: every event goes to the entity it concerns, and the events its
        handler returns go on the queue; requests that arrived by a prefill event are routed
        before it (`Cluster.flush`; with ``before_prefill`` their decode reservation is decided
        then too)."""
        adm, cluster, req, queue = self.admission, self.cluster, self.req, self.events
        eplb, faults = self.eplb, self.faults
        handlers = {  # event kind -> handler(arg, t) -> the events it schedules
            ARRIVE: cluster.on_arrive,
            P_END: cluster.on_prefill_end,
            D_END: cluster.on_decode_end,
            P_WAKE: cluster.on_prefill_wake,
            D_WAKE: cluster.on_decode_wake,
            REBAL: eplb.on_rebalance,
            LIVE: eplb.on_live,
            FAULT: faults.on_fault,
        }
        push = queue.push
        for ev in (*eplb.initial_placements(), *faults.schedule(self.event_horizon)):
            push(*ev)
        if math.isfinite(self.end_time):
            push(self.end_time, END)
        arrival = adm.arrival_event()
        if arrival is not None:
            push(*arrival)
        heap, pop, end_time = queue.heap, heapq.heappop, self.end_time
        routing_events, state = PREFILL_EVENTS, adm.state
        bar = _Progress(self) if self.progress else None
        try:
            while heap:
                t, _, kind, arg = pop(heap)
                if t > end_time:
                    break
                self.now = t
                self.events_handled += 1
                if kind in routing_events:
                    for ev in cluster.flush(t):
                        push(*ev)
                if kind == END:
                    break
                for ev in handlers[kind](arg, t):
                    push(*ev)
                arrival = adm.arrival_event()
                if arrival is not None:
                    push(*arrival)
                if req.done >= req.n and state.ptr >= req.n:
                    break
                if bar is not None:
                    bar.tick(t)
        finally:
            if bar is not None:
                bar.close(self.now)
        end = self.now if req.done >= req.n or not math.isfinite(self.end_time) else self.end_time
        return self.records.result(req, self.units["decode"], self.cfg, self.seed, end,
                                   self.events_handled, adm.state.store.stats(),
                                   arrivals_end=self.arrivals_end, duration_s=self.duration_s,
                                   drain_cap=self.drain_cap)


class _Progress:
    """A tqdm bar over simulated seconds, updated every 2,000 events."""

    def __init__(self, sim: Simulation):
        from tqdm.auto import tqdm  # lazy: tqdm only when progress is shown

        # the arrivals' span (a drain after it runs past the total)
        horizon = (sim.duration_s if sim.duration_s is not None
                   else float(sim.req.arrival[-1]) if sim.req.n else 0.0)
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
    drain_s: float | None = None,
):
    """Simulate ``workload`` on the cluster ``config``; a `SimResult`.

    ``seed``: every random draw (popularity, per-step expert counts, random balancers, solver
    seeds) comes from it. ``duration_s``: arrivals stop there (requests arriving later are not
    simulated); the run then drains what was admitted, as a benchmark client waits for its
    requests, for at most ``drain_s`` seconds (default `drain_cap`: as long again as
    ``duration_s``, at least 600 s; ``drain_s=0`` stops at ``duration_s``); requests still
    unfinished at the end keep NaN times and the summary reports them apart (censored).
    None runs until every request has finished (``drain_s`` then caps the time after the
    last arrival). Rebalances and faults happen while requests arrive. ``progress``: a tqdm
    bar over simulated seconds. ``bucket_s``: time resolution of the per-rank utilisation
    record (`SimResult.utilisation`). Under ``dispatch="duplicate"`` the copies' spare HBM
    comes out of the KV cache (`config.budget.with_duplicate_memory`).
    """
    from eplb.evaluation.serving.config.budget import with_duplicate_memory

    if isinstance(config, ClusterConfig):
        config = with_duplicate_memory(config)
    return Simulation(config, workload, seed, duration_s, progress, bucket_s, drain_s).run()
