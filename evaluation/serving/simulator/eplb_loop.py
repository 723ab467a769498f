"""EPLB in the simulator's loop: each unit records the expert load it served
(`recorder.Recorder`, as SGLang's expert-distribution recorder sums each forward pass's counts),
and every ``eplb.rebalance_interval_s`` its `Planner` places from the last ``eplb.history_s`` of
it, each setting its phase's (``[prefill.eplb]`` / ``[decode.eplb]`` over ``[eplb]``: the
planner's `EplbConfig`, `ClusterConfig.eplb_for`); the weights move while serving
(``overlap``) or stall the unit (``stall``); a rebalance predicted to gain less than
``eplb.min_gain`` on that load is skipped, except the first after a failure (which re-balances
what the emergency patch left). `EplbLoop` holds the handlers: the initial placements, a
rebalance, a placement going live; `rebalance_row` is one row of the ``rebalances`` frame
(``kind``: ``scheduled``, ``skipped`` or ``emergency``; ``phase`` and its ``solver``)."""

from __future__ import annotations

from eplb.evaluation.serving.config import EplbMode
from eplb.evaluation.serving.simulator.cluster import Cluster
from eplb.evaluation.serving.simulator.events import LIVE, REBAL, Event
from eplb.evaluation.serving.simulator.expert_loads import Popularity
from eplb.evaluation.serving.simulator.records import Records
from eplb.evaluation.serving.simulator.router import Admission
from eplb.evaluation.serving.simulator.units import Unit

__all__ = ["EplbLoop", "rebalance_row"]


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


class EplbLoop:
    """The EPLB handlers of a run over the ``units`` (per phase), each placing by its planner's
    `EplbConfig` (its phase's), with each phase's expected load ``popularity``; rebalances go
    to ``records``; the router sizes decode KV from the initial placements, ``cluster``
    resumes a stalled unit. Handlers return the events they schedule; none is scheduled at or
    after ``end_time``."""

    def __init__(self, units: dict[str, list[Unit]],
                 popularity: dict[str, Popularity], records: Records, router: Admission,
                 cluster: Cluster, end_time: float):
        self.units, self.popularity, self.records = units, popularity, records
        self.router, self.cluster, self.end_time = router, cluster, end_time

    def initial_placements(self) -> list[Event]:
        """Every unit's placement at the start (`Planner.initial`), and its first rebalance
        event."""
        out = []
        for phase in ("prefill", "decode"):
            pop = self.popularity[phase]
            for unit in self.units[phase]:
                pl = unit.planner
                eplb = pl.config
                unit.set_placement(
                    pl.initial(
                        lambda pop=pop, h=eplb.history_s: pop.mean(-h, 0.0),
                        lambda pop=pop, i=eplb.rebalance_interval_s: pop.mean(0.0, i),
                    )
                )
                cap = pl.reserve(unit.placement)  # empty slots: weight memory freed for KV
                if phase == "decode" and cap is not None:
                    self.router.size_kv(unit.index, cap)
                self._schedule(eplb.rebalance_interval_s, unit, out)
        return out

    def _schedule(self, t: float, unit: Unit, out: list[Event]) -> None:
        """The unit's next rebalance at ``t``, if it rebalances and ``t`` is before the end
        (a rebalance at the end could change nothing the run measures)."""
        if unit.planner.rebalances and t < self.end_time:
            out.append((t, REBAL, (unit.phase, unit.index)))

    def on_rebalance(self, arg: tuple[str, int], t: float) -> list[Event]:
        """Unit ``arg = (phase, index)`` places again from its recorded load (the oracle: from
        the coming interval's expected load); the next rebalance is scheduled."""
        phase, u = arg
        out: list[Event] = []
        unit = self.units[phase][u]
        eplb = unit.planner.config
        self._schedule(t + eplb.rebalance_interval_s, unit, out)
        if unit.dead or unit.placement is None:
            return out
        pop = self.popularity[phase]
        future = pop.mean(t, t + eplb.rebalance_interval_s)
        if eplb.mode is EplbMode.ORACLE:
            load = future
        else:
            load = unit.recorder.load(t - eplb.history_s, t)
        plan = unit.planner.plan(unit.placement, load, future)
        if plan is None:
            return out
        stall = eplb.migration == "stall"
        forced = unit.rebalance_due  # the first after a failure: the full re-balance
        skip = not forced and plan.predicted_gain < eplb.min_gain
        kind = "skipped" if skip else "scheduled"
        self.records.rebalances.append(rebalance_row(t, phase, u, kind, eplb.solver, plan, stall))
        if skip:
            return out
        unit.rebalance_due = False
        if stall:
            unit.pending_stall = plan
            if not unit.busy:
                out.append(unit.stall(t))
        else:
            out.append((t + plan.copy_s, LIVE, (phase, u, plan, False)))
        return out

    def on_live(self, arg: tuple, t: float) -> list[Event]:
        """A copied placement goes live (``arg = (phase, index, plan, stalled)``); a stalled
        unit resumes."""
        phase, u, plan, stalled = arg
        unit = self.units[phase][u]
        if unit.dead:
            return []
        if plan.placement.topology == unit.planner.topology:  # else solved before a failure
            unit.set_placement(plan.placement)
        if not stalled:
            return []
        unit.busy = unit.stalled = False
        return self.cluster.resume(unit, t)
