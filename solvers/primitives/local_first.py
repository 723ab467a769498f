"""Exact expected GPU loads under ``local_first`` dispatch (SGLang's static table) with token
sources spread evenly over the GPUs, and the in-node swap search on them (`polish`), as
``relaxed`` uses. docs/solvers.md, "relaxed" and "How the building blocks work".
"""

from __future__ import annotations

import numpy as np

from eplb.tolerance import REL_TOL
from eplb.topology import Topology


def node_counts(phy2log: np.ndarray, num_experts: int, topology: Topology) -> np.ndarray:
    """``int64[L, N, E]`` replicas of each expert on each node, ``phy2log: int64[L, P]``
    (empty slots, -1, hold nothing)."""
    L, P = phy2log.shape
    N = topology.num_nodes
    key = (np.arange(L)[:, None] * N + topology.node_of_slot[None, :]) * num_experts + phy2log
    key = key[phy2log >= 0]
    return np.bincount(key, minlength=L * N * num_experts).reshape(L, N, num_experts)


def arrivals(k: np.ndarray, gpus_per_node: int, width: int | None = None) -> np.ndarray:
    """``int64[..., N, R]``: anywhere-tier sources arriving at node-local replica ``i`` of one
    expert on each node, for its replica counts ``k: int[..., N]`` per node (``R = width`` or the
    largest count). A node holding no replica sends its ``gpus_per_node`` sources this way:
    source ``g`` takes global candidate ``g % n``, candidates numbered node by node."""
    k = np.asarray(k, dtype=np.int64)
    N = k.shape[-1]
    R = max(int(k.max(initial=1)), 1) if width is None else int(width)
    n = np.maximum(k.sum(-1, keepdims=True), 1)  # [..., 1]
    off = np.cumsum(k, -1) - k  # [..., N] first global candidate index on each node
    out = np.zeros(k.shape + (R,), dtype=np.int64)
    flat = out.reshape(-1, N * R)
    for c in range(N):
        empty = (k[..., c] == 0).reshape(-1)  # rows where node c sends over the anywhere tier
        if not empty.any():
            continue
        for t in range(gpus_per_node):
            idx = (c * gpus_per_node + t) % n  # [..., 1] global candidate index
            b = (off <= idx).sum(-1) - 1  # node holding that index (last start <= idx)
            i = idx[..., 0] - np.take_along_axis(off, b[..., None], -1)[..., 0]
            b, i = b.reshape(-1), i.reshape(-1)
            ok = empty & (i < R)
            rows = np.nonzero(ok)[0]
            np.add.at(flat, (rows, b[ok] * R + i[ok]), 1)
    return out


def node_sources(k: np.ndarray, gpus_per_node: int) -> np.ndarray:
    """``int64[..., N]``: source GPUs whose picks of one expert each node serves, for its
    replica counts ``k: int[..., N]`` (the node's own sources when it holds a replica, plus
    anywhere-tier arrivals)."""
    k = np.asarray(k, dtype=np.int64)
    return np.where(k > 0, gpus_per_node, 0) + arrivals(k, gpus_per_node).sum(-1)


def _local(mask: np.ndarray, base: np.ndarray, extra: np.ndarray) -> np.ndarray:
    """Sources served by each holder GPU of one expert inside one node.

    ``mask: bool[..., gpn]`` GPUs of the node holding one replica of the expert each,
    ``base: int[...]`` global index of the node's first GPU, ``extra: int[..., R]``
    anywhere-tier arrivals per node-local replica index. Returns ``int64[..., gpn]`` (0 where
    no replica): 1 (the holder itself) + the node's other sources ``g`` with ``g % k`` equal to
    the holder's rank + its arrivals."""
    gpn = mask.shape[-1]
    R = extra.shape[-1]
    k = mask.sum(-1, keepdims=True)  # [..., 1]
    rank = np.cumsum(mask, -1) - 1  # [..., gpn]
    res = (base[..., None] + np.arange(gpn)) % np.maximum(k, 1)  # [..., gpn]
    idx = np.arange(gpn)
    # cnt[..., i]: non-holders with residue i
    cnt = ((~mask)[..., :, None] & (res[..., :, None] == idx)).sum(-2)  # [..., gpn(i)]
    r = np.clip(rank, 0, gpn - 1)
    own = 1 + np.take_along_axis(cnt, r, -1)
    arr = np.take_along_axis(extra, np.clip(rank, 0, R - 1), -1) * (rank < R)
    return np.where(mask, own + arr, 0)


