"""vLLM's default EPLB policy (DeepSeek's hierarchical algorithm), re-stated for benchmarks.

Read: vllm-project/vllm ``vllm/distributed/eplb/policy/default.py`` at commit
d2e5d5958ab5d6c43abcb41f880aaa305c9ba8c0 (``DefaultEplbPolicy``). Cost structure kept:
- the weights are float32 torch tensors; replication is a torch loop over the redundant slots,
  recomputing ``weight / count`` for all rows each step and taking ``max(dim=-1).indices``;
- balanced packing moves to numpy, sorts with ``np.argsort(-w)`` (not stable), then loops in
  Python over rows and items, picking the lightest non-full pack with ``min`` over a generator
  of Python floats;
- permutations are inverted with ``scatter_``, reorderings use ``gather``.
(A later vLLM revision, commit 02c1119c, moved the whole policy to numpy with the same loops.)
"""

from __future__ import annotations

import numpy as np
import torch


def _packing(weight: torch.Tensor, num_packs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Items of ``weight: float32[X, n]`` into ``num_packs`` packs of ``n / num_packs`` items:
    ``(pack, rank_in_pack)``, both ``int64[X, n]``."""
    rows, n = weight.shape
    per = n // num_packs
    if per == 1:
        idx = torch.arange(n, dtype=torch.int64).expand(weight.shape)
        return idx, torch.zeros_like(weight, dtype=torch.int64)
    w = weight.cpu().numpy()
    order = np.argsort(-w, axis=-1)
    pack = np.full((rows, n), -1, dtype=np.int64)
    rank = np.full((rows, n), -1, dtype=np.int64)
    for r in range(rows):
        totals = [0.0] * num_packs
        sizes = [0] * num_packs
        for item in order[r]:
            p = min((q for q in range(num_packs) if sizes[q] < per), key=totals.__getitem__)
            pack[r, item] = p
            rank[r, item] = sizes[p]
            totals[p] += w[r, item]
            sizes[p] += 1
    return torch.from_numpy(pack), torch.from_numpy(rank)


def _replicate(weight: torch.Tensor, num_phy: int):
    """``num_phy`` slots for the items of ``weight: float32[X, k]``: each extra slot to the item
    with the largest load per replica. Returns ``(phy2log, rank, count)``."""
    rows, k = weight.shape
    phy2log = torch.arange(num_phy, dtype=torch.int64).repeat(rows, 1)
    rank = torch.zeros(rows, num_phy, dtype=torch.int64)
    count = torch.ones(rows, k, dtype=torch.int64)
    r = torch.arange(rows, dtype=torch.int64)
    for j in range(k, num_phy):
        pick = (weight / count).max(dim=-1).indices
        phy2log[:, j] = pick
        rank[:, j] = count[r, pick]
        count[r, pick] += 1
    return phy2log, rank, count


def _invert(perm: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(perm)
    out.scatter_(1, perm, torch.arange(perm.size(1), dtype=torch.int64).expand(perm.shape))
    return out


def _hierarchical(weight: torch.Tensor, num_phy: int, groups: int, nodes: int, gpus: int):
    L, E = weight.shape
    gsize, per_gpu = E // groups, num_phy // gpus
    # nodes get groups; experts renumbered node by node
    gpack, grank = _packing(weight.unflatten(-1, (groups, gsize)).sum(-1), nodes)
    log2mlog = (
        ((gpack * (groups // nodes) + grank) * gsize).unsqueeze(-1)
        + torch.arange(gsize, dtype=torch.int64)
    ).flatten(-2)
    mlog2log = _invert(log2mlog)
    # replicas inside each node
    node_w = weight.gather(-1, mlog2log).view(-1, E // nodes)
    phy2mlog, phyrank, cnt = _replicate(node_w, num_phy // nodes)
    # replicas onto the node's GPUs
    phy_w = (node_w / cnt).gather(-1, phy2mlog)
    gpu, slot = _packing(phy_w, gpus // nodes)
    pphy2phy = _invert(gpu * per_gpu + slot)
    pphy2mlog = phy2mlog.gather(-1, pphy2phy)
    offsets = torch.arange(0, E, E // nodes, dtype=torch.int64).view(1, -1, 1)
    pphy2mlog = (pphy2mlog.view(L, nodes, -1) + offsets).flatten(-2)
    pphyrank = phyrank.gather(-1, pphy2phy).view(L, -1)
    logcnt = cnt.view(L, -1).gather(-1, log2mlog)
    return mlog2log.gather(-1, pphy2mlog), pphyrank, logcnt


def rebalance(load, num_slots: int, num_groups: int, num_nodes: int, num_gpus: int) -> np.ndarray:
    """``phy2log: int64[L, P]`` for ``load: float[L, E]`` as vLLM's default policy places it."""
    weight = torch.as_tensor(np.asarray(load)).float()
    if num_groups % num_nodes == 0:
        phy2log, rank, cnt = _hierarchical(weight, num_slots, num_groups, num_nodes, num_gpus)
    else:
        phy2log, rank, cnt = _hierarchical(weight, num_slots, 1, 1, num_gpus)
    # vLLM also returns log2phy, padded to one more than the redundant slots
    L, E = weight.shape
    width = num_slots - E + 1
    log2phy = torch.full((L, E, width), -1, dtype=torch.int64)
    log2phy.view(L, -1).scatter_(
        -1, phy2log * width + rank, torch.arange(num_slots, dtype=torch.int64).expand(L, -1)
    )
    return phy2log.numpy()
