"""``repair``: rebalance by repairing the live placement (``previous=``) instead of solving afresh.

Single improving moves (and chain repair at two slots per GPU), all layers at once, until each
layer is within ``tolerance`` of a fresh ``greedy`` solve or ``migration_budget`` slots have
changed (`solvers.primitives.incremental`). Placed against ``previous`` (`solve` does not
relabel it). docs/solvers.md, "Incremental repair".
"""

from __future__ import annotations

import numpy as np

from eplb.errors import InputError
from eplb.placement import Placement
from eplb.solvers.primitives.even_split import place_even
from eplb.solvers.primitives.incremental import incremental
from eplb.solvers.primitives.validation import NonNegFloat, NonNegInt
from eplb.solvers.registry import register
from eplb.topology import Topology


@register("repair", needs_previous=True)
def repair(
    load: np.ndarray,
    topology: Topology,
    *,
    num_groups: int | None = None,
    previous: Placement | None = None,
    tolerance: NonNegFloat | None = None,
    migration_budget: NonNegInt | None = None,
    budget: NonNegInt = 10_000,
    chains: bool = True,
) -> Placement:
    """Repair ``previous`` for ``load: float64[L, E]`` (module docstring).

    ``tolerance``: relative slack against a fresh greedy solve (default 0 when only a budget
    is given; with neither, 0: repair until as good as fresh greedy). ``migration_budget``:
    max slots changed per layer. ``budget``: swap iterations of the fresh greedy and max
    repair steps.
    """
    if previous is None:
        raise InputError("repair needs previous= (the live placement to repair)")
    phy2log, _ = place_even(load, topology, num_groups, budget)
    fresh = Placement(phy2log, load.shape[1], topology)
    return incremental(
        load,
        topology,
        previous,
        fresh,
        tolerance=tolerance,
        migration_budget=migration_budget,
        max_steps=budget,
        chains=chains,
    )
