"""GPU failures in the loop: the failed GPU's work is lost (its queued and running requests
prefill again or retry their KV transfer), its slots empty, and experts left without a replica
force an emergency placement (by default a patch that re-homes only them) that stalls the unit
until it is copied in; the next scheduled rebalance re-balances fully (docs/serving.md,
"Simulator", item 8). The fault objects themselves are `config.faults.GpuFailure`."""

from __future__ import annotations

import heapq
from collections import deque

import numpy as np

from eplb.evaluation.serving.simulator.decode import DecodeUnit
from eplb.evaluation.serving.simulator.eplb_loop import rebalance_row
from eplb.evaluation.serving.simulator.events import FAULT
from eplb.evaluation.serving.simulator.planner import emptied
from eplb.evaluation.serving.simulator.prefill import PrefillUnit
from eplb.evaluation.serving.simulator.records import COL_INPUT_DONE, COL_OUTPUT

__all__ = ["Faults"]


class Faults:
    """The fault handlers of a run (``sim``: the `Simulation`)."""

    def __init__(self, sim):
        self.sim = sim

    def schedule(self) -> None:
        """A fault event for every configured fault before the end."""
        sim = self.sim
        for j, fault in enumerate(sim.cfg.faults):
            if fault.time_s < sim.end_time:
                sim.events.push(fault.time_s, FAULT, j)

    def on_fault(self, j: int, t: float) -> None:
        """Fault ``j`` of the config: GPU ``fault.gpu`` of unit ``fault.unit`` stops for good."""
        sim = self.sim
        fault = sim.cfg.faults[j]
        phase, u = fault.unit
        g = fault.gpu
        unit = sim.units[phase][u]
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
            sim.records.faults.append(row)
            return
        unit.alive[g] = False
        requeued = (
            self.fail_prefill_rank(unit, g, t)
            if phase == "prefill"
            else (self.fail_decode_rank(unit, g, t))
        )
        row["requests_requeued"] = requeued
        self.emergency(unit, t, row)
        sim.records.faults.append(row)
        if not unit.alive.any():
            unit.dead = True
        adm = sim.admission
        adm.route_prefill(t)
        adm.route_decode(t, fresh=True)
        for pu in sim.units["prefill"]:
            if not pu.busy and not pu.dead:
                pu.start(sim, t)

    def fail_prefill_rank(self, unit: PrefillUnit, g: int, t: float) -> int:
        """Rank ``g`` of prefill ``unit`` is lost: its queued and running chunks, its cache and
        the KV of prefilled requests still on it; those requests prefill again."""
        sim = self.sim
        adm, req, rec = sim.admission, sim.req, sim.records
        Gp = adm.Gp
        gg = unit.index * Gp + g
        lost = [e[0] for e in unit.queues[g]]
        unit.queues[g] = []
        if unit.busy:  # the running step's chunks on g are lost with the GPU, and so is
            # this step's work on a prompt with a (context-parallel) piece on g or queued on g
            hit = {id(c[2]) for c in unit.inflight if g in (c[0], c[1])}
            for _r, _owner, e, _n, _c, last in unit.inflight:
                if id(e) in hit and last:
                    rec.patch_step(unit.row, COL_INPUT_DONE, -float(req.p_len[e[0]]))
            unit.inflight = [c for c in unit.inflight if id(c[2]) not in hit]
        adm.p_state.fail(gg)
        if adm.local is not None:
            adm.local.clear(gg)
        # prefilled requests whose KV was still on g (waiting for decode room or in transfer)
        on_g = [i for i in adm.d_wait if req.p_unit[i] * Gp + req.p_rank[i] == gg]
        if on_g:
            drop = set(on_g)
            adm.d_wait = deque(i for i in adm.d_wait if i not in drop)
        for du in sim.units["decode"]:
            keep = []
            for item in du.pending:
                i = item[2]
                if item[0] > t and req.p_unit[i] * Gp + req.p_rank[i] == gg:
                    on_g.append(i)
                    adm.release_decode(du, i, item[3])
                else:
                    keep.append(item)
            if len(keep) != len(du.pending):
                heapq.heapify(keep)
                du.pending = keep
        for i in on_g:  # their first token was out; the KV is gone: prefill again
            req.gen[i] = max(req.gen[i], 1)
        adm.requeue_prefill(lost + on_g, t)
        return len(lost) + len(on_g)

    def fail_decode_rank(self, unit: DecodeUnit, g: int, t: float) -> int:
        """Rank ``g`` of decode ``unit`` is lost: its running requests prefill again (prompt +
        tokens so far); requests whose KV was on its way to it retry the transfer."""
        sim = self.sim
        adm, req, rec = sim.admission, sim.req, sim.records
        gg = unit.index * adm.Gd + g
        done_steps = unit.k  # steps finished; a running step is lost for the failed rank
        lost, lost_tokens = [], 0.0
        for kf in list(unit.finish_at):
            reqs = unit.finish_at[kf]
            live = unit.live(np.array(reqs, dtype=np.int64), kf, req).tolist()
            mine = [i for i, ok in zip(reqs, live, strict=True) if ok and req.d_rank[i] == g]
            if not mine:
                continue
            unit.finish_at[kf] = [i for i in reqs if i not in set(mine)]
            if not unit.finish_at[kf]:
                del unit.finish_at[kf]
            for i in mine:
                req.gen[i] += unit.settle(i, sim)
                req.d_phase[i] = 0
                lost.append(i)
                if unit.busy:  # what the running step would have emitted for it
                    step_out = unit.e
                    if kf == done_steps:
                        step_out -= req.d_steps[i] * unit.e - req.d_need[i]
                    lost_tokens += step_out
        unit.running[g] = []
        if unit.busy and lost_tokens:
            rec.patch_step(unit.row, COL_OUTPUT, -float(lost_tokens))
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
                req.retries[item[2]] += 1
                req.d_unit[item[2]] = req.d_rank[item[2]] = -1
            adm.d_wait.extendleft(item[2] for item in sorted(back, reverse=True))
            adm.d_new += len(back)
        # requests still in prefill with their decode KV reserved on g (``before_prefill``):
        # the reservation goes; they join the decode queue when their prefill ends
        held = np.nonzero((np.asarray(req.d_phase) == 1) & (np.asarray(req.d_unit) == unit.index)
                          & (np.asarray(req.d_rank) == g))[0]
        for i in held.tolist():
            adm.release(i)
            req.d_unit[i] = req.d_rank[i] = -1
        adm.d_state.fail(gg)
        adm.d_version += 1
        adm.requeue_prefill(lost, t)
        return len(lost) + len(back)

    def emergency(self, unit, t: float, row: dict) -> None:
        """The failed GPUs' slots empty at once (surviving replicas take their tokens); experts
        left without a replica (``row["orphaned_experts"]``, in (layer, expert) pairs) force an
        emergency placement (a ``rebalances`` row of kind ``emergency``), and the unit stalls
        until it is copied in. After a ``patch`` (or a failure that orphaned nothing) the next
        scheduled rebalance is never skipped."""
        if unit.placement is None:  # balanced routing: spread over the GPUs left
            return
        sim = self.sim
        failed = tuple(int(x) for x in np.flatnonzero(~unit.alive))
        topo = unit.placement.topology.with_failed(failed)
        unit.planner.topology = topo
        degraded = emptied(unit.placement, topo)
        orphans = int((degraded.logcnt == 0).sum())
        row["orphaned_experts"] = orphans
        eplb = sim.cfg.eplb
        # a patched placement (the emptied one, or the orphans re-homed) is re-balanced at the
        # next scheduled rebalance whatever its predicted gain
        unit.rebalance_due = not orphans or eplb.emergency == "patch"
        if not orphans:
            unit.set_placement(degraded)
            return
        load = unit.recorder.load(t - eplb.history_s, t) if unit.recorder is not None else None
        if load is None or not load.sum() > 0:
            load = sim.popularity[unit.phase].mean(t - eplb.history_s, t)
        plan = unit.planner.emergency(degraded, load)
        row["emergency_replicas_moved"] = plan.replicas_moved
        row["stall_s"] = plan.copy_s
        solver = eplb.emergency if eplb.emergency != "resolve" else unit.planner.solver_name
        sim.records.rebalances.append(
            rebalance_row(t, unit.phase, unit.index, "emergency", solver, plan, True)
        )
        unit.set_placement(degraded)  # (never stepped on: the unit stalls first)
        unit.pending_stall = plan
        if not unit.busy:
            sim.eplb.stall(unit, t)
