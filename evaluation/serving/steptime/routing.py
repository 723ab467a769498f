"""A step's expert load routed through a placement by the unit's dispatch policy (an
`eplb.dispatch.Dispatch`): picks per slot and per GPU, and (prefill) the visit probabilities
the all-to-all needs. When every source routes alike, the policy's expected shares and the
co-occurrence model (`eplb.dispatch.expect`); per-source loads or a per-source policy
(``local_first``) go through the traffic model (`evaluation.traffic.simulate`).
`RoutedPlacement` holds what stays fixed over many steps (`StepRouting.prepare`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from eplb.dispatch import Dispatch
from eplb.dispatch.expect import SlotRouting, visit_probabilities
from eplb.errors import InputError
from eplb.evaluation import traffic
from eplb.evaluation.serving.config.hardware import COMBINE_BYTES, DISPATCH_BYTES
from eplb.evaluation.serving.config.model import ModelSpec
from eplb.placement import Placement
from eplb.topology import Topology


@dataclass(frozen=True, eq=False)
class RoutedPlacement:
    """A placement and an expected step load prepared by `StepModel.prepare` (``placement``
    None: perfectly balanced routing, every other field None).

    Shape: ``dist: float64[L, E]`` expected share of a layer's picks per expert; ``gather:
    int64[L * P]`` flat index ``layer * E + expert`` of each slot; ``share: float64[L, P]``
    share of its expert's picks a slot receives; ``v: float64[L, G]``, ``vn: float64[L, N]``
    visit probability of each GPU / node (prefill; None in decode). ``batch_shares``: under a
    dispatch that splits each batch anew (``lp``), ``dist -> share`` of each step (its
    `Dispatch.batch_shares`), else None.
    """

    placement: Placement | None
    dist: np.ndarray | None
    gather: np.ndarray | None
    share: np.ndarray | None
    v: np.ndarray | None
    vn: np.ndarray | None
    batch_shares: Callable[[np.ndarray], np.ndarray] | None = None

    @property
    def load(self) -> np.ndarray | None:
        """The prepared distribution (``dist``), as a load `StepModel.time` accepts."""
        return self.dist


class StepRouting:
    """Routing of one unit's steps (``phase``, ``topology``, ``model``) by its configured
    dispatch ``policy``."""

    def __init__(self, phase: str, topology: Topology, model: ModelSpec, policy: Dispatch):
        self.phase, self.topology, self.model, self.policy = phase, topology, model, policy
        # the co-occurrence model's shape (`expect.visit_probabilities`)
        self.groups = dict(top_k=model.top_k, num_groups=model.num_groups,
                           topk_groups=model.topk_groups)

    def slot_routing(self, placement: Placement, dist: np.ndarray | None = None) -> SlotRouting:
        """The policy's expected shares of ``placement`` as `SlotRouting` tables (a per-batch
        policy splits ``dist: float[L, E]``)."""
        m = self.model
        return self.policy.routing(placement, m.num_groups, m.topk_groups, dist)

    def check_placement(self, placement: Placement) -> None:
        if not isinstance(placement, Placement):
            raise InputError(
                f"placement must be a Placement or None, got {type(placement).__name__}"
            )
        m, topo = self.model, self.topology
        pt = placement.topology
        if (pt.num_nodes, pt.gpus_per_node, pt.slots_per_gpu) != (
            topo.num_nodes,
            topo.gpus_per_node,
            topo.slots_per_gpu,
        ):
            raise InputError(
                f"placement is for {placement.topology} but the unit is {topo}; "
                "solve the placement on the unit's topology"
            )
        if (placement.num_layers, placement.num_experts) != (m.moe_layers, m.num_experts):
            raise InputError(
                f"placement has {placement.num_layers} layers x {placement.num_experts} experts "
                f"but {m.name} has {m.moe_layers} MoE layers x {m.num_experts} experts"
            )

    def routed(self, placement: Placement, load, src: np.ndarray):
        """One micro-batch of ``src: float[G]`` tokens per rank with the step's ``load``
        (``float[L, E]`` or per source ``float[L, G, E]``): ``(slot: float[L, P] picks per
        slot, recv: float[L, G] picks per GPU, v, vn, report)``; ``v``/``vn`` the visit
        probabilities (fast path, prefill) or None, ``report`` the `traffic.TrafficReport`
        (slow path: per-source loads or a per-source policy) or None."""
        m, topo, policy = self.model, self.topology, self.policy
        L, E, G, K = m.moe_layers, m.num_experts, topo.num_gpus, m.top_k
        total = src.sum()
        arr = check_step_load(load, L, G, E)
        if arr.ndim == 2 and policy.alike:
            dist = normalise(arr)
            picks = dist * (K * total)  # [L, E]
            rt = self.slot_routing(placement, dist)
            slot = np.take_along_axis(picks, rt.expert, 1) * rt.share
            recv = slot.reshape(L, G, -1).sum(-1)
            if self.phase == "decode":  # low-latency kernels: picks only
                return slot, recv, None, None, None
            # visit probabilities of a step whose picks follow ``dist`` (the fast path)
            v, vn = visit_probabilities(rt, np.minimum(dist * K, 1.0), topo, **self.groups)
            return slot, recv, v, vn, None
        if not policy.per_pick:
            raise InputError(
                f"dispatch {policy.name!r} takes a step load float[L, E]; per-source loads "
                "float[L, G, E] need dispatch 'even' or 'local_first'"
            )
        # slow path: per-source distributions or a per-source policy, via traffic.simulate
        if arr.ndim == 2:
            per_src = normalise(arr)[:, None, :] * (K * src)[None, :, None]
        else:
            per_src = normalise(arr.reshape(L * G, E)).reshape(L, G, E) * (K * src)[None, :, None]
        report = traffic.simulate(
            placement,
            source_counts=per_src,
            policy=policy.name,
            hidden=m.hidden,
            dispatch_bytes=DISPATCH_BYTES,
            combine_bytes=COMBINE_BYTES,
            top_k=K,
            num_groups=m.num_groups,
            topk_groups=m.topk_groups,
            keep_slots=False,
        )
        slot = policy.slot_picks(
            placement, per_src, num_groups=m.num_groups, topk_groups=m.topk_groups
        )
        return slot, report.gpu_tokens, None, None, report

    def prepare(self, placement: Placement, load) -> RoutedPlacement:
        """`RoutedPlacement` of ``placement`` (checked) with the expected ``load: float[L, E]``
        (None: uniform)."""
        m, topo, policy = self.model, self.topology, self.policy
        self.check_placement(placement)
        if not policy.alike:
            raise InputError(
                f"prepare() covers dispatch policies whose sources split alike; {policy.name} "
                "routes per source rank: call time(batch, placement, load) instead"
            )
        L, E = m.moe_layers, m.num_experts
        arr = np.ones((L, E)) if load is None else check_step_load(load, L, topo.num_gpus, E)
        if arr.ndim != 2:
            raise InputError("prepare() takes a load float[L, E]; per-source loads need time()")
        dist = normalise(arr)
        rt = self.slot_routing(placement, dist)
        gather = (np.arange(L)[:, None] * E + rt.expert).ravel()
        v = vn = None
        if self.phase == "prefill":
            v, vn = visit_probabilities(rt, np.minimum(dist * m.top_k, 1.0), topo,
                                        **self.groups)
        return RoutedPlacement(placement, dist, gather, rt.share, v, vn,
                               policy.batch_shares(placement))

    def slot_picks(self, routed: RoutedPlacement, dist: np.ndarray, scale: float) -> np.ndarray:
        """``float64[L, P]``: picks per slot of one micro-batch on a prepared placement:
        ``dist: float[L, E]`` (the step's load) gathered to the slots, times each slot's
        share and ``scale`` (picks of the micro-batch per unit of ``dist``); under a per-batch
        policy the shares are its split of this ``dist``."""
        slot = dist.ravel().take(routed.gather, mode="clip").reshape(self.model.moe_layers, -1)
        slot *= routed.share if routed.batch_shares is None else routed.batch_shares(dist)
        slot *= scale
        return slot


def per_gpu(slot: np.ndarray, S: int) -> np.ndarray:
    """``float[L, G]``: sums of ``slot: float[L, G * S]`` over each GPU's ``S`` slots (strided
    adds: faster than a reduction over a short last axis)."""
    if S == 1:
        return slot.copy()
    L = slot.shape[0]
    flat = slot.reshape(-1)  # (1-D strided views are faster than 2-D ones)
    out = flat[0::S] + flat[1::S]
    for s in range(2, S):
        out += flat[s::S]
    return out.reshape(L, -1)


def check_step_load(load, L: int, G: int, E: int) -> np.ndarray:
    """``load`` as ``float64[L, E]`` or ``float64[L, G, E]`` finite counts >= 0 (else
    `InputError`)."""
    try:
        arr = np.asarray(load, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"load must be a numeric array, got {type(load).__name__}") from None
    if arr.shape not in ((L, E), (L, G, E)):
        raise InputError(
            f"load must be float[{L}, {E}] (picks per expert per MoE layer) or "
            f"float[{L}, {G}, {E}] (per source rank), got shape {arr.shape}"
        )
    if not np.all(np.isfinite(arr)) or (arr < 0).any():
        raise InputError("load must hold finite counts >= 0")
    return arr


def normalise(rows: np.ndarray) -> np.ndarray:
    """Each row of ``rows: float[..., E]`` as a distribution over experts (an all-zero row
    becomes uniform)."""
    s = rows.sum(-1, keepdims=True)
    return np.where(s > 0, rows / np.where(s > 0, s, 1.0), 1.0 / rows.shape[-1])
