"""The even-split greedy pipeline, vectorised over rows (layers, or nodes of layers): capped
water-filling counts, LPT with cardinality, swap search; exact sorted pairing at two slots per
GPU. `place_even` adds DeepSeek's placements as candidates per layer. docs/solvers.md, "greedy".
"""

from __future__ import annotations

import numpy as np

from eplb.solvers.primitives import packing, pairing
from eplb.solvers.primitives.deepseek_kernels import node_counts, placement_table, replicate
from eplb.solvers.primitives.layout import max_load
from eplb.solvers.primitives.replication import waterfill
from eplb.tolerance import better

# relative slack on a bound before it may skip a candidate: the bounds (a row's or a node's load
# over its GPUs) sum the loads in another order than the GPU loads they bound
BOUND_SLACK = 1e-9


def row_caps(present: np.ndarray, num_gpus: int, slots_per_gpu: int) -> np.ndarray:
    """``int64[X, 1]`` replica cap per row for ``present: bool[X, E]`` experts: ``G`` when the
    row's experts can fill every GPU with distinct experts, else enough to fill the slots."""
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
    start = counts
    if present.all():  # DeepSeek's float32 counts as a second start
        _, _, ds = replicate(load.astype(np.float32), int(counts[0].sum()))
        ok = (ds <= cap).all(1)
        take = ok & (pairing.pair_objective(load, ds) < pairing.pair_objective(load, counts))
        start = np.where(take[:, None], ds, counts)
    # two searches in one call (rows stacked): one keeping the pairing free of duplicates,
    # one ignoring them (its pairing is used where it puts no expert twice on a GPU)
    X = load.shape[0]
    both = pairing.improve_counts(
        np.concatenate([load, load]),
        np.concatenate([start, start]),
        np.concatenate([np.broadcast_to(cap, (X, 1))] * 2),
        budget=budget,
        present=np.concatenate([present, present]),
        distinct=np.repeat([True, False], X),
        load_id=np.tile(np.arange(X), 2),
    )
    improved, free = both[:X], both[X:]
    packed = _layout_pairs(load, improved, budget)
    # candidates: the start itself and the free search; the best duplicate-free layout wins.
    # Rows are laid out independently, so a row whose candidate counts equal the counts laid
    # out already would get the same layout (never strictly better): only the others are
    for c in (start, free):
        rows = np.flatnonzero((c != improved).any(1))
        if rows.size:
            alt = _layout_pairs(load[rows], c[rows], budget)
            packed.assign(alt, _key(alt) < _key(packed)[rows], rows=rows)
    return packed


def _key(p: packing.Packed) -> np.ndarray:
    """Sort key of candidate packings: duplicates last, then max GPU load."""
    return np.where(p.duplicates() > 0, np.inf, p.gpu.max(1))


def _layout_pairs(load, counts, budget) -> packing.Packed:
    """Sorted pairing; rows where a duplicate had to be swapped away are polished by swaps
    and compared with LPT on the same counts."""
    packed = pairing.pair_layout(load, counts)
    G = packed.shape[1]
    fixed = np.nonzero(better(pairing.pair_objective(load, counts), packed.gpu.max(1)))[0]
    fixed = np.union1d(fixed, np.nonzero(packed.duplicates() > 0)[0])
    if fixed.size:
        sub = packed.rows(fixed)
        packing.improve(sub, budget=budget)
        alt = packing.lpt(load[fixed], counts[fixed], G, 2)
        packing.improve(alt, budget=budget)
        sub.assign(alt, _key(alt) < _key(sub))
        packed.assign(sub, np.ones(fixed.size, dtype=bool), rows=fixed)
    return packed


def deepseek_candidates(
    load: np.ndarray, topology, num_groups: int | None, best: np.ndarray | None = None
) -> list[tuple[np.ndarray, np.ndarray]]:
    """DeepSeek's placements for ``load: float64[L, E]`` as ``[(layers: int64[k], phy2log:
    int64[k, P]), ...]``: global,
    and hierarchical too when ``num_groups`` makes DeepSeek hierarchical (``num_groups % N ==
    0``). With ``best: float64[L]`` (max GPU loads to beat) the global placement is built only
    for layers where it could be strictly better: its replica counts bound its max GPU load
    from below (the largest replica and the average; for two slots per GPU the sorted pairing
    of its replicas, the best pairing of those counts)."""
    L, E = load.shape
    G, S, P = topology.num_gpus, topology.slots_per_gpu, topology.num_slots
    rows = np.arange(L)
    if best is not None:
        _, _, counts = replicate(load.astype(np.float32), P)
        if S == 2:
            lb = pairing.pair_objective(load, counts)
        else:
            lb = np.maximum((load / counts).max(1), load.sum(1) / G)
        rows = np.nonzero(better(lb * (1 - BOUND_SLACK), best))[0]
    out = []
    if rows.size:
        out.append((rows, placement_table(load[rows], topology, None, compiled=True)[0]))
    N = topology.num_nodes
    if num_groups is not None and num_groups % N == 0 and E % num_groups == 0:
        rows = np.arange(L) if best is None else hierarchical_rows(load, topology, num_groups, best)
        if rows.size:
            out.append((rows, placement_table(load[rows], topology, num_groups,
                                              compiled=True)[0]))
    return out


def hierarchical_rows(
    load: np.ndarray, topology, num_groups: int, best: np.ndarray
) -> np.ndarray:
    """``int64[k]``: the layers of ``load: float64[L, E]`` where DeepSeek's hierarchical
    placement could be strictly better than ``best: float64[L]``; its max GPU load is at least
    each node's load over the node's GPUs and each replica's load (`node_counts`)."""
    L = load.shape[0]
    N = topology.num_nodes
    node, cnt = node_counts(load, topology, num_groups)
    per_node = np.bincount(
        (node + np.arange(L)[:, None] * N).ravel(), weights=load.ravel(), minlength=L * N
    ).reshape(L, N)
    lb = np.maximum((load / cnt).max(1), per_node.max(1) / (topology.num_gpus // N))
    return np.nonzero(better(lb * (1 - BOUND_SLACK), best))[0]


def place_even(
    load: np.ndarray, topology, num_groups: int | None = None, budget: int = 10_000
) -> tuple[np.ndarray, np.ndarray]:
    """Even-split greedy ``phy2log: int64[L, P]`` for ``load: float64[L, E]`` that is never
    worse than DeepSeek's placement (global, and hierarchical when ``num_groups`` makes
    DeepSeek hierarchical) on any layer: a layer where DeepSeek's is strictly better takes it
    (duplicates included). Returns the table and ``int64[k]`` the layers taken from DeepSeek."""
    L, E = load.shape
    G, S = topology.num_gpus, topology.slots_per_gpu
    phy2log = pack_even(load, G, S, budget=budget).phy2log()
    best = max_load(load, phy2log, S)
    taken = np.zeros(L, dtype=bool)
    for rows, alt in deepseek_candidates(load, topology, num_groups, best):
        val = max_load(load[rows], alt, S)
        take = better(val, best[rows])
        phy2log[rows[take]] = alt[take]
        best[rows[take]] = val[take]
        taken[rows[take]] = True
    return phy2log, np.nonzero(taken)[0]
