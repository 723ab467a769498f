"""``greedy``: global placement that beats DeepSeek's greedy chain. Vectorised over layers.

1. Replica counts by water-filling with a cap of ``G`` replicas per expert (`replication`):
   slot-aware, so ``[1000, 1, 1, 1, 1, 1, 1, 1]`` on 4 GPUs x 3 slots gives expert 0 four
   replicas (one per GPU, max load 252) where DeepSeek gives five (401).
2. LPT with cardinality: replicas heaviest first, each to the lightest GPU with a free slot
   that does not hold its expert (`packing.lpt`).
3. Swap local search between the heaviest GPU and the others until no swap helps or
   ``budget`` iterations (`packing.improve`).

With two slots per GPU the packing is solved exactly instead (sorted pairing) and the counts
are improved by local search from DeepSeek's own counts (`pairing`), so the result is never
worse than ``deepseek`` on a layer (unless DeepSeek's own placement puts two replicas of an
expert on one GPU, which this solver never does; with real-valued loads it does not happen).
``weighted=True`` also chooses ``replica_share`` (`shares`); ``rdma_weight > 0`` trades
balance for expected RDMA traffic (`traffic_cost`). With ``previous=`` and ``tolerance`` or
``migration_budget`` the live placement is repaired instead of replaced (`incremental`).
"""

from __future__ import annotations

import numpy as np

from eplb.errors import InputError
from eplb.placement import Placement
from eplb.topology import Topology
from solvers import packing, pairing
from solvers.incremental import check_options, incremental
from solvers.registry import register
from solvers.replication import default_cap, waterfill
from solvers.tolerance import better
from solvers.traffic_cost import (
    check_rdma_weight,
    rdma_from_node_count,
    traffic_objective,
)
from solvers.validation import NonNegFloat, NonNegInt


