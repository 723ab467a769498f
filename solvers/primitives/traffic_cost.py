"""The expected-RDMA proxy of the traffic-aware policies: with sources spread evenly over the
nodes and local-first dispatch, ``expected_rdma = sum_e load_e * (1 - nodes_holding(e) / N)``
picks per layer; objective ``max GPU load + rdma_weight * expected_rdma / G``.
docs/solvers.md, "Traffic-aware".
"""

from __future__ import annotations

import numpy as np

from eplb.errors import InputError
from eplb.placement import Placement
from eplb.solvers.primitives.validation import check_solver_load
from eplb.topology import Topology


def nodes_holding(phy2log: np.ndarray, num_experts: int, topology: Topology) -> np.ndarray:
    """``int64[L, E]``: distinct nodes holding a replica of each expert, ``phy2log: int64[L,
    P]`` (empty slots, -1, hold nothing)."""
    L, P = phy2log.shape
    N = topology.num_nodes
    held = np.zeros((L, num_experts, N), dtype=bool)
    layer = np.broadcast_to(np.arange(L)[:, None], (L, P))
    node = np.broadcast_to(topology.node_of_slot[None, :], (L, P))
    full = phy2log >= 0
    held[layer[full], phy2log[full], node[full]] = True
    return held.sum(-1)


def expected_rdma(placement_or_phy2log, load, topology: Topology | None = None) -> np.ndarray:
    """``float64[L]`` expected RDMA picks per layer (docs/solvers.md, "Traffic-aware").

    ``placement_or_phy2log``: a `Placement` or ``phy2log: int64[L, P]`` (then ``topology`` is
    required); ``load: float[L, E]`` tokens per expert.
    """
    if isinstance(placement_or_phy2log, Placement):
        phy2log = placement_or_phy2log.phy2log
        topology = topology or placement_or_phy2log.topology
    else:
        phy2log = np.asarray(placement_or_phy2log)
        if topology is None:
            raise InputError("expected_rdma needs a topology when given a phy2log table")
    load = check_solver_load(load)
    if phy2log.ndim != 2 or phy2log.shape[0] != load.shape[0]:
        raise InputError(f"phy2log has shape {phy2log.shape} but load has {load.shape[0]} layers")
    if phy2log.shape[1] != topology.num_slots:
        raise InputError(
            f"phy2log has {phy2log.shape[1]} slots but topology {topology} has {topology.num_slots}"
        )
    E = load.shape[1]
    if phy2log.min() < -1 or phy2log.max() >= E:
        raise InputError(f"phy2log holds expert ids outside 0..{E - 1} (or -1, an empty slot)")
    held = nodes_holding(phy2log, E, topology)
    return (load * (1.0 - held / topology.num_nodes)).sum(-1)


def rdma_from_node_count(node_count: np.ndarray, load: np.ndarray) -> np.ndarray:
    """``float64[X]`` expected RDMA picks of ``load: float[X, E]`` from ``node_count: int[X,
    E, N]`` replicas per node."""
    N = node_count.shape[2]
    return (load * (1.0 - (node_count > 0).sum(-1) / N)).sum(-1)


def traffic_objective(gpu_load: np.ndarray, rdma: np.ndarray, rdma_weight: float) -> np.ndarray:
    """``float64[L]`` max GPU load + ``rdma_weight * rdma / G`` for ``gpu_load: float[L, G]``
    and ``rdma: float[L]``."""
    G = gpu_load.shape[1]
    return gpu_load.max(1) + rdma_weight * rdma / G
