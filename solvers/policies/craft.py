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
from eplb.solvers.primitives.layout import max_load
from eplb.solvers.primitives.relabel import relabel
from eplb.solvers.primitives.replica_budget import (
    Curves,
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
    max_gpu_slots: int | None = None,
    budget: int = 10_000,
    curves: Curves | None = None,
    num_groups: int | None = None,
) -> dict:
    """The per-layer split of a slot budget for ``load: float64[L, E]`` on ``topology`` (no
    failed GPUs; for `eplb advise`): ``phy2log: int64[L, P]`` (``-1`` unused),
    ``used_slots: int64[L]``, ``objective`` (sum over layers of the max GPU load, tokens: the
    MoE part of a step's time), ``uniform_objective`` (uniform replication at the same budget,
    same packing), ``bound`` (no split or packing within the budget does better),
    ``total_slots`` (the budget used), ``expert_slots_per_gpu`` (routed experts the
    fullest GPU keeps, all layers) and ``source`` (``knapsack``, ``uniform``, ``greedy``:
    `greedy`'s placement on fewer slots per GPU, or ``minimal``: one replica per expert).

    Never worse than `greedy` on the same slots: with every slot used, per layer; with a
    budget of ``L * G * S'`` slots or ``max_gpu_slots = L * S'``, in the summed max GPU
    loads against `greedy` on ``S'`` slots per GPU (``num_groups``: `greedy`'s, for its
    DeepSeek candidate). ``max_gpu_slots``: at most that many routed experts on one GPU
    summed over the layers (its expert weight memory); the budget shrinks to the largest
    that fits (bisection on the memory-balanced layouts, `balance_memory`), `greedy`'s
    layout on ``max_gpu_slots // L`` slots per GPU and, where neither fits, one replica per
    expert spread evenly are candidates: refused (`InputError`) only where no layout fits,
    ``max_gpu_slots * G < L * E``. ``curves``: `layer_curves` of ``load`` already computed
    (several budgets on one load)."""
    load = np.asarray(load, dtype=np.float64)
    L, E = load.shape
    G, S = topology.num_gpus, topology.slots_per_gpu
    total = resolve_budget(L, E, topology.num_slots, total_slots, redundancy)
    if curves is None:
        curves = layer_curves(load, G, S, budget=budget, topology=topology,
                              num_groups=num_groups)
    rows = np.arange(L)

    def attempt(t: int) -> dict:
        split = split_budget(load, curves, t)
        phy2log = balance_memory(curves.phy2log[rows, split["k"]], S)
        return _plan(split, phy2log, curves.used[rows, split["k"]], t, S)

    plan = attempt(total)
    if max_gpu_slots is None or plan["expert_slots_per_gpu"] <= max_gpu_slots:
        return plan
    return _within_memory(load, curves, topology, total, int(max_gpu_slots), attempt)


def _plan(split: dict, phy2log: np.ndarray, used: np.ndarray, total: int, S: int) -> dict:
    """`replica_plan`'s result for a split of ``total`` slots laid out as ``phy2log``."""
    return {
        "phy2log": phy2log,
        "used_slots": used,
        "objective": split["objective"],
        "uniform_objective": split["uniform_objective"],
        "bound": split["bound"],
        "source": split["source"],
        "total_slots": total,
        "expert_slots_per_gpu": expert_slots_per_gpu(phy2log, S),
    }


