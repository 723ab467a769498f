"""A unit's placement policy (`Planner`, one decision a `Plan`: a registered solver, ``static``,
``oracle`` or ``balanced``) and what moving a placement costs (`migration_bytes`); `emptied`
drops failed GPUs' slots and `Planner.emergency` places again when an expert lost every
replica; `trivial_placement` is a runtime's default (docs/serving.md, "Simulator", item 7)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from eplb import solvers
from eplb.evaluation.serving.config import EplbConfig
from eplb.evaluation.serving.config.model import ModelSpec
from eplb.placement import Placement
from eplb.topology import Topology

__all__ = ["Plan", "Planner", "emptied", "gpu_balance", "migration_bytes", "trivial_placement"]


def trivial_placement(model: ModelSpec, topology: Topology) -> Placement:
    """Slot ``p`` holds expert ``p mod E`` in every layer (SGLang's and vLLM's default)."""
    P, E = topology.num_slots, model.num_experts
    row = np.arange(P) % E
    phy2log = np.broadcast_to(row, (model.moe_layers, P))
    return Placement(phy2log, E, topology, meta={"solver": {"name": "trivial"}}).validate()


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


def migration_bytes(old: Placement, new: Placement, expert_bytes: float) -> np.ndarray:
    """``float64[G]``: bytes each GPU loads to move from ``old`` to ``new`` (a new replica on a
    GPU that held no replica of that expert in that layer)."""
    topo = new.topology
    L, G, S = new.num_layers, topo.num_gpus, topo.slots_per_gpu
    a = old.phy2log.reshape(L, G, S)
    b = new.phy2log.reshape(L, G, S)
    held = (b[..., :, None] == a[..., None, :]).any(-1)  # [L, G, S]: b's slot was there
    moved = (~held & (b >= 0)).sum(axis=(0, 2))
    return moved * float(expert_bytes)


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


class Planner:
    """The placement policy of one unit (`EplbConfig`; docs/serving.md, "Simulator", item 7)."""

    def __init__(
        self,
        config: EplbConfig,
        model: ModelSpec,
        topology: Topology,
        *,
        seed: int,
        unit_key: tuple[int, int],
    ):
        self.config = config
        self.model = model
        self.topology = topology
        self.seed = int(seed)
        self.unit_key = unit_key
        self.expert_bytes = float(model.expert_params)  # FP8 weights: one byte per parameter
        self.calls = 0

    @property
    def rebalances(self) -> bool:
        return self.config.solver not in ("static", "balanced")

    def _solve(self, name: str, load: np.ndarray, previous: Placement | None) -> Placement:
        self.calls += 1
        opts = dict(self.config.options) if name == self.config.solver else {}
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
        """The placement at the start: None for ``balanced``; ``trivial``; else solved on the
        expected load before the start (``history``; ``oracle``: on the first interval's)."""
        cfg = self.config
        if cfg.solver == "balanced":
            return None
        if cfg.solver == "oracle":
            return self._solve(cfg.base_solver, future_load(), None)
        if cfg.initial == "trivial":
            return trivial_placement(self.model, self.topology)
        name = cfg.base_solver if cfg.solver == "static" else cfg.solver
        return self._solve(name, history_load(), None)

    def emergency(self, degraded: Placement, load: np.ndarray) -> Plan:
        """A placement on the surviving GPUs (``self.topology`` marks the failed ones) from
        ``load: float[L, E]`` with ``previous=degraded`` (the live placement with the failed
        slots empty), for a unit that lost every replica of some expert."""
        cfg = self.config
        name = (
            cfg.solver if cfg.solver not in ("static", "oracle", "balanced") else (cfg.base_solver)
        )
        start = time.perf_counter()
        new = self._solve(name, load, degraded)
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
        name = self.config.base_solver if self.config.solver == "oracle" else self.config.solver
        start = time.perf_counter()
        new = self._solve(name, load, live)
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
        )
