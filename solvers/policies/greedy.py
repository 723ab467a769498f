"""``greedy``: global even-split placement that beats DeepSeek's greedy chain.

Water-filling counts capped at ``G`` replicas, LPT without two replicas of an expert on one GPU,
swap search; exact sorted pairing at two slots per GPU (`solvers.primitives.even_split`).
DeepSeek's own placement is a candidate per layer, so it is never worse than ``deepseek``
(``meta["solver"]["deepseek_layers"]``). docs/solvers.md, "greedy".
"""

from __future__ import annotations

import numpy as np

from eplb.placement import Placement
from eplb.solvers.primitives.even_split import place_even
from eplb.solvers.primitives.layout import duplicates
from eplb.solvers.primitives.validation import NonNegInt
from eplb.solvers.registry import register
from eplb.topology import Topology


@register("greedy")
def greedy(
    load: np.ndarray,
    topology: Topology,
    *,
    num_groups: int | None = None,
    budget: NonNegInt = 10_000,
) -> Placement:
    """Global greedy on ``load: float64[L, E]`` (module docstring).

    ``budget``: max swap iterations. ``num_groups`` only adds DeepSeek's hierarchical
    placement as a candidate (the result is global either way).
    """
    phy2log, taken = place_even(load, topology, num_groups, budget)
    info = {
        "policy": "global",
        "deepseek_layers": taken.tolist(),
        "duplicates": int(duplicates(phy2log, topology.slots_per_gpu).sum()),
    }
    return Placement(phy2log, load.shape[1], topology, meta={"solver": info})
