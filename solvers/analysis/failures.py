"""Placing around failed GPUs: `solve` places on the survivors (`surviving`: a smaller
topology) and expands the result back with the failed GPUs' slots empty (-1).
docs/solvers.md, "How the building blocks work".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from eplb.errors import InfeasibleError
from eplb.placement import Placement
from eplb.topology import Topology

__all__ = ["expand", "solve_surviving", "surviving"]


def surviving(topology: Topology) -> tuple[Topology, np.ndarray]:
    """``(survivors, slots)``: the topology of the GPUs that have not failed and ``int64[P']``
    the original slot of each of its slots (ascending)."""
    failed = set(topology.failed_gpus)
    gpn, S = topology.gpus_per_node, topology.slots_per_gpu
    alive_gpus = [g for g in range(topology.num_gpus) if g not in failed]
    dead_nodes = {g // gpn for g in failed}
    whole = all(all(n * gpn + k in failed for k in range(gpn)) for n in dead_nodes)
    if whole:
        nodes, per_node = topology.num_nodes - len(dead_nodes), gpn
    else:
        nodes, per_node = 1, len(alive_gpus)
    small = Topology(
        nodes, per_node, S, nvlink_gbps=topology.nvlink_gbps, rdma_gbps=topology.rdma_gbps
    )
    slots = (np.asarray(alive_gpus, dtype=np.int64)[:, None] * S + np.arange(S)).ravel()
    return small, slots


def expand(placement: Placement, topology: Topology, slots: np.ndarray) -> Placement:
    """``placement`` (on the survivors' topology) on ``topology``, failed GPUs' slots -1;
    ``slots: int64[P']`` the original slot of each surviving slot (`surviving`)."""
    L = placement.num_layers
    phy2log = np.full((L, topology.num_slots), -1, dtype=np.int64)
    phy2log[:, slots] = placement.phy2log
    share = None
    if placement.replica_share is not None:
        share = np.zeros((L, topology.num_slots))
        share[:, slots] = placement.replica_share
    return Placement(
        phy2log, placement.num_experts, topology, share, placement.meta, placement.layer_ids
    )


def solve_surviving(
    run: Callable[[np.ndarray, Topology, Placement | None], Any],
    load: np.ndarray,  # float[L, E] or float[W, L, E]
    topology: Topology,
    *,
    previous: Placement | None,
) -> tuple[Any, Placement | None, Topology, np.ndarray]:
    """Run a policy (``run(load, topology, previous)``, ``load: float[L, E]`` or windows
    ``float[W, L, E]``) on the survivors of ``topology``;
    returns its output on the survivors' topology (not yet expanded), ``previous`` restricted
    to the survivors (for relabeling and counting moves), that topology and the surviving slots
    (for `expand`)."""
    small, slots = surviving(topology)
    E = load.shape[-1]  # [L, E] or windows [W, L, E]
    if small.num_slots < E:
        raise InfeasibleError(
            f"the {small.num_gpus} surviving GPUs hold {small.num_slots} slots, fewer than the "
            f"{E} experts; every expert needs a slot"
        )
    prev = None
    if previous is not None:
        old = previous.phy2log[:, slots]
        if (old < 0).any():  # a GPU failed since: keep what survives
            old = np.where(old < 0, 0, old)
        prev = Placement(old, previous.num_experts, small, None, previous.meta, previous.layer_ids)
    return run(load, small, prev), prev, small, slots