def row_caps(present: np.ndarray, num_gpus: int, slots_per_gpu: int) -> np.ndarray:
    """``int64[X, 1]`` replica cap per row for ``present: bool[X, E]`` experts."""
    n = present.sum(1)
    cap = np.where(n >= slots_per_gpu, num_gpus, -(-num_gpus * slots_per_gpu // np.maximum(n, 1)))
    return cap[:, None]


def pack_even(
    load: np.ndarray,
    num_gpus: int,
    slots_per_gpu: int,
    *,
    present: np.ndarray | None = None,
    budget: int = 10_000,
    counts: np.ndarray | None = None,
) -> packing.Packed:
    """Even-split greedy for rows ``load: float[X, E]`` on ``num_gpus`` x ``slots_per_gpu``.

    ``present: bool[X, E]`` restricts each row to some experts (hierarchical per-node rows);
    ``counts: int64[X, E]`` fixes the replica counts (else water-filling).
    """
    X, E = load.shape
    G, S = num_gpus, slots_per_gpu
    if present is None:
        present = np.ones((X, E), dtype=bool)
    cap = row_caps(present, G, S)
    if counts is None:
        counts = waterfill(load, G * S, cap, present=present)
    if S == 2:
        return _pack_pairs(load, counts, cap, present, budget)
    packed = packing.lpt(load, counts, G, S)
    packing.improve(packed, budget=budget)
    return packed


def _pack_pairs(load, counts, cap, present, budget) -> packing.Packed:
    X, E = load.shape
    start = counts
    if present.all():  # DeepSeek's float32 counts as a second start: never worse than deepseek
        from solvers.deepseek import replicate

        _, _, ds = replicate(load.astype(np.float32), int(counts[0].sum()))
        ok = (ds <= cap).all(1)
        better = ok & (pairing.pair_objective(load, ds) < pairing.pair_objective(load, counts))
        start = np.where(better[:, None], ds, counts)
    improved = pairing.improve_counts(load, start, cap, present=present, budget=budget)
    packed = _layout_pairs(load, improved, budget)
    # candidates: the start itself, and a search that ignores duplicates (its pairing is used
    # where it puts no expert twice on a GPU); the best duplicate-free layout per row wins
    free = pairing.improve_counts(load, start, cap, present=present, budget=budget,
                                  distinct=False)
    for counts in (start, free):
        alt = _layout_pairs(load, counts, budget)
        _assign(packed, alt, _key(alt) < _key(packed))
    return packed


def _key(p: packing.Packed) -> np.ndarray:
    """Sort key of candidate packings: duplicates last, then max GPU load."""
    return np.where(p.duplicates() > 0, np.inf, p.gpu.max(1))


def _layout_pairs(load, counts, budget) -> packing.Packed:
    """Sorted pairing; rows where a duplicate had to be swapped away are polished by swaps
    and compared with LPT on the same counts."""
    packed = pairing.pair_layout(load, counts)
    G = packed.shape[1]
    fixed = np.nonzero(packed.gpu.max(1) > pairing.pair_objective(load, counts) * (1 + 1e-12))[0]
    fixed = np.union1d(fixed, np.nonzero(packed.duplicates() > 0)[0])
    if fixed.size:
        sub = _rows(packed, fixed)
        packing.improve(sub, budget=budget)
        alt = packing.lpt(load[fixed], counts[fixed], G, 2)
        packing.improve(alt, budget=budget)
        _assign(sub, alt, _key(alt) < _key(sub))
        _assign(packed, sub, np.ones(fixed.size, dtype=bool), rows=fixed)
    return packed


def _rows(p: packing.Packed, rows: np.ndarray) -> packing.Packed:
    return packing.Packed(p.slot_e[rows], p.slot_s[rows], p.gpu[rows], p.holds[rows])


def _assign(dst: packing.Packed, src: packing.Packed, take: np.ndarray, rows=None) -> None:
    """``dst[rows[take]] = src[take]`` for every array of the packing."""
    idx = np.nonzero(take)[0] if rows is None else rows[take]
    for name in ("slot_e", "slot_s", "gpu", "holds"):
        getattr(dst, name)[idx] = getattr(src, name)[take]


def deepseek_candidates(load: np.ndarray, topology: Topology, num_groups: int | None):
    """DeepSeek's placements of ``load: float64[L, E]``: ``[int64[L, P], ...]`` global, and
    hierarchical too when ``num_groups`` makes DeepSeek hierarchical."""
    from solvers.deepseek import rebalance_hierarchical

    w32 = load.astype(np.float32)
    N, G, P = topology.num_nodes, topology.num_gpus, topology.num_slots
    out = [rebalance_hierarchical(w32, P, 1, 1, G)[0]]
    if num_groups is not None and num_groups % N == 0 and load.shape[1] % num_groups == 0:
        out.append(rebalance_hierarchical(w32, P, int(num_groups), N, G)[0])
    return out


def place_even(load: np.ndarray, topology: Topology, num_groups: int | None = None,
               budget: int = 10_000) -> tuple[np.ndarray, np.ndarray]:
    """Even-split greedy ``phy2log: int64[L, P]`` that is never worse than DeepSeek's
    placement (global, and hierarchical when ``num_groups`` makes DeepSeek hierarchical) on
    any layer: a layer where DeepSeek's is strictly better takes it (duplicates included).
    Returns the table and ``int64[k]`` the layers taken from DeepSeek."""
    L, E = load.shape
    G, S = topology.num_gpus, topology.slots_per_gpu
    phy2log = pack_even(load, G, S, budget=budget).slot_e.reshape(L, G * S)
    best = _max_load(load, phy2log, S)
    taken = np.zeros(L, dtype=bool)
    for alt in deepseek_candidates(load, topology, num_groups):
        val = _max_load(load, alt, S)
        take = better(val, best)
        phy2log = np.where(take[:, None], alt, phy2log)
        best = np.where(take, val, best)
        taken |= take
    return phy2log, np.nonzero(taken)[0]


def _max_load(load: np.ndarray, phy2log: np.ndarray, S: int) -> np.ndarray:
    """``float64[L]`` max GPU load (even split) of ``phy2log: int64[L, P]``."""
    L, E = load.shape
    cnt = np.bincount((phy2log + np.arange(L)[:, None] * E).ravel(), minlength=L * E)
    per = np.take_along_axis(load / np.maximum(cnt.reshape(L, E), 1), phy2log, 1)
    return per.reshape(L, -1, S).sum(2).max(1)


def _duplicates(phy2log: np.ndarray, S: int) -> int:
    e = np.sort(phy2log.reshape(phy2log.shape[0], -1, S), axis=2)
    return int((e[:, :, 1:] == e[:, :, :-1]).sum())


def pack_traffic(
    load: np.ndarray, topology: Topology, rdma_weight: float, *, budget: int = 10_000
) -> tuple[packing.Packed, np.ndarray]:
    """Traffic-aware greedy: returns the packing and ``float64[L]`` objective values.

    Count candidates: water-filling where the next replica of an expert on fewer than ``N``
    nodes also earns ``beta * load_e / N`` priority, for a few ``beta`` multiples of
    ``rdma_weight / G``; LPT penalises GPUs on nodes already holding the expert by the
    objective's marginal ``rdma_weight * load_e / (N G)``; swaps score the exact change of
    ``max load + rdma_weight * expected_rdma / G``. The best candidate per layer wins.
    """
    L, E = load.shape
    G, S, N = topology.num_gpus, topology.slots_per_gpu, topology.num_nodes
    gpn = topology.gpus_per_node
    cap = default_cap(E, G, S)
    weight = rdma_weight / G
    best_obj = np.full(L, np.inf)
    best: packing.Packed | None = None
    for beta in (0.0, 1.0, 4.0, 16.0, 64.0):
        bonus = None
        if beta > 0:
            bonus = np.zeros((L, E, N + 1))
            bonus[:, :, 1:N] = (beta * weight * load / N)[:, :, None]
        counts = waterfill(load, G * S, cap, bonus=bonus)
        packed = packing.lpt(
            load, counts, G, S, node_penalty=weight * load / N, gpus_per_node=gpn
        )
        term = packing.TrafficTerm(packing.node_counts(packed, gpn), load, weight, gpn)
        packing.improve(packed, budget=budget, traffic=term)
        obj = traffic_objective(packed.gpu, rdma_from_node_count(term.node_count, load),
                                rdma_weight)
        if best is None:
            best, best_obj = packed, obj
            continue
        take = obj < best_obj * (1 - 1e-12)
        _assign(best, packed, take)
        best_obj = np.where(take, obj, best_obj)
    return best, best_obj


@register("greedy")
def greedy(
    load: np.ndarray,
    topology: Topology,
    *,
    num_groups: int | None = None,
    previous: Placement | None = None,
    seed: int = 0,
    time_limit: float | None = None,
    weighted: bool = False,
    rdma_weight: NonNegFloat = 0.0,
    budget: NonNegInt = 10_000,
    migration_budget: NonNegInt | None = None,
    tolerance: NonNegFloat | None = None,
) -> Placement:
    """Global greedy on ``load: float64[L, E]`` (see module docstring).

    Options: ``weighted`` (also choose ``replica_share``), ``rdma_weight`` (>= 0, traffic
    trade-off), ``budget`` (max swap iterations). ``num_groups`` is ignored (global policy);
    the algorithm is deterministic, so ``seed`` is unused; ``time_limit`` is not needed.
    ``previous`` is applied by `solvers.solve` (relabeling), unless ``migration_budget``
    (max slots changed per layer) or ``tolerance`` (relative slack vs a fresh solve) is set:
    then the live placement is repaired incrementally (`solvers.incremental`); without
    ``previous`` those two options are ignored.
    """
    del seed, time_limit
    lam = check_rdma_weight(rdma_weight)
    tolerance, migration_budget = check_options(tolerance, migration_budget)
    repair = previous is not None and (tolerance is not None or migration_budget is not None)
    if repair and (weighted or lam > 0):
        raise InputError(
            "incremental repair (tolerance / migration_budget with previous=) supports the "
            "even-split greedy only; drop weighted / rdma_weight, or drop tolerance and "
            "migration_budget to solve afresh and relabel")
    L, E = load.shape
    G, S = topology.num_gpus, topology.slots_per_gpu
    if weighted:
        from solvers.shares import weighted_greedy

        return weighted_greedy(load, topology, rdma_weight=lam, budget=budget,
                               num_groups=num_groups)
    info: dict = {"policy": "global"}
    if lam > 0:
        packed, obj = pack_traffic(load, topology, lam, budget=budget)
        info.update(rdma_weight=lam, objective=obj.tolist())
        phy2log = packed.slot_e.reshape(L, G * S)
    else:
        phy2log, taken = place_even(load, topology, num_groups, budget)
        info["deepseek_layers"] = taken.tolist()
    info["duplicates"] = _duplicates(phy2log, S)
    fresh = Placement(phy2log, E, topology, meta={"solver": info})
    if repair:
        return incremental(load, topology, previous, fresh, tolerance=tolerance,
                           migration_budget=migration_budget, max_steps=budget)
    return fresh
