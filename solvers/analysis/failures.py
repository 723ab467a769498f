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
from eplb.solvers.primitives.group_placement import place_uneven_nodes
from eplb.solvers.primitives.orphans import rehome_orphans
from eplb.solvers.primitives.shares import optimal_shares
from eplb.topology import Topology

__all__ = ["expand", "keep_contract", "real_group_nodes", "solve_surviving", "surviving"]


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
        old = previous.phy2log[:, slots]  # -1 here: a slot the live placement left empty
        rows = load if load.ndim == 2 else load.mean(0)
        old = rehome_orphans(old, previous.num_experts, rows, small.slots_per_gpu)[0]
        prev = Placement(old, previous.num_experts, small, None, previous.meta, previous.layer_ids)
    return run(load, small, prev), prev, small, slots


def survivor_nodes(topology: Topology, slots: np.ndarray) -> np.ndarray:
    """``int64[G']`` the node (of ``topology``) of each surviving GPU, for ``slots`` from
    `surviving`."""
    S = topology.slots_per_gpu
    return slots[::S] // S // topology.gpus_per_node


def real_group_nodes(
    phy2log: np.ndarray, num_experts: int, topology: Topology, slots: np.ndarray, groups: int
) -> np.ndarray:
    """``int64[L, groups]``: the node of ``topology`` holding each group of ``phy2log:
    int64[L, P']`` (on the survivors, a placement that keeps the contract on the real nodes;
    ``slots`` from `surviving`)."""
    S = topology.slots_per_gpu
    node = np.repeat(survivor_nodes(topology, slots), S)  # [P'] real node of each slot
    L, M = phy2log.shape[0], num_experts // groups
    out = np.zeros((L, groups), dtype=np.int64)
    for layer in range(L):
        out[layer, phy2log[layer] // M] = node
    return out


def keep_contract(
    placement: Placement, load: np.ndarray, topology: Topology, slots: np.ndarray, groups: int
) -> tuple[Placement, list[int], str | None]:
    """``placement`` on the survivors (one node when a node is only partly failed, `surviving`)
    with every layer that splits a group over two real nodes of ``topology`` re-placed by
    `place_uneven_nodes` (``load: float64[L, E]``; shares made optimal where the placement
    has shares). Returns the placement, the layers that split a group, and None, or the
    reason the survivors cannot keep the contract (then the placement is returned as is)."""
    S = topology.slots_per_gpu
    node = np.repeat(survivor_nodes(topology, slots), S)  # [P'] real node of each slot
    phy2log = placement.phy2log
    L, E = load.shape
    M = E // groups
    grp = phy2log // M
    bad = []
    for layer in range(L):
        on = np.zeros((groups, topology.num_nodes), dtype=bool)
        on[grp[layer], node] = True
        if (on.sum(1) > 1).any():
            bad.append(layer)
    if not bad:
        return placement, [], None
    _, node_gpus = np.unique(node[::S], return_counts=True)
    try:
        fixed = place_uneven_nodes(load[bad], node_gpus.tolist(), S, groups, 10_000)
    except InfeasibleError as err:  # the survivors cannot keep it: say so, keep the placement
        return placement, bad, str(err)
    out = phy2log.copy()
    out[bad] = fixed
    share = placement.replica_share
    if share is not None:
        share = share.copy()
        share[bad] = optimal_shares(load[bad], fixed, placement.topology)[0]
    return (
        Placement(out, E, placement.topology, share, placement.meta, placement.layer_ids),
        bad,
        None,
    )
