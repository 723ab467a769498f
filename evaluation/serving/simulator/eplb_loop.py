"""EPLB in the simulator's loop: each unit records the expert load it served (`Recorder`,
as SGLang's expert-distribution recorder sums each forward pass's counts), and every
``eplb.rebalance_interval_s`` its `Planner` places from the last ``eplb.history_s`` of it; the
weights move while serving (``overlap``) or stall the unit (``stall``); a rebalance predicted
to gain less than ``eplb.min_gain`` on that load is skipped, except the first after a failure
(which re-balances what the emergency patch left). `EplbLoop` holds the handlers: the initial
placements, a rebalance, a stall, a placement going live; `rebalance_row` is one row of the
``rebalances`` frame (``kind``: ``scheduled``, ``skipped`` or ``emergency``)."""

from __future__ import annotations

import math

import numpy as np

from eplb.errors import InputError
from eplb.evaluation.serving.simulator.events import LIVE, REBAL
from eplb.io import read_placement
from eplb.placement import Placement

__all__ = ["EplbLoop", "Recorder", "placement_file", "rebalance_row"]


def rebalance_row(t: float, phase: str, u: int, kind: str, solver: str, plan, stall: bool) -> dict:
    """The ``rebalances`` row of ``plan`` (a `planner.Plan`) at ``t``; ``stall``: the unit
    stops serving for the copy. A skipped plan moves nothing."""
    moved = kind != "skipped"
    return {
        "time_s": t,
        "phase": phase,
        "unit": u,
        "kind": kind,
        "solver": solver,
        "replicas_moved": plan.replicas_moved if moved else 0,
        "bytes_moved": plan.bytes_moved if moved else 0.0,
        "max_gpu_bytes": plan.max_gpu_bytes if moved else 0.0,
        "copy_s": plan.copy_s if moved else 0.0,
        "stall_s": plan.copy_s if moved and stall else 0.0,
        "solve_wall_s": plan.solve_wall_s,
        "expected_balance_before": plan.balance_before,
        "expected_balance_after": plan.balance_after,
        "predicted_gain": plan.predicted_gain,
    }


def placement_file(path: str, model, topology) -> Placement:
    """``eplb.initial = PATH``: the placement file as the simulator's ``[moe_layers, P]``
    placement on ``topology`` (rows in model-layer order; an SGLang map's dense-layer rows
    dropped). Raises `InputError` naming eplb.initial when it does not fit the unit."""
    p = read_placement(path, topology=topology, num_experts=model.num_experts)
    L = model.moe_layers
    if p.num_layers == model.num_layers and L < p.num_layers:  # SGLang: every model layer
        p = Placement(p.phy2log[model.dense_layers:], p.num_experts, p.topology,
                      p.replica_share, p.meta, p.layer_ids[model.dense_layers:])
    t, pt = topology, p.topology
    if p.num_layers != L or p.num_experts != model.num_experts or \
            (pt.num_nodes, pt.gpus_per_node, pt.slots_per_gpu) != \
            (t.num_nodes, t.gpus_per_node, t.slots_per_gpu):
        raise InputError(
            f"eplb.initial {path}: {p.num_layers} layers x {p.num_experts} experts on "
            f"{pt.num_nodes}x{pt.gpus_per_node}x{pt.slots_per_gpu}, but the unit has {L} MoE "
            f"layers x {model.num_experts} experts on {t.num_nodes}x{t.gpus_per_node}x"
            f"{t.slots_per_gpu}; solve for this unit (eplb solve --topology ...)"
        )
    order = np.argsort(p.layer_ids, kind="stable")
    share = None if p.replica_share is None else p.replica_share[order]
    return Placement(p.phy2log[order], p.num_experts, topology, share, p.meta).validate()


class Recorder:
    """Recorded expert load ``float64[L, E]`` per bucket of ``bucket_s`` seconds."""

    def __init__(self, num_layers: int, num_experts: int, bucket_s: float, keep_s: float):
        self.shape = (num_layers, num_experts)
        self.bucket_s = float(bucket_s)
        self.keep = max(int(math.ceil(keep_s / self.bucket_s)) + 2, 2)
        self._buckets: dict[int, np.ndarray] = {}
        self._cur_key: int | None = None
        self._cur: np.ndarray | None = None

    def add(self, t: float, counts: np.ndarray) -> None:
        """Record a step's ``counts: float[L, E]`` at time ``t`` (the step's start)."""
        key = math.floor(t / self.bucket_s)
        if key != self._cur_key:
            cur = self._buckets.get(key)
            if cur is None:
                cur = self._buckets[key] = np.zeros(self.shape)
                for old in [k for k in self._buckets if k < key - self.keep]:
                    del self._buckets[old]
            self._cur_key, self._cur = key, cur
        self._cur += counts

    def load(self, t0: float, t1: float) -> np.ndarray:
        """``float64[L, E]``: counts of the buckets starting in ``[t0, t1)``."""
        out = np.zeros(self.shape)
        lo, hi = t0 / self.bucket_s, t1 / self.bucket_s
        for key, arr in self._buckets.items():
            if lo <= key < hi:
                out += arr
        return out


