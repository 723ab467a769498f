"""GPU failures in the loop: the failed GPU's work is lost (its queued and running requests
prefill again or retry their KV transfer), its slots empty, and experts left without a replica
force an emergency placement (by default a patch that re-homes only them) that stalls the unit
until it is copied in; the next scheduled rebalance re-balances fully (docs/serving.md,
"Simulator", item 8). The fault objects themselves are `config.faults.GpuFailure`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from eplb.evaluation.serving.config import GpuFailure
from eplb.evaluation.serving.simulator.cluster import Cluster
from eplb.evaluation.serving.simulator.eplb_loop import rebalance_row
from eplb.evaluation.serving.simulator.events import FAULT, Event
from eplb.evaluation.serving.simulator.expert_loads import Popularity
from eplb.evaluation.serving.simulator.planner import emptied
from eplb.evaluation.serving.simulator.records import Records
from eplb.evaluation.serving.simulator.router import Admission
from eplb.evaluation.serving.simulator.units import Unit

__all__ = ["Faults"]


class Faults:
    """The fault handlers of a run: the configured ``faults`` on the ``units`` (per phase);
    the router takes the lost requests back, ``cluster`` re-routes after a failure, each
    unit's planner (its phase's `EplbConfig`) and ``popularity`` serve the emergency
    placement; ``records`` takes the ``faults`` and
    emergency ``rebalances`` rows. Handlers return the events they schedule."""

    def __init__(self, faults: Sequence[GpuFailure],
                 units: dict[str, list[Unit]], router: Admission, cluster: Cluster,
                 records: Records, popularity: dict[str, Popularity]):
        self.faults, self.units = faults, units
        self.router, self.cluster = router, cluster
        self.records, self.popularity = records, popularity

    def schedule(self, end_time: float) -> list[Event]:
        """A fault event for every configured fault before ``end_time``."""
        return [(f.time_s, FAULT, j) for j, f in enumerate(self.faults) if f.time_s < end_time]

    def on_fault(self, j: int, t: float) -> list[Event]:
        """Fault ``j`` of the config: GPU ``fault.gpu`` of unit ``fault.unit`` stops for good."""
        fault = self.faults[j]
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
            self.records.faults.append(row)
            return []
        unit.alive[g] = False
        if phase == "prefill":
            requeued = self.router.prefill_rank_lost(unit, g, unit.lose_rank(g), t)
        else:
            requeued = self.router.decode_rank_lost(unit, g, *unit.lose_rank(g), t)
        row["requests_requeued"] = requeued
        out = self.emergency(unit, t, row)
        self.records.faults.append(row)
        if not unit.alive.any():
            unit.dead = True
        return out + self.cluster.after_fault(t)

    def emergency(self, unit: Unit, t: float, row: dict) -> list[Event]:
        """The failed GPUs' slots empty at once (surviving replicas take their tokens); experts
        left without a replica (``row["orphaned_experts"]``, in (layer, expert) pairs) force an
        emergency placement (a ``rebalances`` row of kind ``emergency``), and the unit stalls
        until it is copied in (the stall's event, returned). After a ``patch`` (or a failure
        that orphaned nothing) the next scheduled rebalance is never skipped."""
        if unit.placement is None:  # balanced routing: spread over the GPUs left
            return []
        failed = tuple(int(x) for x in np.flatnonzero(~unit.alive))
        topo = unit.placement.topology.with_failed(failed)
        unit.planner.topology = topo
        degraded = emptied(unit.placement, topo)
        orphans = int((degraded.logcnt == 0).sum())
        row["orphaned_experts"] = orphans
        eplb = unit.planner.config  # the unit's phase's policy
        # a patched placement (the emptied one, or the orphans re-homed) is re-balanced at the
        # next scheduled rebalance whatever its predicted gain
        unit.rebalance_due = not orphans or eplb.emergency == "patch"
        if not orphans:
            unit.set_placement(degraded)
            return []
        load = unit.recorder.load(t - eplb.history_s, t) if unit.recorder is not None else None
        if load is None or not load.sum() > 0:
            load = self.popularity[unit.phase].mean(t - eplb.history_s, t)
        plan = unit.planner.emergency(degraded, load)
        row["emergency_replicas_moved"] = plan.replicas_moved
        row["stall_s"] = plan.copy_s
        solver = eplb.emergency if eplb.emergency != "resolve" else unit.planner.solver_name
        self.records.rebalances.append(
            rebalance_row(t, unit.phase, unit.index, "emergency", solver, plan, True)
        )
        unit.set_placement(degraded)  # (never stepped on: the unit stalls first)
        unit.pending_stall = plan
        return [] if unit.busy else [unit.stall(t)]