def slot_sources(phy2log: np.ndarray, num_experts: int, topology: Topology) -> np.ndarray:
    """``int64[L, P]``: source GPUs mapped to each slot of ``phy2log: int64[L, P]`` by
    ``local_first`` (as
    `eplb.dispatch.dispatch_table`; sums to ``G`` per expert). With several replicas of
    an expert on one GPU the sources of that GPU's tiers are spread as the table does."""
    L, P = phy2log.shape
    G, S, gpn = topology.num_gpus, topology.slots_per_gpu, topology.gpus_per_node
    E = num_experts
    # general path (duplicates allowed): build the table per layer, vectorised over sources
    # slots grouped by expert, ascending; empty slots (-1) last and counted for no expert
    order = np.argsort(np.where(phy2log < 0, E, phy2log), axis=1, kind="stable")
    key = (np.arange(L)[:, None] * E + phy2log)[phy2log >= 0]
    cnt = np.bincount(key, minlength=L * E).reshape(L, E)
    R = int(cnt.max())
    start = np.cumsum(cnt, 1) - cnt
    pos = np.arange(R)
    valid = pos[None, None, :] < cnt[:, :, None]  # [L, E, R]
    idx = np.minimum(start[:, :, None] + pos, P - 1)
    l2p = np.where(valid, np.take_along_axis(order, idx.reshape(L, -1), 1).reshape(L, E, R), -1)
    out = np.zeros(L * P, dtype=np.int64)
    gpu = np.where(valid, l2p // S, -1)
    node = np.where(valid, gpu // gpn, -1)
    for s in range(G):
        same_gpu = gpu == s
        same_node = node == s // gpn
        tier = np.where(
            same_gpu.any(-1, keepdims=True),
            same_gpu,
            np.where(same_node.any(-1, keepdims=True), same_node, valid),
        )
        c = tier.sum(-1)
        pick = s % np.maximum(c, 1)
        chosen = tier & (np.cumsum(tier, -1) - 1 == pick[..., None])
        slot = np.take_along_axis(l2p, chosen.argmax(-1)[..., None], -1)[..., 0]  # [L, E]
        np.add.at(out, (np.arange(L)[:, None] * P + slot).ravel(), 1)
    return out.reshape(L, P)


def slot_loads(load: np.ndarray, phy2log: np.ndarray, topology: Topology) -> np.ndarray:
    """``float64[L, P]`` expected tokens per slot of ``phy2log: int64[L, P]`` for ``load:
    float[L, E]`` under ``local_first``, sources even."""
    src = slot_sources(phy2log, load.shape[1], topology)
    w = np.where(phy2log >= 0, np.take_along_axis(load, np.maximum(phy2log, 0), 1), 0.0)
    return w / topology.num_gpus * src


def gpu_loads(load: np.ndarray, phy2log: np.ndarray, topology: Topology) -> np.ndarray:
    """``float64[L, G]`` expected tokens per GPU of ``phy2log: int64[L, P]`` for ``load:
    float[L, E]`` under ``local_first``, sources even (what
    `evaluation.traffic.simulate(..., load=load, policy="local_first")` reports as
    ``gpu_tokens``, up to its tokens-per-pick scale)."""
    L = load.shape[0]
    return slot_loads(load, phy2log, topology).reshape(L, topology.num_gpus, -1).sum(-1)


def polish(
    load: np.ndarray, phy2log: np.ndarray, topology: Topology, *, budget: int = 1_000
) -> tuple[np.ndarray, int]:
    """Swap replicas of ``phy2log: int64[L, P]`` between GPUs of one node while the node's
    largest exact ``local_first`` GPU load (``load: float[L, E]``) drops; returns the new
    ``int64[L, P]`` and the steps run.

    Rows are (layer, node) pairs, all searched at once: a step swaps, per row, a replica of the
    heaviest GPU ``h`` with a replica of another GPU of the node (never putting two replicas of
    an expert on one GPU), choosing the swap with the largest gain ``M - (largest new load
    among the GPUs it changes)``, and only if every changed GPU ends below the row's current
    max ``M``, ``h`` included (the sorted loads decrease strictly, so the search ends). Loads
    are exact: a move changes which sources a multi-replica expert's replicas serve (`_local`).
    Which nodes hold which experts never changes, so node totals and RDMA (under
    ``local_first``) are unchanged.
    Rows holding two replicas of one expert on a GPU are left as they are.
    """
    L, P = phy2log.shape
    E = load.shape[1]
    N, gpn, S = topology.num_nodes, topology.gpus_per_node, topology.slots_per_gpu
    G = topology.num_gpus
    if gpn < 2:
        return phy2log.copy(), 0
    k = node_counts(phy2log, E, topology)  # [L, N, E]
    R = int(k.max())
    arr = arrivals(k.transpose(0, 2, 1), gpn, R).transpose(0, 2, 1, 3).reshape(L * N, E, R)
    X = L * N
    slot_e = phy2log.reshape(X, gpn, S).copy()
    w = np.repeat(np.asarray(load, dtype=np.float64) / G, N, axis=0)  # [X, E]
    base = np.tile(np.arange(N) * gpn, L)  # [X] first GPU of each row's node
    xi = np.repeat(np.arange(X), gpn * S)
    gi = np.tile(np.repeat(np.arange(gpn), S), X)
    cnt = np.zeros((X, E, gpn), dtype=np.int16)
    np.add.at(cnt, (xi, slot_e.ravel(), gi), 1)
    holds = cnt > 0
    clean = ~(cnt > 1).any((1, 2))
    eye = np.eye(gpn, dtype=bool)

    def moves(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """GPU loads ``[n, gpn]`` and ``D[n, gpn(u), S, gpn(v), gpn]``: change of every GPU's
        load when the replica in slot ``(u, s)`` moves to GPU ``v`` (NaN if ``v`` holds it)."""
        e = slot_e[rows]  # [n, gpn, S]
        r3 = rows[:, None, None]
        m = holds[r3, e]  # [n, gpn, S, gpn]
        ww = w[r3, e][..., None]
        b = np.broadcast_to(base[r3], e.shape)
        a = arr[r3, e]  # [n, gpn, S, R]
        now = _local(m, b, a) * ww  # [n, gpn, S, gpn]
        gpu = (now * eye[None, :, None, :]).sum((2, 3))  # own GPU's share, summed per GPU
        # a replica alone on its node serves the node's sources wherever it sits: its load
        # just moves; only experts with several replicas on the node are re-evaluated
        own = (now * eye[None, :, None, :]).sum(-1)  # [n, gpn, S]
        d = (eye[None, None, None, :, :] * 1.0 - eye[None, :, None, None, :]) * own[..., None, None]
        multi = m.sum(-1) > 1  # [n, gpn, S]
        if multi.any():
            mm, bb, aa = m[multi], b[multi], a[multi]  # [k, gpn], [k], [k, R]
            u = np.nonzero(multi)[1]
            m2 = (mm[:, None, :] & ~eye[u][:, None, :]) | eye[None, :, :]  # [k, gpn(v), gpn]
            new = _local(m2, bb[:, None], aa[:, None, :]) * ww[multi][:, None]
            d[multi] = new - now[multi][:, None, :]
        bad = m | eye[None, :, None, :]  # v already holds the expert, or v == u
        d[bad] = np.nan
        return gpu, d

    active = np.nonzero(clean)[0]
    gpu = np.zeros((X, gpn))
    D = np.zeros((X, gpn, S, gpn, gpn))
    if active.size:
        gpu[active], D[active] = moves(active)
    steps = 0
    while active.size and steps < budget:
        steps += 1
        n = active.size
        r = np.arange(n)
        ld = gpu[active]
        h = ld.argmax(1)
        M = ld[r, h]
        d1 = D[active, h]  # [n, S, gpn(v), gpn]: replica of h moves to v
        d2 = D[active[:, None], np.arange(gpn)[None, :], :, h[:, None]]  # [n, gpn(u), S, gpn]
        delta = d1[:, :, :, None, :] + d2[:, None, :, :, :]  # [n, S1, gpn, S2, gpn]
        xe = slot_e[active, h]  # [n, S]
        ye = slot_e[active]  # [n, gpn, S]
        same = xe[:, :, None, None] == ye[:, None, :, :]
        newl = ld[:, None, None, None, :] + delta
        changed = delta != 0
        worst = np.where(changed, newl, -np.inf).max(-1)
        ok = np.isfinite(worst) & ~same & ~np.isnan(delta).any(-1)
        ok &= worst < M[:, None, None, None] * (1 - REL_TOL)
        # and ``h`` itself must drop: a swap can leave ``h`` as it was (a multi-replica
        # expert's sources re-spread) while lifting other GPUs below ``M``; accepting it let
        # two layouts alternate until the budget ran out (issue 18's slow check_solver runs)
        hl = np.take_along_axis(newl, h[:, None, None, None, None], -1)[..., 0]
        ok &= hl < M[:, None, None, None] * (1 - REL_TOL)
        gain = np.where(ok, M[:, None, None, None] - worst, -np.inf).reshape(n, -1)
        best = gain.argmax(1)
        good = np.isfinite(gain[r, best])
        if not good.any():
            break
        s1, rest = np.divmod(best[good], gpn * S)
        g2, s2 = np.divmod(rest, S)
        lay, hg = active[good], h[good]
        a_e, b_e = slot_e[lay, hg, s1], slot_e[lay, g2, s2]
        slot_e[lay, hg, s1], slot_e[lay, g2, s2] = b_e, a_e
        holds[lay, a_e, hg] = False
        holds[lay, a_e, g2] = True
        holds[lay, b_e, g2] = False
        holds[lay, b_e, hg] = True
        active = lay
        gpu[active], D[active] = moves(active)
    return slot_e.reshape(L, P), steps
