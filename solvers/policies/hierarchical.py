"""``hierarchical``: DeepSeek's group-to-node contract with a better choice of groups and budgets.

Every replica of an expert stays on its group's node (group-limited routing stays node-limited),
but groups go to nodes by the smallest largest node bound (a node's redundancy follows its heat)
and each node runs the ``greedy`` pipeline; exact when small; never worse than ``deepseek``
under the contract (`solvers.primitives.group_placement`; docs/solvers.md, "hierarchical").
"""

from __future__ import annotations

import numpy as np

from eplb.placement import Placement
from eplb.solvers.primitives.group_placement import (
    best_hierarchical,
    contract_fallback,
    global_fallback,
)
from eplb.solvers.primitives.validation import NonNegInt, check_groups
from eplb.solvers.registry import register
from eplb.topology import Topology


@register("hierarchical", guarantees={"group_contract"}, needs_groups=True)
def hierarchical(
    load: np.ndarray,
    topology: Topology,
    *,
    num_groups: int | None = None,
    budget: NonNegInt = 10_000,
) -> Placement:
    """Group-to-node placement for ``load: float64[L, E]`` (module docstring).

    ``num_groups`` is required (``E % num_groups == 0``, at least one group per node).
    ``budget``: swap iterations of the per-node greedy. Deterministic. ``previous=`` is
    applied by `solvers.solve` (relabeling whole nodes keeps the contract).
    """
    groups = check_groups(num_groups, load.shape[1], topology.num_nodes)
    why = contract_fallback(load.shape[1], topology, groups)
    if why is not None:  # DeepSeek's rule: the global policy, said so
        phy2log, info = global_fallback(load, topology, budget, why)
    else:
        phy2log, info = best_hierarchical(load, topology, groups, budget)
    return Placement(phy2log, load.shape[1], topology, meta={"solver": info})