def _within_memory(load, curves: Curves, topology: Topology, total: int, cap: int,
                   attempt) -> dict:
    """The best plan whose fullest GPU keeps at most ``cap`` experts over the layers: the
    largest fitting budget (bisection), `greedy` on ``cap // L`` slots per GPU, or one
    replica per expert spread evenly (`minimal_layout`)."""
    L, E = load.shape
    G, S = topology.num_gpus, topology.slots_per_gpu
    need = -(-L * E // G)
    if cap < need:
        raise InputError(
            f"craft: max_gpu_slots {cap} cannot hold the {L * E} slots one replica of every "
            f"expert needs on {G} GPUs (at least {need} per GPU); raise max_gpu_slots"
        )
    plans = []
    lo, hi = L * E, min(total, G * cap)  # lo: no redundant slot; hi: an upper bound
    best = attempt(lo)
    if best["expert_slots_per_gpu"] <= cap:
        while lo < hi:  # the largest budget whose layout fits (the last fitting one kept)
            mid = (lo + hi + 1) // 2
            got = attempt(mid)
            if got["expert_slots_per_gpu"] <= cap:
                lo, best = mid, got
            else:
                hi = mid - 1
        plans.append(best)
    s = min(S, cap // L, total // (L * G))
    if s in curves.greedy:  # greedy's own placement on s slots per GPU: L * s per GPU
        plans.append(_fixed_plan(load, curves, curves.greedy[s], "greedy", cap, S))
    if not plans:
        plans.append(_fixed_plan(load, curves, minimal_layout(load, G, S), "minimal", cap, S))
    return min(plans, key=lambda p: p["objective"])  # ties: the first


def _fixed_plan(
    load, curves: Curves, phy2log: np.ndarray, source: str, cap: int, S: int
) -> dict:
    """A plan for a layout ``phy2log: int64[L, P]`` using as many slots in every layer (a
    uniform split itself); bound at its budget, ``uniform_objective`` the better of it and
    the packer's uniform split at that budget where that fits ``cap``."""
    L, E = load.shape
    used = (phy2log >= 0).sum(1)
    total = int(used.sum())
    split = split_budget(load, curves, total)
    objective = float(max_load(load, phy2log, S).sum())
    uniform = objective
    ku = np.full(L, min((total - L * E) // L, curves.slots.size - 1))
    if expert_slots_per_gpu(balance_memory(curves.phy2log[np.arange(L), ku], S), S) <= cap:
        uniform = min(uniform, split["uniform_objective"])
    split = {**split, "objective": objective, "uniform_objective": uniform, "source": source}
    return _plan(split, phy2log, used, total, S)


def minimal_layout(load: np.ndarray, num_gpus: int, slots_per_gpu: int) -> np.ndarray:
    """``int64[L, P]``: one replica of each expert of ``load: float64[L, E]``, the ``E`` used
    slots of each layer spread over the GPUs in turn (``E // G`` or one more per GPU, the
    GPUs taking the one more rotating over the layers, so every GPU keeps
    ``ceil(L * E / G)`` experts at most), experts placed by LPT within those counts."""
    L, E = load.shape
    G, S = num_gpus, slots_per_gpu
    out = np.full((L, G, S), -1, dtype=np.int64)
    start = 0
    for layer in range(L):
        quota = np.full(G, E // G, dtype=np.int64)
        quota[(start + np.arange(E % G)) % G] += 1
        start = (start + E % G) % G
        gpu = np.zeros(G)
        fill = np.zeros(G, dtype=np.int64)
        for e in np.argsort(-load[layer], kind="stable"):
            g = int(np.argmin(np.where(fill < quota, gpu, np.inf)))
            out[layer, g, fill[g]] = e
            fill[g] += 1
            gpu[g] += load[layer, e]
    return out.reshape(L, G * S)


@register("craft")
def craft(
    load: np.ndarray,
    topology: Topology,
    *,
    num_groups: int | None = None,
    previous: Placement | None = None,
    total_slots: PositiveInt | None = None,
    redundancy: float | None = None,
    max_gpu_slots: PositiveInt | None = None,
    budget: NonNegInt = 10_000,
) -> Placement:
    """Per-layer replica budgets on ``load: float64[L, E]`` (module docstring, `replica_plan`).

    ``total_slots``: used expert slots summed over all layers (``>= L * E``; above ``L * P``
    every slot is used); or ``redundancy``: the fraction of the ``L * (P - E)`` redundant
    slots to use (default: all). ``max_gpu_slots``: routed experts one GPU may keep summed
    over the layers (its expert weight memory; the budget shrinks to fit). ``budget``: swap
    iterations per packing. ``previous``: the live placement; GPUs are relabeled to keep its
    replicas (`relabel`), a GPU only taking the place of one with the same used-slot count in
    each layer, so every GPU's expert memory stays as balanced (``meta["solver"]["relabeled"]``).
    """
    plan = replica_plan(
        load, topology, total_slots=total_slots, redundancy=redundancy,
        max_gpu_slots=max_gpu_slots, budget=budget, num_groups=num_groups,
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
        "max_gpu_slots": max_gpu_slots,
        "exact": "knapsack optimal for the per-layer greedy curves; bound_sum bounds every "
        "split and packing",
    }
    if previous is not None:
        info["relabeled"] = True
    out = Placement(plan["phy2log"], load.shape[1], topology, meta={"solver": info})
    if previous is not None:
        L, S = out.num_layers, topology.slots_per_gpu
        used = (out.phy2log.reshape(L, topology.num_gpus, S) >= 0).sum(2)
        out = relabel(out, previous, classes=used)
    return out
