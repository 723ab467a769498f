"""SGLang's ``deepseek`` EPLB algorithm (DeepSeek's reference ``eplb.py``), re-stated for
benchmarks.

Read: sgl-project/sglang ``python/sglang/srt/eplb/eplb_algorithms/deepseek.py`` at commit
06120cc8d77b198b925c6a04ef52ef4e218078f4 (and ``__init__.py``, commit 046f88cb, for the
``auto`` rule: hierarchical iff ``num_groups % num_nodes == 0``). Cost structure kept:
- everything in float32 torch tensors on the CPU;
- balanced packing sorts with ``Tensor.sort(descending=True)``, then loops in Python over rows
  and over the sorted items (0-d tensors), choosing the lightest non-full pack with ``min``
  over a generator; the pack totals are accumulated from 0-d tensor elements and the results
  written element by element into torch tensors;
- replication is a torch loop over the redundant slots (``(w / count).max(-1).indices``);
- ``log2phy`` is built with one ``scatter_``.
"""

from __future__ import annotations

import numpy as np
import torch


def _packing(weight: torch.Tensor, num_packs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Items of ``weight: float32[X, n]`` into packs of ``n / num_packs``: ``(pack, rank)``."""
    rows, n = weight.shape
    per = n // num_packs
    if per == 1:
        idx = torch.arange(n, dtype=torch.int64).expand(weight.shape)
        return idx, torch.zeros_like(weight, dtype=torch.int64)
    order = weight.float().sort(-1, descending=True).indices
    pack = torch.full_like(weight, -1, dtype=torch.int64)
    rank = torch.full_like(pack, -1)
    for r in range(rows):
        totals = [0] * num_packs
        sizes = [0] * num_packs
        for item in order[r]:
            p = min((q for q in range(num_packs) if sizes[q] < per), key=totals.__getitem__)
            pack[r, item] = p
            rank[r, item] = sizes[p]
            totals[p] += weight[r, item]
            sizes[p] += 1
    return pack, rank


def _replicate(weight: torch.Tensor, num_phy: int):
    """``num_phy`` slots for ``weight: float32[X, k]``: each extra slot to the item with the
    largest load per replica. Returns ``(phy2log, rank, count)``."""
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
    gpack, grank = _packing(weight.unflatten(-1, (groups, gsize)).sum(-1), nodes)
    log2mlog = (
        ((gpack * (groups // nodes) + grank) * gsize).unsqueeze(-1)
        + torch.arange(gsize, dtype=torch.int64)
    ).flatten(-2)
    mlog2log = _invert(log2mlog)
    node_w = weight.gather(-1, mlog2log).view(-1, E // nodes)
    phy2mlog, phyrank, cnt = _replicate(node_w, num_phy // nodes)
    gpu, slot = _packing((node_w / cnt).gather(-1, phy2mlog), gpus // nodes)
    pphy2phy = _invert(gpu * per_gpu + slot)
    offsets = torch.arange(0, E, E // nodes, dtype=torch.int64).view(1, -1, 1)
    pphy2mlog = (phy2mlog.gather(-1, pphy2phy).view(L, nodes, -1) + offsets).flatten(-2)
    return (
        mlog2log.gather(-1, pphy2mlog),
        phyrank.gather(-1, pphy2phy).view(L, -1),
        cnt.view(L, -1).gather(-1, log2mlog),
    )


def rebalance(load, num_slots: int, num_groups: int, num_nodes: int, num_gpus: int) -> np.ndarray:
    """``phy2log: int64[L, P]`` for ``load: float[L, E]`` as SGLang's ``deepseek`` (``auto``:
    ``deepseek_hierarchical`` iff ``num_groups % num_nodes == 0``) places it."""
    weight = torch.as_tensor(np.asarray(load)).float().cpu()
    if num_groups % num_nodes == 0:
        phy2log, rank, cnt = _hierarchical(weight, num_slots, num_groups, num_nodes, num_gpus)
    else:
        phy2log, rank, cnt = _hierarchical(weight, num_slots, 1, 1, num_gpus)
    L, E = weight.shape
    width = int(cnt.max().item())
    log2phy = torch.full((L, E, width), -1, dtype=torch.int64)
    log2phy.view(L, -1).scatter_(
        -1, phy2log * width + rank, torch.arange(num_slots, dtype=torch.int64).expand(L, -1)
    )
    return phy2log.numpy()
