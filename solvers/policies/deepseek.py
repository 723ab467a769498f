"""``deepseek``: DeepSeek's EPLB ``rebalance_experts`` (`solvers.primitives.deepseek_kernels`).

Hierarchical when ``num_groups % num_nodes == 0``, else global, whatever ``num_groups`` (it
need not divide the experts then: registered with ``group_fallback``). Identical to DeepSeek's
output under the stable tie order; docs/solvers.md, "deepseek: identical to DeepSeek's EPLB".
"""

from __future__ import annotations

import numpy as np

from eplb.placement import Placement
from eplb.solvers.primitives.deepseek_kernels import placement_table
from eplb.solvers.registry import register
from eplb.topology import Topology


@register(
    "deepseek",
    group_fallback=True,
    guarantees=lambda o, topology, groups: {"group_contract"}
    if groups and groups % topology.num_nodes == 0 and not topology.failed_gpus
    else set(),
)
def deepseek(load: np.ndarray, topology: Topology, *, num_groups: int | None = None) -> Placement:
    """DeepSeek EPLB on ``load: float64[L, E]``; hierarchical iff ``num_groups % N == 0``
    (``None`` or any other count: global). Deterministic and fast: no seed, no time limit;
    ``previous=`` is applied by `solvers.solve` (relabeling)."""
    phy2log, hierarchical = placement_table(load, topology, num_groups)
    info = {"policy": "hierarchical" if hierarchical else "global"}
    return Placement(phy2log, load.shape[1], topology, meta={"solver": info})
