"""Replicas moved between two placements of one problem: what a rebalance costs.

`replicas_moved(old, new)` counts, per layer, the replicas a GPU must load because it did not
hold that expert before (per GPU, the multiset difference new minus old); reordering slots
inside a GPU is not a move. Keeping moves low: `solvers.primitives.relabel`.
"""

from __future__ import annotations

import numpy as np

from eplb.placement import Placement
from eplb.solvers.primitives.layout import moved
from eplb.solvers.primitives.relabel import check_pair


def replicas_moved(old: Placement, new: Placement) -> np.ndarray:
    """``int64[L]``: replicas of ``new`` loaded onto a GPU that did not hold them in ``old``."""
    check_pair(old, new)
    return moved(old.phy2log, new.phy2log, new.num_experts, new.topology.slots_per_gpu)
