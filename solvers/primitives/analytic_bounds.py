"""Closed-form lower bounds on the largest GPU load of a cluster (or of one node holding a set
of groups): the average, the largest replica under water-filling, experts that must stay
single. `solvers.analysis.bounds.lower_bound` combines them (with the LP and the group
contract); `hierarchical`'s group assignment minimises them. docs/solvers.md, "Lower bounds".
"""

from __future__ import annotations

from itertools import combinations

import numpy as np

from eplb.solvers.primitives.replication import waterfill
from eplb.topology import Topology

EXACT_GROUPS = 10  # exact set-partition search up to this many groups


def average_bound(load: np.ndarray, num_gpus: int) -> np.ndarray:
    """``float64[X]`` total / G for ``load: float[X, E]``."""
    return load.sum(1) / num_gpus


def replica_bound(load: np.ndarray, num_gpus: int, num_slots, *, present=None) -> np.ndarray:
    """``float64[X]`` smallest possible largest per-replica load of ``load: float[X, E]``
    (water-filling, cap ``G``; ``present: bool[X, E]`` experts that exist)."""
    counts = waterfill(load, num_slots, num_gpus, present=present)
    per = np.divide(load, counts, out=np.zeros_like(load), where=counts > 0)
    return per.max(1)


def single_bound(load: np.ndarray, num_gpus: int, num_slots: int) -> np.ndarray:
    """``float64[X]`` pigeonhole bound of ``load: float[X, E]`` from experts that must stay
    single (docs/solvers.md, "Lower bounds")."""
    X, E = load.shape
    R = num_slots - E
    if R >= E:
        return np.zeros(X)
    tail = -np.sort(-load, axis=1)[:, max(R, 0) :]  # w_(R+1), w_(R+2), ... descending
    n = np.arange(1, tail.shape[1] + 1)
    q = -(-n // num_gpus)
    cs = np.concatenate([np.zeros((X, 1)), np.cumsum(tail, axis=1)], axis=1)
    vals = cs[:, n] - cs[:, n - q]
    return vals.max(1)


def flat_bound(load: np.ndarray, num_gpus: int, slots_per_gpu: int) -> np.ndarray:
    """``float64[X]`` max of the average, largest-replica and single-expert bounds of ``load:
    float[X, E]``."""
    P = num_gpus * slots_per_gpu
    return np.maximum.reduce(
        [
            average_bound(load, num_gpus),
            replica_bound(load, num_gpus, P),
            single_bound(load, num_gpus, P),
        ]
    )


def subset_bounds(load: np.ndarray, topology: Topology, num_groups: int, *, weighted=False):
    """``float64[2**num_groups, X]`` bound of one node holding each subset of groups of
    ``load: float[X, E]`` (``inf`` when the subset does not fit in a node's slots or is
    empty).

    Only for ``num_groups <= EXACT_GROUPS``.
    """
    X, E = load.shape
    M = E // num_groups
    gpn, S = topology.gpus_per_node, topology.slots_per_gpu
    node_slots = gpn * S
    out = np.full((1 << num_groups, X), np.inf)
    gl = load.reshape(X, num_groups, M)
    for k in range(1, num_groups + 1):
        if k * M > node_slots:
            break
        subsets = list(combinations(range(num_groups), k))
        masks = np.array([sum(1 << g for g in c) for c in subsets])
        idx = np.array(subsets)  # [C, k]
        w = gl[:, idx, :].reshape(X, len(subsets), k * M)  # [X, C, kM]
        rows = w.transpose(1, 0, 2).reshape(-1, k * M)  # [C*X, kM]
        if weighted:
            b = average_bound(rows, gpn)
        else:
            b = flat_bound(rows, gpn, S)
        out[masks] = b.reshape(len(subsets), X)
    return out
