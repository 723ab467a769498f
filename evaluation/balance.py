"""Balance figures without pandas (what ``eplb solve`` prints, kept light for start-up):
the one bound every table uses (`BOUND_NAME`), the group bound where the group-to-node contract
can hold, per-layer load columns and their summary. `metrics` builds its frames on these.
"""

from __future__ import annotations

import numpy as np

from eplb.errors import EplbError
from eplb.solvers.analysis.bounds import lower_bound
from eplb.topology import Topology

# the one bound every table prints (solve, evaluate, compare): closed form, no LP (the LP
# relaxation is tighter at 2 slots per GPU but takes ~1 s per layer)
BOUND_NAME = "closed-form lower bound"


def closed_bound(load: np.ndarray, topology: Topology, num_groups: int | None) -> np.ndarray:
    """`layer_bound` on checked arguments (`BOUND_NAME`: closed form, ``lp=False``)."""
    return np.asarray(lower_bound(load, topology, num_groups=num_groups, lp=False), np.float64)


def group_layer_bound(load: np.ndarray, topology: Topology,
                      num_groups: int | None) -> np.ndarray | None:
    """``float64[L]`` bound for placements keeping each of ``num_groups`` expert groups on one
    node (DeepSeek's hierarchical contract), or None where that contract cannot hold (no
    groups, groups that do not divide the experts or are not a multiple of the nodes, a group
    larger than a node)."""
    N = topology.num_nodes
    if num_groups is None or N < 2 or load.shape[1] % num_groups or num_groups % N:
        return None
    try:
        return np.asarray(lower_bound(load, topology, num_groups=num_groups, hierarchical=True,
                                      lp=False), np.float64)
    except EplbError:
        return None


def ratio(num: np.ndarray, den: np.ndarray, idle: float) -> np.ndarray:
    return np.divide(num, den, out=np.full(np.shape(num), idle, dtype=np.float64), where=den > 0)


def load_columns(gpu: np.ndarray, topology: Topology) -> dict[str, np.ndarray]:
    """Per-row columns from ``gpu: float[..., G]``; means and minima run over the GPUs (and
    nodes) that have not failed (``topology.failed_gpus``)."""
    node = gpu.reshape(*gpu.shape[:-1], topology.num_nodes, topology.gpus_per_node).sum(-1)
    if topology.failed_gpus:
        alive = np.ones(topology.num_gpus, dtype=bool)
        alive[list(topology.failed_gpus)] = False
        node = node[..., alive.reshape(topology.num_nodes, -1).any(-1)]
        gpu = gpu[..., alive]
    mx, mean = gpu.max(-1), gpu.mean(-1)
    nmx, nmean = node.max(-1), node.mean(-1)
    return {
        "picks": gpu.sum(-1),  # expert picks through the layer (tokens x top-k)
        "gpu_max": mx,
        "gpu_mean": mean,
        "gpu_min": gpu.min(-1),
        "balancedness": ratio(mean, mx, 1.0),
        "max_over_mean": ratio(mx, mean, 1.0),
        "imbalance": ratio(mx, mean, 1.0) - 1.0,
        "node_max_over_mean": ratio(nmx, nmean, 1.0),
        "node_balancedness": ratio(nmean, nmx, 1.0),
    }


def balance_summary(gpu: np.ndarray, topology: Topology, bound: np.ndarray | None = None,
                    group_bound: np.ndarray | None = None) -> dict[str, float]:
    """`metrics.summarize`'s figures from ``gpu: float64[L, G]`` (and the bounds ``float64[L]``)
    without building a frame."""
    c = load_columns(gpu, topology)
    out = {
        "layers": float(len(gpu)),
        "step_max_over_mean": float(ratio(np.array(c["gpu_max"].sum()),
                                           np.array(c["gpu_mean"].sum()), 1.0)),
        "balancedness_mean": float(c["balancedness"].mean()),
        "balancedness_min": float(c["balancedness"].min()),
        "max_over_mean_mean": float(c["max_over_mean"].mean()),
        "max_over_mean_worst": float(c["max_over_mean"].max()),
        "imbalance_mean": float(c["imbalance"].mean()),
        "node_max_over_mean_mean": float(c["node_max_over_mean"].mean()),
    }
    for key, b in (("max_over_bound", bound), ("max_over_group_bound", group_bound)):
        if b is not None:
            r = bound_ratio(c["gpu_max"], b)
            out[f"{key}_mean"], out[f"{key}_worst"] = float(r.mean()), float(r.max())
    return out


def bound_ratio(gpu_max: np.ndarray, bound: np.ndarray) -> np.ndarray:
    """``gpu_max / bound`` per layer: NaN without a bound, 1 for an idle layer."""
    b = np.asarray(bound, np.float64)
    out = np.divide(gpu_max, b, out=np.full_like(b, np.nan), where=np.isfinite(b) & (b > 0))
    out[np.isfinite(b) & (b <= 0) & (np.asarray(gpu_max) <= 0)] = 1.0
    return out
