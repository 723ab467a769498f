"""A deliberately plain, per-layer loop transcription of DeepSeek's EPLB algorithm as the issue
states it in words (float32 arithmetic, pinned tie rule). Used as a test oracle for the
vectorised `solvers.primitives.deepseek_kernels` and as the loop baseline of the benchmarks
(``from eplb.testing import deepseek_reference``); slow and obvious on purpose."""

from __future__ import annotations

import numpy as np

f32 = np.float32


def pack(weights: list, num_packs: int) -> tuple[list[int], list[int]]:
    n = len(weights)
    per = n // num_packs
    if per == 1:
        return list(range(n)), [0] * n
    order = sorted(range(n), key=lambda i: -float(weights[i]))  # Python sort is stable
    load = [f32(0)] * num_packs
    items = [0] * num_packs
    pack_of, rank_of = [0] * n, [0] * n
    for i in order:
        best = None
        for p in range(num_packs):
            if items[p] < per and (best is None or load[p] < load[best]):
                best = p
        pack_of[i], rank_of[i] = best, items[best]
        load[best] = f32(load[best] + weights[i])
        items[best] += 1
    return pack_of, rank_of


def replicate(weights: list, num_phy: int) -> tuple[list[int], list[int]]:
    k = len(weights)
    phy2log = list(range(k))
    cnt = [1] * k
    for _ in range(k, num_phy):
        best = 0
        for e in range(1, k):
            if f32(weights[e] / f32(cnt[e])) > f32(weights[best] / f32(cnt[best])):
                best = e
        phy2log.append(best)
        cnt[best] += 1
    return phy2log, cnt


def rebalance_layer(w, num_phy: int, num_groups: int, num_nodes: int, num_gpus: int) -> list[int]:
    w = [f32(x) for x in w]
    E = len(w)
    if num_groups % num_nodes:
        num_groups, num_nodes = 1, 1
    gs = E // num_groups
    gpn = num_groups // num_nodes
    per_gpu = num_phy // num_gpus
    group_w = [f32(sum(float(x) for x in w[g * gs : (g + 1) * gs])) for g in range(num_groups)]
    gpack, grank = pack(group_w, num_nodes)
    # node n owns blocks n*gpn .. ; expert order inside a group is kept
    mlog2log = [0] * E
    for g in range(num_groups):
        block = gpack[g] * gpn + grank[g]
        for i in range(gs):
            mlog2log[block * gs + i] = g * gs + i
    per_node_e = E // num_nodes
    per_node_p = num_phy // num_nodes
    gpus_per_node = num_gpus // num_nodes
    phy2log = [0] * num_phy
    for n in range(num_nodes):
        experts = mlog2log[n * per_node_e : (n + 1) * per_node_e]
        ww = [w[e] for e in experts]
        p2m, cnt = replicate(ww, per_node_p)
        rep_w = [f32(ww[m] / f32(cnt[m])) for m in p2m]
        gpu, rank = pack(rep_w, gpus_per_node)
        for j, m in enumerate(p2m):
            slot = n * per_node_p + gpu[j] * per_gpu + rank[j]
            phy2log[slot] = experts[m]
    return phy2log


def rebalance(weight, num_phy: int, num_groups: int, num_nodes: int, num_gpus: int) -> np.ndarray:
    return np.array(
        [rebalance_layer(row, num_phy, num_groups, num_nodes, num_gpus) for row in weight],
        dtype=np.int64,
    )
