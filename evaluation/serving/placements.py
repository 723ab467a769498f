"""A model's expert placement on one unit: `trivial_placement` (a runtime's default) and
`fit_placement` (a placement or placement file as the model's ``[moe_layers, P]`` placement: the
one way the simulator's ``eplb.initial`` and `advise`'s ``previous`` read a file)."""

from __future__ import annotations

import os

import numpy as np

from eplb.errors import InputError
from eplb.evaluation.serving.config.model import ModelSpec
from eplb.io import read_placement
from eplb.placement import Placement
from eplb.topology import Topology

__all__ = ["fit_placement", "trivial_placement"]


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
