"""``craft``: per-layer replica budgets under one slot budget (after CRAFT, arXiv 2603.28768,
which reports 1.14x on average over uniform replication): hot layers get more redundant
replicas, flat layers fewer, the slots a layer does not use left empty (``-1``). Per layer the
max GPU load is measured for every used-slot count (`greedy`'s water-filling, LPT and swap
search: `solvers.primitives.replica_budget.layer_curves`), then the budget is split as a
multiple-choice knapsack minimising the sum over layers of the layer's max GPU load (the MoE
part of a step's time). The split is optimal for those curves, not over every packing; the
analytic lower bounds give ``meta["solver"]["bound"]``. docs/solvers.md, "craft".
"""

from __future__ import annotations

import numpy as np

from eplb.errors import InputError
from eplb.placement import Placement
from eplb.solvers.primitives.replica_budget import layer_curves, split_budget
from eplb.solvers.primitives.validation import NonNegInt, PositiveInt
from eplb.solvers.registry import register
from eplb.topology import Topology


def resolve_budget(
    num_layers: int,
    num_experts: int,
    num_slots: int,
    total_slots: int | None,
    redundancy: float | None,
) -> int:
    """Used slots over all layers: ``total_slots`` as given (capped at ``L * P``), else
    ``L * E`` plus ``redundancy`` (0..1) of the ``L * (P - E)`` redundant slots (default 1)."""
    L, E, P = num_layers, num_experts, num_slots
    if total_slots is not None and redundancy is not None:
        raise InputError("craft: give total_slots or redundancy, not both")
    if total_slots is not None:
        return min(int(total_slots), L * P)
    f = 1.0 if redundancy is None else float(redundancy)
    if not 0.0 <= f <= 1.0:
        raise InputError(f"craft: option redundancy must be in [0, 1], got {redundancy!r}")
    return L * E + int(np.floor(f * L * (P - E) + 1e-9))


@register("craft")
def craft(
    load: np.ndarray,
    topology: Topology,
    *,
    total_slots: PositiveInt | None = None,
    redundancy: float | None = None,
    budget: NonNegInt = 10_000,
) -> Placement:
    """Per-layer replica budgets on ``load: float64[L, E]`` (module docstring).

    ``total_slots``: used expert slots summed over all layers (``>= L * E``; above ``L * P``
    every slot is used); or ``redundancy``: the fraction of the ``L * (P - E)`` redundant
    slots to use (default: all). ``budget``: swap iterations per packing.
    """
    L, E = load.shape
    G, S = topology.num_gpus, topology.slots_per_gpu
    total = resolve_budget(L, E, topology.num_slots, total_slots, redundancy)
    curves = layer_curves(load, G, S, budget=budget)
    split = split_budget(load, curves, total)
    rows = np.arange(L)
    k = split["k"]
    phy2log = curves.phy2log[rows, k]
    info = {
        "policy": "craft",
        "total_slots": total,
        "used_slots": curves.used[rows, k].tolist(),
        "objective_sum": split["objective"],
        "uniform_objective_sum": split["uniform_objective"],
        "bound_sum": split["bound"],
        "split_source": split["source"],
        "exact": "knapsack optimal for the per-layer greedy curves; bound_sum bounds every "
        "split and packing",
    }
    return Placement(phy2log, E, topology, meta={"solver": info})