class EplbLoop:
    """The EPLB handlers of a run (``sim``: the `Simulation`)."""

    def __init__(self, sim):
        self.sim = sim
        self.cfg = sim.cfg.eplb

    def initial_placements(self) -> None:
        """Every unit's placement at the start, and its first rebalance event."""
        eplb, sim = self.cfg, self.sim
        from_file = eplb.initial not in ("trivial", "history") and \
            eplb.solver not in ("balanced", "oracle")
        for phase in ("prefill", "decode"):
            pop = sim.popularity[phase]
            for unit in sim.units[phase]:
                pl = unit.planner
                unit.set_placement(
                    placement_file(eplb.initial, pl.model, pl.topology) if from_file else
                    pl.initial(
                        lambda pop=pop: pop.mean(-eplb.history_s, 0.0),
                        lambda pop=pop: pop.mean(0.0, eplb.rebalance_interval_s),
                    )
                )
                cap = pl.reserve(unit.placement)  # empty slots: weight memory freed for KV
                if phase == "decode" and cap is not None:
                    sim.admission.size_kv(unit.index, cap)
                self.schedule(eplb.rebalance_interval_s, phase, unit)

    def schedule(self, t: float, phase: str, unit) -> None:
        """The unit's next rebalance at ``t``, if it rebalances and ``t`` is before the end
        (a rebalance at the end could change nothing the run measures)."""
        if unit.planner.rebalances and t < self.sim.end_time:
            self.sim.events.push(t, REBAL, (phase, unit.index))

    def on_rebalance(self, arg: tuple[str, int], t: float) -> None:
        """Unit ``arg = (phase, index)`` places again from its recorded load (the oracle: from
        the coming interval's expected load); the next rebalance is scheduled."""
        phase, u = arg
        sim, eplb = self.sim, self.cfg
        unit = sim.units[phase][u]
        self.schedule(t + eplb.rebalance_interval_s, phase, unit)
        if unit.dead or unit.placement is None:
            return
        pop = sim.popularity[phase]
        future = pop.mean(t, t + eplb.rebalance_interval_s)
        if eplb.solver == "oracle":
            load = future
        else:
            load = unit.recorder.load(t - eplb.history_s, t)
        plan = unit.planner.plan(unit.placement, load, future)
        if plan is None:
            return
        stall = eplb.migration == "stall"
        forced = unit.rebalance_due  # the first after a failure: the full re-balance
        skip = not forced and plan.predicted_gain < eplb.min_gain
        kind = "skipped" if skip else "scheduled"
        sim.records.rebalances.append(rebalance_row(t, phase, u, kind, eplb.solver, plan, stall))
        if skip:
            return
        unit.rebalance_due = False
        if stall:
            unit.pending_stall = plan
            if not unit.busy:
                self.stall(unit, t)
        else:
            sim.events.push(t + plan.copy_s, LIVE, (phase, u, plan, False))

    def stall(self, unit, t: float) -> None:
        """Apply a stalling migration now: the unit runs no step until the copy is done."""
        plan = unit.pending_stall
        unit.pending_stall = None
        unit.busy = unit.stalled = True
        self.sim.events.push(t + plan.copy_s, LIVE, (unit.phase, unit.index, plan, True))

    def on_live(self, arg: tuple, t: float) -> None:
        """A copied placement goes live (``arg = (phase, index, plan, stalled)``); a stalled
        unit resumes."""
        phase, u, plan, stalled = arg
        sim = self.sim
        unit = sim.units[phase][u]
        if unit.dead:
            return
        if plan.placement.topology == unit.planner.topology:  # else solved before a failure
            unit.set_placement(plan.placement)
        if stalled:
            unit.busy = unit.stalled = False
            if phase == "prefill":
                sim.admission.route_prefill(t)
            unit.start(sim, t)
