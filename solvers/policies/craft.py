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
from eplb.solvers.primitives.replica_budget import (
    balance_memory,
    expert_slots_per_gpu,
    layer_curves,
    split_budget,
)
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


def replica_plan(
    load: np.ndarray,
    topology: Topology,
    *,
    total_slots: int | None = None,
    redundancy: float | None = None,
    budget: int = 10_000,
) -> dict:
    """The per-layer split of a slot budget for ``load: float64[L, E]`` on ``topology`` (no
    failed GPUs; for `eplb advise`): ``phy2log: int64[L, P]`` (``-1`` unused),
    ``used_slots: int64[L]``, ``objective`` (sum over layers of the max GPU load, tokens: the
    MoE part of a step's time), ``uniform_objective`` (uniform replication at the same budget,
    same packing), ``bound`` (no split or packing within the budget does better),
    ``total_slots`` and ``expert_slots_per_gpu`` (routed experts one GPU keeps, all layers)."""
    load = np.asarray(load, dtype=np.float64)
    L, E = load.shape
    G, S = topology.num_gpus, topology.slots_per_gpu
    total = resolve_budget(L, E, topology.num_slots, total_slots, redundancy)
    curves = layer_curves(load, G, S, budget=budget)
    split = split_budget(load, curves, total)
    rows = np.arange(L)
    k = split["k"]
    phy2log = balance_memory(curves.phy2log[rows, k], S)
    return {
        "phy2log": phy2log,
        "used_slots": curves.used[rows, k],
        "objective": split["objective"],
        "uniform_objective": split["uniform_objective"],
        "bound": split["bound"],
        "source": split["source"],
        "total_slots": total,
        "expert_slots_per_gpu": expert_slots_per_gpu(phy2log, S),
    }


@register("craft")
def craft(
    load: np.ndarray,
    topology: Topology,
    *,
    total_slots: PositiveInt | None = None,
    redundancy: float | None = None,
    budget: NonNegInt = 10_000,
) -> Placement:
    """Per-layer replica budgets on ``load: float64[L, E]`` (module docstring, `replica_plan`).

    ``total_slots``: used expert slots summed over all layers (``>= L * E``; above ``L * P``
    every slot is used); or ``redundancy``: the fraction of the ``L * (P - E)`` redundant
    slots to use (default: all). ``budget``: swap iterations per packing.
    """
    plan = replica_plan(
        load, topology, total_slots=total_slots, redundancy=redundancy, budget=budget
    )
    info = {
        "policy": "craft",
        "total_slots": plan["total_slots"],
        "used_slots": plan["used_slots"].tolist(),
        "objective_sum": plan["objective"],
        "uniform_objective_sum": plan["uniform_objective"],
        "bound_sum": plan["bound"],
        "split_source": plan["source"],
        "expert_slots_per_gpu": plan["expert_slots_per_gpu"],
        "exact": "knapsack optimal for the per-layer greedy curves; bound_sum bounds every "
        "split and packing",
    }
    return Placement(plan["phy2log"], load.shape[1], topology, meta={"solver": info})
