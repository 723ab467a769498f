"""``deepseek``: DeepSeek's EPLB, bit-exact (`solvers.primitives.deepseek_kernels`).

Same output as DeepSeek's ``rebalance_experts(weight, num_replicas, num_groups, num_nodes,
num_gpus)`` with the tie rule pinned: descending sorts are stable (equal weights keep index
order), argmax takes the lowest index, the lightest non-full pack takes the lowest index.
Arithmetic is float32 as in DeepSeek. Policy: hierarchical with ``num_groups`` groups when
``num_groups % num_nodes == 0``, else the same procedure with one group on one node
("global"). Vectorised across layers.
"""

from __future__ import annotations

import numpy as np

from eplb.placement import Placement
from eplb.solvers.primitives.deepseek_kernels import placement_table
from eplb.solvers.registry import register
from eplb.topology import Topology


@register("deepseek")
def deepseek(load: np.ndarray, topology: Topology, *, num_groups: int | None = None) -> Placement:
    """DeepSeek EPLB on ``load: float64[L, E]``; hierarchical iff ``num_groups % N == 0``
    (``None``: global). Deterministic and fast: no seed, no time limit; ``previous=`` is
    applied by `solvers.solve` (relabeling)."""
    phy2log, hierarchical = placement_table(load, topology, num_groups)
    info = {"policy": "hierarchical" if hierarchical else "global"}
    return Placement(phy2log, load.shape[1], topology, meta={"solver": info})
