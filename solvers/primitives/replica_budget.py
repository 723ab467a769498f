"""Per-layer replica budgets under one slot budget (after CRAFT, arXiv 2603.28768): for each
layer the max GPU load it reaches with ``r`` used slots (``E <= r <= P``; the other ``P - r``
slots left empty, ``-1``), and the split of a total slot budget over the layers as a
multiple-choice knapsack (a dynamic programme over the budget, exact for the curves it is
given). docs/solvers.md, "craft".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from eplb.errors import InputError
from eplb.solvers.primitives.analytic_bounds import average_bound, replica_bound, single_bound
from eplb.solvers.primitives.even_split import place_even
from eplb.solvers.primitives.layout import max_load
from eplb.solvers.primitives.packing import improve, lpt
from eplb.solvers.primitives.replication import default_cap, waterfill
from eplb.topology import Topology

QUANT = 2.0**32  # curve values are compared on a grid of 2**-32 of the largest expert load


@dataclass(frozen=True)
class Curves:
    """What each layer reaches per number of used slots ``slots[k] = E + k``.

    - ``value: float64[L, K]``: max GPU load of the packing kept for ``k`` (the best packing
      found with at most ``slots[k]`` used slots: a prefix minimum over ``k``);
    - ``used: int64[L, K]``: slots that packing uses (``<= slots[k]``);
    - ``bound: float64[L, K]``: a lower bound on the max GPU load of any placement of the
      layer with at most ``slots[k]`` used slots (analytic bounds, prefix minimum);
    - ``phy2log: int64[L, K, P]``: the packings (``-1`` for empty slots);
    - ``greedy``: ``S' -> int64[L, P]``, `greedy`'s placement on ``S'`` slots per GPU (its
      ``place_even``) for every ``S'`` that holds the experts, each GPU's ``S'`` replicas in
      its first slots and the rest empty: every GPU keeps ``S'`` experts per layer.
    """

    slots: np.ndarray
    value: np.ndarray
    used: np.ndarray
    bound: np.ndarray
    phy2log: np.ndarray
    greedy: dict[int, np.ndarray] = field(default_factory=dict)


def greedy_layouts(
    load: np.ndarray, topology: Topology, num_groups: int | None = None, budget: int = 10_000
) -> dict[int, np.ndarray]:
    """``S' -> int64[L, P]``: `greedy`'s placement of ``load: float64[L, E]`` on ``S'`` slots
    per GPU of ``topology`` (the same nodes and GPUs), for every ``S'`` from the fewest that
    hold the experts to ``S``, embedded in ``topology``'s slots (each GPU's first ``S'``
    slots, the others ``-1``)."""
    L, E = load.shape
    G, S = topology.num_gpus, topology.slots_per_gpu
    out = {}
    for s in range(max(1, -(-E // G)), S + 1):
        small = Topology(topology.num_nodes, topology.gpus_per_node, s)
        phy, _ = place_even(load, small, num_groups, budget)
        emb = np.full((L, G, S), -1, dtype=np.int64)
        emb[:, :, :s] = phy.reshape(L, G, s)
        out[s] = emb.reshape(L, G * S)
    return out


def layer_curves(
    load: np.ndarray,
    num_gpus: int,
    slots_per_gpu: int,
    *,
    budget: int = 10_000,
    topology: Topology | None = None,
    num_groups: int | None = None,
) -> Curves:
    """`Curves` of ``load: float64[L, E]`` on ``num_gpus`` x ``slots_per_gpu`` (``P = G * S
    >= E``): per used-slot count ``r`` water-filled replica counts (capped as `greedy`), LPT
    and swap search (``budget`` iterations) with the ``P - r`` unused slots as zero-load
    placeholders, which become ``-1``; at ``r = G * S'`` also `greedy`'s own placement on
    ``S'`` slots per GPU (`greedy_layouts` on ``topology``, default one node, with
    ``num_groups``), kept where it is better, so no column is worse than `greedy` on as many
    slots."""
    L, E = load.shape
    G, S = num_gpus, slots_per_gpu
    P = G * S
    slots = np.arange(E, P + 1, dtype=np.int64)
    K = slots.size
    rows = np.repeat(load, K, axis=0)  # [L*K, E], layer-major
    r = np.tile(slots, L)
    counts = waterfill(rows, r, default_cap(E, G, S))
    empty = P - r  # placeholders: distinct zero-load "experts" E.., one slot each
    pad = (np.arange(P - E)[None, :] < empty[:, None]).astype(np.int64)
    packed = lpt(np.hstack([rows, np.zeros((L * K, P - E))]), np.hstack([counts, pad]), G, S)
    improve(packed, budget=budget)
    phy = packed.phy2log().copy()
    phy[phy >= E] = -1
    value = max_load(rows, phy, S).reshape(L, K)  # as the greedy layouts' below: comparable
    phy = phy.reshape(L, K, P)
    greedy = greedy_layouts(load, topology or Topology(1, G, S), num_groups, budget)
    for s, emb in greedy.items():
        k = G * s - E
        val = max_load(load, emb, S)
        take = val < value[:, k]
        phy[take, k] = emb[take]
        value[take, k] = val[take]
    bound = flat_bound_rows(rows, G, r).reshape(L, K)
    # at most r slots: the best of every r' <= r (prefix minimum; ties keep the smaller r')
    best = np.zeros((L, K), dtype=np.int64)
    for k in range(1, K):
        prev = best[:, k - 1]
        keep = value[np.arange(L), prev] <= value[:, k]
        best[:, k] = np.where(keep, prev, k)
    idx = np.arange(L)[:, None]
    return Curves(
        slots=slots,
        value=value[idx, best],
        used=slots[best],
        bound=np.minimum.accumulate(bound, axis=1),
        phy2log=phy[idx, best],
        greedy=greedy,
    )


def flat_bound_rows(load: np.ndarray, num_gpus: int, used: np.ndarray) -> np.ndarray:
    """``float64[X]`` max of the average, largest-replica and single-expert bounds of each row
    of ``load: float[X, E]`` with ``used: int[X]`` slots (docs/solvers.md, "Lower bounds")."""
    out = np.empty(load.shape[0])
    for r in np.unique(used):
        sel = used == r
        out[sel] = np.maximum.reduce(
            [
                average_bound(load[sel], num_gpus),
                replica_bound(load[sel], num_gpus, int(r)),
                single_bound(load[sel], num_gpus, int(r)),
            ]
        )
    return out


def knapsack(cost: np.ndarray, extra: np.ndarray, budget: int) -> tuple[np.ndarray, int]:
    """Multiple-choice knapsack by dynamic programming over the budget: pick one column
    ``k[l]`` per row of ``cost: int64[L, K]`` (weights ``extra: int64[K]``, ascending, ``extra[0]
    == 0``) with ``sum extra[k] <= budget`` minimising ``sum cost[l, k[l]]``. Exact for the
    integer costs; ties go to the smaller weight in the lowest layer first. Returns ``(k:
    int64[L], total cost)``. O(L * K * budget)."""
    L, K = cost.shape
    B = int(min(max(budget, 0), int(extra[-1]) * L))
    big = np.iinfo(np.int64).max // 4
    best = np.zeros(B + 1, dtype=np.int64)  # best[b]: min cost of the layers so far, weight <= b
    pick = np.zeros((L, B + 1), dtype=np.int64)
    for layer in range(L):
        new = np.full(B + 1, big, dtype=np.int64)
        for k in range(K):
            w = int(extra[k])
            if w > B:
                break
            cand = np.full(B + 1, big, dtype=np.int64)
            cand[w:] = best[: B + 1 - w] + cost[layer, k]
            take = cand < new  # strict: the smaller weight wins ties
            new[take] = cand[take]
            pick[layer, take] = k
        best = new
    k = np.empty(L, dtype=np.int64)
    b = B
    for layer in range(L - 1, -1, -1):
        k[layer] = pick[layer, b]
        b -= int(extra[k[layer]])
    return k, int(best[B])


def quantise(values: np.ndarray, scale: float, *, down: bool = False) -> np.ndarray:
    """``int64`` of ``values / scale`` on a grid of ``1 / QUANT`` (rounded to nearest, or down
    for bounds)."""
    q = values / scale * QUANT
    return (np.floor(q) if down else np.rint(q)).astype(np.int64)


def split_budget(load: np.ndarray, curves: Curves, total_slots: int) -> dict:
    """Split ``total_slots`` used slots over the layers of ``load: float64[L, E]`` with
    ``curves`` (`layer_curves`): the knapsack on the curves (quantised to ``2**-32`` of the
    largest expert load), then the uniform split (``total_slots // L`` each, as many as fit)
    if it is strictly better on the real curve values, so the result is never worse than
    uniform replication at the same budget. Returns ``k: int64[L]`` (curve columns),
    ``objective`` (sum of per-layer max GPU load, tokens), ``uniform_objective``, ``bound``
    (a lower bound on that sum over every split and placement within the budget),
    ``source`` (``"knapsack"`` or ``"uniform"``)."""
    L, E = load.shape
    extra = curves.slots - E
    if total_slots < L * E:
        raise InputError(
            f"total_slots {total_slots} cannot hold {E} experts in each of {L} layers "
            f"(need >= {L * E})"
        )
    spare = total_slots - L * E
    scale = float(load.max())
    if scale <= 0:
        scale = 1.0
    k, _ = knapsack(quantise(curves.value, scale), extra, spare)
    ku = np.full(L, min(spare // L, int(extra[-1])), dtype=np.int64)
    rows = np.arange(L)
    objective = float(curves.value[rows, k].sum())
    uniform = float(curves.value[rows, ku].sum())
    source = "knapsack"
    if uniform < objective:
        k, objective, source = ku, uniform, "uniform"
    kb, qb = knapsack(quantise(curves.bound, scale, down=True), extra, spare)
    bound = float(qb) / QUANT * scale * (1 - 1e-12)
    bound = min(bound, float(curves.bound[rows, kb].sum()))
    return {
        "k": k,
        "objective": objective,
        "uniform_objective": uniform,
        "bound": bound,
        "source": source,
    }


def balance_memory(phy2log: np.ndarray, slots_per_gpu: int) -> np.ndarray:
    """``int64[L, P]`` ``phy2log`` with each layer's GPUs permuted (their contents kept, so
    every layer's GPU loads are the same multiset) so that the used slots summed over the
    layers spread evenly over the GPUs. The largest per-GPU total is the expert weight memory
    a GPU needs (`expert_slots_per_gpu`); it never exceeds the greedy start's and never goes
    below ``ceil(used / G)``.

    Greedy start, layers with the widest spread of used slots first: the fullest GPU of the
    layer goes to the GPU with the fewest used slots so far (ties by index). Then swaps: while
    some layer's slots on a fullest GPU can trade with another GPU's fewer ones and leave
    both below the maximum, the best such trade is made (each trade lowers the sum of squared
    totals, so the search ends)."""
    L, P = phy2log.shape
    S = slots_per_gpu
    G = P // S
    tables = phy2log.reshape(L, G, S)
    used = (tables >= 0).sum(2)  # [L, G] used slots of each layer's GPU as the packer left them
    perm = np.empty((L, G), dtype=np.int64)  # perm[l, g]: the packer's GPU that lands on g
    total = np.zeros(G, dtype=np.int64)
    for layer in np.argsort(-(used.max(1) - used.min(1)), kind="stable"):
        src = np.argsort(-used[layer], kind="stable")
        dst = np.argsort(total, kind="stable")
        perm[layer, dst] = src
        total[dst] += used[layer, src]
    placed = np.take_along_axis(used, perm, 1)  # [L, G] used slots on each final GPU
    while True:
        for g in np.flatnonzero(total == total.max()):  # a fullest GPU that can trade
            gain = placed[:, g, None] - placed  # [L, G] slots moved off g by trading with h
            after = np.maximum(total[g] - gain, total[None, :] + gain)  # new max of the pair
            ok = (gain > 0) & (after < total[g])
            if ok.any():
                break
        else:
            break
        layer, h = np.unravel_index(np.argmin(np.where(ok, after, np.iinfo(np.int64).max)),
                                    ok.shape)
        d = int(gain[layer, h])
        total[g] -= d
        total[h] += d
        perm[layer, [g, h]] = perm[layer, [h, g]]
        placed[layer, [g, h]] = placed[layer, [h, g]]
    out = np.take_along_axis(tables, perm[:, :, None], 1)
    return out.reshape(L, P)


def expert_slots_per_gpu(phy2log: np.ndarray, slots_per_gpu: int) -> int:
    """Largest number of used (non-empty) slots one GPU holds over all layers of ``phy2log:
    int64[L, P]``: the routed-expert weights (in experts) that GPU keeps in memory."""
    L, P = phy2log.shape
    return int((phy2log.reshape(L, P // slots_per_gpu, slots_per_gpu) >= 0).sum((0, 2)).max())
