"""DeepSeek's EPLB ``rebalance_experts`` as numpy kernels, vectorised over layers (the
``deepseek`` policy, and the DeepSeek candidates of ``greedy`` and ``hierarchical``).

Identical to DeepSeek's output under the stable tie order (equal weights keep index order;
DeepSeek's torch sort may not), in float32 as DeepSeek; hierarchical when ``num_groups %
num_nodes == 0``, else global. docs/solvers.md, "deepseek: identical to DeepSeek's EPLB".
"""

from __future__ import annotations

import numpy as np

from eplb.errors import InputError
from eplb.solvers.primitives import jit


def pack(
    weight: np.ndarray, num_packs: int, *, compiled: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Balanced packing of ``weight: float32[X, n]`` into ``num_packs`` packs of ``n/m`` items.

    Returns ``pack: int64[X, n]`` and ``rank: int64[X, n]`` (position inside the pack).
    Items are visited heaviest first (stable); each joins the lightest pack with room (lowest
    index on ties). With one item per pack, item ``i`` goes to pack ``i``. ``compiled``: the
    loop in `numba_kernels.pack_sorted` when numba is installed (the same packs).
    """
    X, n = weight.shape
    per = n // num_packs
    if per == 1:
        return (
            np.broadcast_to(np.arange(n, dtype=np.int64), (X, n)).copy(),
            np.zeros((X, n), dtype=np.int64),
        )
    order = np.argsort(-weight, axis=1, kind="stable")
    w = np.take_along_axis(weight, order, axis=1)  # heaviest first
    choice = np.empty((X, n), dtype=np.int64)  # pack of the j-th heaviest item
    rank = np.empty((X, n), dtype=np.int64)
    # rows whose num_packs heaviest items are all > 0 put them in packs 0, 1, ... in turn
    # (each lands on the first still-empty pack): skip those steps
    fast = w[:, num_packs - 1] > 0
    for rows, start in ((np.nonzero(fast)[0], num_packs), (np.nonzero(~fast)[0], 0)):
        if rows.size:
            choice[rows], rank[rows] = _pack_sorted(w[rows], num_packs, per, start, compiled)
    packs = np.empty((X, n), dtype=np.int64)
    ranks = np.empty((X, n), dtype=np.int64)
    np.put_along_axis(packs, order, choice, axis=1)
    np.put_along_axis(ranks, order, rank, axis=1)
    return packs, ranks


def _pack_sorted(
    w: np.ndarray, m: int, per: int, start: int, compiled: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """`pack` on items already sorted heaviest first, ``w: float32[X, n]``, into ``m`` packs of
    ``per``; the first ``start`` (0 or ``m``) items go to packs ``0..start-1``. Returns the pack
    and the rank of each sorted item, ``int64[X, n]`` each."""
    X, n = w.shape
    choice = np.empty((X, n), dtype=np.int64)
    rank = np.empty((X, n), dtype=np.int64)
    key = np.zeros((X, m), dtype=w.dtype)  # pack weight; inf once the pack is full
    cnt = np.zeros(X * m, dtype=np.int64)
    if start:
        choice[:, :m] = np.arange(m)
        rank[:, :m] = 0
        key[:] = w[:, :m]
        cnt[:] = 1
        if per == 2:  # the rest fill the packs lightest first (lowest index on ties)
            choice[:, m:] = np.argsort(key, axis=1, kind="stable")
            rank[:, m:] = 1
            return choice, rank
    kernels = jit.kernels() if compiled else None
    if kernels is not None:
        kernels.pack_sorted(np.ascontiguousarray(w), m, per, start, choice, rank)
        return choice, rank
    flat = key.reshape(-1)
    base = np.arange(X) * m
    for j in range(start, n):
        p = key.argmin(axis=1)
        f = base + p
        choice[:, j] = p
        c = cnt[f]
        rank[:, j] = c
        c += 1
        cnt[f] = c
        flat[f] += w[:, j]
        flat[f[c >= per]] = np.inf
    return choice, rank


def replicate(weight: np.ndarray, num_phy: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Replicate ``weight: float32[X, k]`` items into ``num_phy`` slots.

    Slot ``j < k`` holds item ``j``; each extra slot goes to the item with the largest
    ``weight / count`` (lowest index on ties). Returns ``phy2log: int64[X, num_phy]``,
    ``rank: int64[X, num_phy]`` (replica ordinal) and ``logcnt: int64[X, k]``.
    """
    X, k = weight.shape
    phy2log = np.broadcast_to(np.arange(num_phy, dtype=np.int64), (X, num_phy)).copy()
    rank = np.zeros((X, num_phy), dtype=np.int64)
    logcnt = np.ones((X, k), dtype=np.int64)
    rows = np.arange(X)
    per_replica = weight.copy()
    for j in range(k, num_phy):
        r = per_replica.argmax(axis=1)
        phy2log[:, j] = r
        rank[:, j] = logcnt[rows, r]
        logcnt[rows, r] += 1
        per_replica[rows, r] = weight[rows, r] / logcnt[rows, r].astype(weight.dtype)
    return phy2log, rank, logcnt


def _inverse(perm: np.ndarray) -> np.ndarray:
    """Row-wise inverse of permutations ``perm: int64[X, n]``."""
    inv = np.empty_like(perm)
    np.put_along_axis(inv, perm, np.broadcast_to(np.arange(perm.shape[1]), perm.shape), axis=1)
    return inv


def _node_stages(weight: np.ndarray, num_phy: int, num_groups: int, num_nodes: int) -> tuple:
    """Stages 1-2 of the hierarchical policy on ``weight: float32[L, E]``: groups packed onto
    nodes (experts renumbered so each node owns a block: ``log2mlog``, ``mlog2log``, int64[L,
    E]), then replicated inside each node (``mlog_w: float32[L * N, E / N]``, and `replicate`'s
    ``phy2mlog``, ``phyrank``, ``mlogcnt`` on those rows)."""
    L, E = weight.shape
    group_size = E // num_groups
    groups_per_node = num_groups // num_nodes
    # 1. pack groups onto nodes; renumber experts so each node owns a contiguous block
    group_w = weight.astype(np.float64).reshape(L, num_groups, group_size).sum(-1)
    gpack, grank = pack(group_w.astype(np.float32), num_nodes)
    log2mlog = (
        ((gpack * groups_per_node + grank) * group_size)[:, :, None] + np.arange(group_size)
    ).reshape(L, E)
    mlog2log = _inverse(log2mlog)
    # 2. replicate experts inside each node
    mlog_w = np.take_along_axis(weight, mlog2log, axis=1).reshape(L * num_nodes, E // num_nodes)
    return (log2mlog, mlog2log, mlog_w, *replicate(mlog_w, num_phy // num_nodes))


def node_counts(
    load: np.ndarray, topology, num_groups: int
) -> tuple[np.ndarray, np.ndarray]:
    """DeepSeek's hierarchical placement for ``load: float64[L, E]`` before its GPU packing:
    ``node: int64[L, E]`` the node of each expert and ``logcnt: int64[L, E]`` its replicas
    (the placement's max GPU load is at least each node's load over its GPUs and each
    replica's load). Requires the hierarchical case (``num_groups % N == 0``)."""
    N = topology.num_nodes
    E = load.shape[1]
    check(E, topology.num_slots, int(num_groups), N, topology.num_gpus)
    log2mlog, _, _, _, _, mlogcnt = _node_stages(
        as_float32(load), topology.num_slots, int(num_groups), N
    )
    logcnt = np.take_along_axis(mlogcnt.reshape(load.shape[0], -1), log2mlog, axis=1)
    return log2mlog // (E // N), logcnt


def rebalance_hierarchical(
    weight: np.ndarray, num_phy: int, num_groups: int, num_nodes: int, num_gpus: int,
    *, compiled: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """DeepSeek's hierarchical policy on ``weight: float32[L, E]`` (``compiled``: `pack`'s).

    Returns ``phy2log: int64[L, P]``, ``phyrank: int64[L, P]`` (replica ordinal by creation)
    and ``logcnt: int64[L, E]``.
    """
    L, E = weight.shape
    per_gpu = num_phy // num_gpus
    log2mlog, mlog2log, mlog_w, phy2mlog, phyrank, mlogcnt = _node_stages(
        weight, num_phy, num_groups, num_nodes
    )
    # 3. pack replicas onto the node's GPUs by per-replica load
    phy_w = np.take_along_axis(mlog_w / mlogcnt.astype(np.float32), phy2mlog, axis=1)
    gpu, rank = pack(phy_w, num_gpus // num_nodes, compiled=compiled)
    pphy2phy = _inverse(gpu * per_gpu + rank)
    # 4. map back to logical ids
    pphy2mlog = np.take_along_axis(phy2mlog, pphy2phy, axis=1).reshape(L, num_nodes, -1)
    pphy2mlog = (pphy2mlog + (np.arange(num_nodes) * (E // num_nodes))[None, :, None]).reshape(
        L, -1
    )
    phy2log = np.take_along_axis(mlog2log, pphy2mlog, axis=1)
    pphyrank = np.take_along_axis(phyrank, pphy2phy, axis=1).reshape(L, -1)
    logcnt = np.take_along_axis(mlogcnt.reshape(L, -1), log2mlog, axis=1)
    return phy2log, pphyrank, logcnt


def rebalance_experts(
    weight, num_replicas: int, num_groups: int, num_nodes: int, num_gpus: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """DeepSeek's API on ``weight: float[L, E]``: returns ``phy2log: int64[L, P]``, ``log2phy:
    int64[L, E, R]`` and ``logcnt: int64[L, E]``.

    Hierarchical when ``num_groups % num_nodes == 0``, else global (one group, one node), as
    DeepSeek's; accepts every input DeepSeek's accepts (a group count the global policy
    ignores need not divide the experts, nor the nodes the GPUs) and raises `InputError`
    where DeepSeek's asserts or fails. ``log2phy`` here is in DeepSeek's order (by replica
    creation); `Placement.log2phy` is by slot.
    """
    w = np.asarray(weight, dtype=np.float64)
    if w.ndim != 2:
        raise InputError(f"weight must be 2-D [layers, experts], got shape {w.shape}")
    if 0 in w.shape:  # DeepSeek's fails here too (a max over an empty logcnt)
        raise InputError(
            f"weight has shape {w.shape}: at least one layer and one expert are needed"
        )
    w32 = w.astype(np.float32)
    L, E = w.shape
    hierarchical = is_hierarchical(num_groups, num_nodes)
    if hierarchical:
        check(E, num_replicas, num_groups, num_nodes, num_gpus)
        phy2log, rank, logcnt = rebalance_hierarchical(
            w32, num_replicas, num_groups, num_nodes, num_gpus
        )
    else:
        check(E, num_replicas, 1, 1, num_gpus)
        phy2log, rank, logcnt = rebalance_hierarchical(w32, num_replicas, 1, 1, num_gpus)
    R = int(logcnt.max())
    log2phy = np.full((L, E * R), -1, dtype=np.int64)
    np.put_along_axis(
        log2phy, phy2log * R + rank, np.broadcast_to(np.arange(num_replicas), (L, num_replicas)), 1
    )
    return phy2log, log2phy.reshape(L, E, R), logcnt


def is_hierarchical(num_groups: int, num_nodes: int) -> bool:
    """DeepSeek's rule: the hierarchical policy iff ``num_groups % num_nodes == 0``."""
    if num_nodes < 1:
        raise InputError(f"num_nodes must be >= 1, got {num_nodes}")
    return num_groups % num_nodes == 0


def check(E: int, P: int, num_groups: int, num_nodes: int, num_gpus: int) -> None:
    """DeepSeek's preconditions for ``num_groups`` groups on ``num_nodes`` nodes (the global
    policy is ``num_groups = num_nodes = 1``), as `InputError`s."""
    if num_gpus < 1:
        raise InputError(f"num_gpus must be >= 1, got {num_gpus}")
    if num_gpus % num_nodes:
        raise InputError(f"{num_gpus} GPUs do not split evenly over {num_nodes} nodes")
    if P % num_gpus:
        raise InputError(
            f"slots {P} is not a multiple of {num_gpus} GPUs; use {(P // num_gpus + 1) * num_gpus}"
        )
    if P < E:
        raise InputError(f"slots {P} < {E} experts; every expert needs at least one slot")
    if num_groups < 1:
        raise InputError(f"num_groups must be >= 1 for the hierarchical policy, got {num_groups}")
    if E % num_groups:
        raise InputError(
            f"num_groups {num_groups} does not divide {E} experts; pass a divisor of {E} "
            "or a group count that is not a multiple of the node count (global policy)"
        )


def placement_table(
    load: np.ndarray, topology, num_groups: int | None, *, compiled: bool = False
) -> tuple[np.ndarray, bool]:
    """DeepSeek's ``phy2log: int64[L, P]`` for ``load: float64[L, E]`` on ``topology`` and
    whether it is the hierarchical policy (``num_groups % N == 0``; else global, whatever
    ``num_groups``). ``compiled``: the GPU packing compiled where numba is installed (the same
    table; ``greedy``'s candidates ask for it, the ``deepseek`` solver does not import numba)."""
    w32 = as_float32(load)
    N, G, P = topology.num_nodes, topology.num_gpus, topology.num_slots
    E = load.shape[1]
    if num_groups is not None and is_hierarchical(int(num_groups), N):
        check(E, P, int(num_groups), N, G)
        return rebalance_hierarchical(w32, P, int(num_groups), N, G, compiled=compiled)[0], True
    check(E, P, 1, 1, G)
    return rebalance_hierarchical(w32, P, 1, 1, G, compiled=compiled)[0], False


def as_float32(load: np.ndarray) -> np.ndarray:
    """``load: float64[L, E]`` as DeepSeek's float32; `InputError` if it overflows."""
    w32 = load.astype(np.float32)
    if not np.all(np.isfinite(w32)) or not np.all(np.isfinite(w32.astype(np.float64).sum(-1))):
        raise InputError("load exceeds float32 range (DeepSeek's solver works in float32)")
    return w32
