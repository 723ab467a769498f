"""A unit's placement policy (`Planner`, one decision a `Plan`: a registered solver, ``static``,
``oracle`` or ``balanced``: `config.EplbMode`) and what moving a placement costs
(`eplb.moves.migration_bytes`); `emptied` drops failed GPUs' slots, `patch_orphans` re-homes
the experts that lost every replica with the fewest moves and `Planner.emergency` applies
``eplb.emergency`` (``patch`` or ``resolve``); the initial placement is a runtime's default
(`placements.trivial_placement`), solved, or a file (`placements.fit_placement`)
(docs/serving.md, "Simulator", items 7 and 8)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from eplb import solvers
from eplb.errors import InfeasibleError, InputError
from eplb.evaluation.serving.config import EplbConfig, EplbMode, InitialPlacement
from eplb.evaluation.serving.config.model import ModelSpec
from eplb.evaluation.serving.placements import fit_placement, trivial_placement
from eplb.moves import migration_bytes
from eplb.placement import Placement
from eplb.solvers.primitives.orphans import rehome_orphans
from eplb.solvers.primitives.replica_budget import expert_slots_per_gpu
from eplb.topology import Topology

__all__ = ["Plan", "Planner", "emptied", "gpu_balance", "migration_bytes", "patch_orphans"]
__all__ += ["trivial_placement"]  # (defined in `placements`; kept here for its importers)


def emptied(placement: Placement, topology: Topology) -> Placement:
    """``placement`` on ``topology`` (the same shape with failed GPUs marked) with the failed
    GPUs' slots empty (-1) and each expert's replica shares renormalised over its surviving
    replicas. Experts whose every replica was on a failed GPU are left with none (check
    ``logcnt == 0``): not a valid placement until an emergency placement replaces it."""
    dead = ~topology.slot_alive
    phy2log = np.where(dead[None, :], -1, placement.phy2log)
    share = None
    if placement.replica_share is not None:
        L, E = placement.num_layers, placement.num_experts
        kept = np.where(dead[None, :], 0.0, placement.replica_share)
        flat = np.clip(phy2log, 0, None) + (np.arange(L) * E)[:, None]
        sums = np.bincount(flat.ravel(), kept.ravel(), L * E).reshape(L, E)
        denom = np.take_along_axis(sums, np.clip(phy2log, 0, None), 1)
        share = np.where((phy2log >= 0) & (denom > 0), kept / np.where(denom > 0, denom, 1), 0.0)
    return Placement(
        phy2log, placement.num_experts, topology, share, placement.meta, placement.layer_ids
    )


def patch_orphans(degraded: Placement, load: np.ndarray) -> Placement:
    """``degraded`` (`emptied`: failed GPUs' slots empty) with one replica for every expert
    that lost all of its (``logcnt == 0``): the fewest moves there are, one new replica per
    orphaned (layer, expert); every other slot keeps its expert.

    The slots are chosen from ``load: float[L, E]`` by `solvers.primitives.orphans.
    rehome_orphans` (heaviest orphan first, the slot leaving the layer's max GPU load lowest;
    shares renormalised when the placement has ``replica_share``). `InfeasibleError` when the
    surviving GPUs hold fewer slots than experts."""
    topo = degraded.topology
    E = degraded.num_experts
    if int(topo.slot_alive.sum()) < E:
        raise InfeasibleError(
            f"the surviving GPUs hold {int(topo.slot_alive.sum())} slots, fewer than the {E} "
            "experts; every expert needs a slot"
        )
    phy2log, share = rehome_orphans(
        degraded.phy2log, E, load, topo.slots_per_gpu, degraded.replica_share
    )
    orphans = int((degraded.logcnt == 0).sum())
    meta = {**degraded.meta, "solver": {"name": "patch", "orphans": orphans}}
    return Placement(phy2log, E, topo, share, meta, degraded.layer_ids).validate()


def gpu_balance(placement: Placement | None, load: np.ndarray) -> float:
    """Mean over layers of max / mean GPU load of ``load: float[L, E]`` (1.0 when None)."""
    if placement is None:
        return 1.0
    gl = placement.gpu_load(load)
    mean = gl.mean(-1)
    ok = mean > 0
    if not ok.any():
        return 1.0
    return float((gl.max(-1)[ok] / mean[ok]).mean())


@dataclass
class Plan:
    """A rebalance decision: the new placement, why, and what it moves."""

    placement: Placement
    replicas_moved: int
    bytes_moved: float
    max_gpu_bytes: float
    copy_s: float
    solve_wall_s: float
    balance_before: float
    balance_after: float
    predicted_gain: float = math.nan  # 1 - after / before on the load it was placed from


class Planner:
    """The placement policy of one unit (its phase's `EplbConfig`, ``ClusterConfig.eplb_for``;
    docs/serving.md, "Simulator", item 7)."""

    def __init__(
        self,
        config: EplbConfig,
        model: ModelSpec,
        topology: Topology,
        *,
        seed: int,
        unit_key: tuple[int, int],
        phase: str = "",
    ):
        self.config = config
        self.phase = phase  # "prefill" or "decode": errors name the phase's eplb table
        self.model = model
        self.topology = topology
        self.seed = int(seed)
        self.unit_key = unit_key
        self.expert_bytes = float(model.expert_bytes)  # at the experts' data type
        self.calls = 0
        # routed experts a GPU may keep summed over layers (its expert weight memory) once the
        # initial placement left slots empty (`reserve`); None: every slot's weights held
        self.max_gpu_slots: int | None = None

    def reserve(self, placement: Placement | None) -> int | None:
        """Fix the unit's expert weight memory from its initial ``placement``: when it leaves
        live slots empty (a replica budget, ``craft``), its fullest GPU's routed experts
        summed over layers become ``max_gpu_slots``, the cap every later solve that takes
        it is given, so the KV cache sized from the freed memory at the start is never taken
        back. Returns the cap (None: all slots used)."""
        S = self.topology.slots_per_gpu
        if placement is None or not (placement.phy2log[:, placement.topology.slot_alive] < 0).any():
            self.max_gpu_slots = None
        else:
            self.max_gpu_slots = expert_slots_per_gpu(placement.phy2log, S)
        return self.max_gpu_slots

    @property
    def rebalances(self) -> bool:
        return self.config.mode.rebalances

    @property
    def solver_name(self) -> str:
        """The registered solver this unit places with (``base_solver`` for ``static``,
        ``oracle`` and ``balanced``)."""
        return self.config.placing_solver

    def _solve(self, name: str, load: np.ndarray, previous: Placement | None) -> Placement:
        self.calls += 1
        opts = dict(self.config.options) if name == self.config.solver else {}
        if self.max_gpu_slots is not None and "max_gpu_slots" in solvers.options(name):
            cap = opts.get("max_gpu_slots")
            opts["max_gpu_slots"] = self.max_gpu_slots if cap is None else min(
                int(cap), self.max_gpu_slots
            )
        return solvers.solve(
            name,
            load,
            self.topology,
            num_groups=self.model.num_groups,
            previous=previous,
            seed=(self.seed * 1_000_003 + self.unit_key[0] * 1009 + self.unit_key[1]) % 2**31
            + self.calls,
            **opts,
        )

    def initial(self, history_load, future_load) -> Placement | None:
        """The placement at the start: None for ``balanced``; for ``oracle`` solved on the
        first interval's expected load (``future_load()``); else ``eplb.initial``: ``trivial``,
        the placement file, or solved on the expected load before the start
        (``history_load()``)."""
        cfg = self.config
        mode, kind = cfg.mode, cfg.initial_kind
        if mode is EplbMode.BALANCED:
            return None
        if mode is EplbMode.ORACLE:
            return self._solve(cfg.base_solver, future_load(), None)
        if kind is InitialPlacement.TRIVIAL:
            return trivial_placement(self.model, self.topology)
        if kind is InitialPlacement.FILE:
            where = f"{self.phase}: eplb.initial" if self.phase else "eplb.initial"
            try:
                return fit_placement(cfg.initial, self.model, self.topology, what=where)
            except InputError as exc:
                if not self.phase:
                    raise
                raise InputError(f"{exc}; or give the {self.phase} units their own file: "
                                 f"[{self.phase}.eplb] initial = \"...\" (--set "
                                 f"{self.phase}.eplb.initial=PATH)") from None
        return self._solve(cfg.placing_solver, history_load(), None)

    def emergency(self, degraded: Placement, load: np.ndarray) -> Plan:
        """The placement for a unit that lost every replica of some expert (``degraded``: the
        live placement with the failed slots empty, on ``self.topology`` which marks the failed
        GPUs), from ``load: float[L, E]``: ``eplb.emergency = "patch"`` re-homes only the
        orphaned experts (`patch_orphans`); ``"repair"`` then runs the ``repair`` solver on the
        patch (``tolerance=eplb.emergency_tolerance``); ``"resolve"`` places afresh with the
        unit's solver (`solver_name`) and ``previous=degraded``."""
        cfg = self.config
        start = time.perf_counter()
        if cfg.emergency in ("patch", "repair"):
            new = patch_orphans(degraded, load)
            if cfg.emergency == "repair":
                new = solvers.solve(
                    "repair",
                    load,
                    self.topology,
                    num_groups=self.model.num_groups,
                    previous=new,
                    tolerance=cfg.emergency_tolerance,
                )
        else:
            new = self._solve(self.solver_name, load, degraded)
        wall = time.perf_counter() - start
        per_gpu = migration_bytes(degraded, new, self.expert_bytes)
        return Plan(
            placement=new,
            replicas_moved=int(round(per_gpu.sum() / self.expert_bytes)),
            bytes_moved=float(per_gpu.sum()),
            max_gpu_bytes=float(per_gpu.max(initial=0.0)),
            copy_s=float(per_gpu.max(initial=0.0) / (cfg.migration_gbps * 1e9)),
            solve_wall_s=wall,
            balance_before=math.nan,
            balance_after=gpu_balance(new, load),
        )

    def plan(self, live: Placement, load: np.ndarray, judge: np.ndarray) -> Plan | None:
        """A new placement from ``load: float[L, E]`` (the recorded history, or for the oracle
        the expected future load) with ``previous=live``; ``judge: float[L, E]`` is the load the
        balance columns are measured on. None when there is nothing to place from."""
        if not np.isfinite(load).all() or load.sum() <= 0:
            return None
        start = time.perf_counter()
        new = self._solve(self.config.placing_solver, load, live)
        wall = time.perf_counter() - start
        per_gpu = migration_bytes(live, new, self.expert_bytes)
        moved = int(round(per_gpu.sum() / self.expert_bytes)) if self.expert_bytes else 0
        gbps = self.config.migration_gbps * 1e9
        return Plan(
            placement=new,
            replicas_moved=moved,
            bytes_moved=float(per_gpu.sum()),
            max_gpu_bytes=float(per_gpu.max(initial=0.0)),
            copy_s=float(per_gpu.max(initial=0.0) / gbps),
            solve_wall_s=wall,
            balance_before=gpu_balance(live, judge),
            balance_after=gpu_balance(new, judge),
            predicted_gain=1.0 - gpu_balance(new, load) / gpu_balance(live, load),
        )
