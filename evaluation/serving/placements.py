"""A model's expert placement on one unit: `trivial_placement` (a runtime's default),
`fit_placement` (a placement or placement file as the model's ``[moe_layers, P]`` placement: the
one way the simulator's ``eplb.initial`` and `advise`'s ``previous`` read a file), and how
SGLang splits an expert's tokens over its replicas (`sglang_first_slot`, `sglang_static`), as
``replica_share`` for the ``weighted`` dispatch policy."""

from __future__ import annotations

import os

import numpy as np

from eplb.errors import InputError
from eplb.evaluation.serving.config.model import ModelSpec
from eplb.io import read_placement
from eplb.placement import Placement
from eplb.topology import Topology

__all__ = ["fit_placement", "sglang_first_slot", "sglang_static", "trivial_placement"]


def trivial_placement(model: ModelSpec, topology: Topology) -> Placement:
    """Slot ``p`` holds expert ``p mod E`` in every layer (SGLang's and vLLM's default)."""
    P, E = topology.num_slots, model.num_experts
    row = np.arange(P) % E
    phy2log = np.broadcast_to(row, (model.moe_layers, P))
    return Placement(phy2log, E, topology, meta={"solver": {"name": "trivial"}}).validate()


def fit_placement(source: Placement | str | os.PathLike, model: ModelSpec, topology: Topology,
                  *, what: str) -> Placement:
    """``source`` (a `Placement`, or a placement file in any format eplb reads: SGLang,
    TensorRT-LLM and vLLM files take ``topology``) as ``model``'s ``[moe_layers, P]``
    placement on ``topology``: its rows sorted by layer id (model-layer order, whatever order
    the file lists them in); a map of every model layer (SGLang's) without its dense layers'
    rows. Raises `InputError` starting with ``what`` (the argument's name) when it does not
    fit the unit (MoE layers, experts, nodes, GPUs per node, slots per GPU)."""
    if isinstance(source, Placement):
        p, where = source, ""
    else:
        p = read_placement(source, topology=topology, num_experts=model.num_experts)
        where = f" {source}"
    order = np.argsort(p.layer_ids, kind="stable")
    L = model.moe_layers
    if p.num_layers == model.num_layers and L < p.num_layers:  # every model layer: SGLang's
        order = order[model.dense_layers:]
    t, pt = topology, p.topology
    if order.size != L or p.num_experts != model.num_experts or \
            (pt.num_nodes, pt.gpus_per_node, pt.slots_per_gpu) != \
            (t.num_nodes, t.gpus_per_node, t.slots_per_gpu):
        raise InputError(
            f"{what}{where}: {order.size} layers x {p.num_experts} experts on "
            f"{pt.num_nodes}x{pt.gpus_per_node}x{pt.slots_per_gpu}, but the unit has {L} MoE "
            f"layers x {model.num_experts} experts on {t.num_nodes}x{t.gpus_per_node}x"
            f"{t.slots_per_gpu}; solve for this unit (eplb solve --topology ...)"
        )
    share = None if p.replica_share is None else p.replica_share[order]
    return Placement(p.phy2log[order], p.num_experts, topology, share, p.meta).validate()


def sglang_first_slot(placement: Placement) -> Placement:
    """``placement`` (the trivial one) as SGLang runs it with no dispatch algorithm: with
    neither ``--enable-eplb`` nor ``--init-expert-location`` SGLang leaves
    ``ep_dispatch_algorithm`` unset (server_args ``_handle_eplb_and_dispatch``), so
    ``topk_ids_logical_to_physical`` returns the router's logical ids as physical ids
    (fzyzcjy/sglang@5e446c00:python/sglang/srt/managers/expert_location_dispatch.py): expert
    ``e`` is always served by slot ``e``, and the redundant slots ``E..P-1`` of the trivial
    layout receive nothing. Shares: 1 on the slot whose index is its expert, 0 elsewhere.
    `InputError` when some expert's slot ``e`` does not hold ``e``."""
    E = placement.num_experts
    slots = placement.phy2log.shape[1]
    if slots < E or (placement.phy2log[:, :E] != np.arange(E)).any():
        raise InputError("SGLang serves expert e from slot e only when slot e holds it (the "
                         "trivial layout); give the trivial placement or use sglang_static")
    share = np.zeros(placement.phy2log.shape)
    share[:, :E] = 1.0
    return Placement(placement.phy2log, E, placement.topology, share, placement.meta,
                     placement.layer_ids).validate()


def sglang_static(placement: Placement, seed: int = 42) -> Placement:
    """``placement`` as SGLang's static dispatch routes it (set by ``--enable-eplb`` or
    ``--init-expert-location``): every source GPU sends all its picks of an expert to one
    replica, its own GPU's when it holds one, else one drawn at random per (layer, expert,
    GPU) (``compute_logical_to_rank_dispatch_physical_map``,
    fzyzcjy/sglang@10584e15:python/sglang/srt/managers/expert_location.py; SGLang draws with
    torch seeded ``42 + rank``, here numpy ``default_rng(seed)``: the same law, other draws).
    With every source sending alike, a replica's share is the fraction of GPUs that send to
    it. Empty slots (-1) get 0."""
    phy2log = placement.phy2log
    L, P = phy2log.shape
    topo = placement.topology
    G, S = topo.num_gpus, topo.slots_per_gpu
    gpu_of = np.arange(P) // S
    rng = np.random.default_rng(seed)
    share = np.zeros((L, P))
    for layer in range(L):
        row = phy2log[layer]
        order = np.argsort(row, kind="stable")
        experts, first, counts = np.unique(row[order], return_index=True, return_counts=True)
        for e, i, c in zip(experts, first, counts, strict=True):
            if e < 0:
                continue
            reps = order[i:i + c]  # ascending slots of expert e
            if c == 1:
                share[layer, reps[0]] = 1.0
                continue
            pick = rng.integers(0, c, size=G)  # a random replica per source GPU
            for k, slot in enumerate(reps):  # a GPU holding a replica serves itself
                pick[gpu_of[slot]] = k
            share[layer, reps] = np.bincount(pick, minlength=c) / G
    return Placement(phy2log, placement.num_experts, topo, share, placement.meta,
                     placement.layer_ids).validate()
