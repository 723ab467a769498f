"""EPLB in the simulator's loop: each unit records the expert load it served (`Recorder`,
as SGLang's expert-distribution recorder sums each forward pass's counts), and every
``eplb.rebalance_interval_s`` its `Planner` places from the last ``eplb.history_s`` of it; the
weights move while serving (``overlap``) or stall the unit (``stall``). `EplbLoop` holds the
handlers: the initial placements, a rebalance, a stall, a placement going live."""

from __future__ import annotations

import math

import numpy as np

from eplb.errors import InputError
from eplb.evaluation.serving.simulator.events import LIVE, REBAL
from eplb.io import read_placement
from eplb.placement import Placement

__all__ = ["EplbLoop", "Recorder", "placement_file"]


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
                if unit.planner.rebalances:
                    sim.events.push(eplb.rebalance_interval_s, REBAL, (phase, unit.index))

    def on_rebalance(self, arg: tuple[str, int], t: float) -> None:
        """Unit ``arg = (phase, index)`` places again from its recorded load (the oracle: from
        the coming interval's expected load); the next rebalance is scheduled."""
        phase, u = arg
        sim, eplb = self.sim, self.cfg
        unit = sim.units[phase][u]
        sim.events.push(t + eplb.rebalance_interval_s, REBAL, (phase, u))
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
        sim.records.rebalances.append(
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
