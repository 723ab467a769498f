"""SGLang's ``deepseek_vec`` EPLB algorithm, re-stated for benchmarks.

Read: sgl-project/sglang ``python/sglang/srt/eplb/eplb_algorithms/deepseek_vec.py`` at commit
68836b60f99d117ec96b5c8d7e49400724f25aca. Not the reference algorithm step for step:
- replication is vectorised over layers *and* over chunks of slots (the whole layer, or one
  node in the hierarchical variant): each of the chunk's redundant slots goes, in one torch
  step for all rows, to the expert whose extra replica lowers the chunk's max load per replica
  most (summed over history steps; ``+ 1e-4 * index`` breaks ties toward the higher index);
- there is no balanced packing onto GPUs: a chunk's replicas are sorted by load per replica
  (``argsort``) and dealt to its GPUs in snake order (GPU g gets ranks g, 2G-1-g, 2G+g, ...),
  one ``gather`` for everything; ``log2phy`` is remapped through the inverse permutation;
- the hierarchical variant packs groups onto nodes with a Python loop over rows and sorted
  groups (``min`` over nodes with a ``(full, tokens)`` key, 0-d tensor sums), as the reference.
So its replica counts are the reference's (up to ties) but its GPU layout, hence max load,
differs where a GPU holds more than one slot.
"""

from __future__ import annotations

import numpy as np
import torch


def _pack_groups(group_w: torch.Tensor, nodes: int) -> torch.Tensor:
    """Groups of ``group_w: float32[L, K]`` onto ``nodes`` nodes of ``K / nodes`` groups each;
    ``int64[L, K]``: node-major position of each group."""
    L, K = group_w.shape
    per = K // nodes
    order = group_w.float().sort(-1, descending=True).indices
    out = torch.full_like(group_w, -1, dtype=torch.int64)
    for layer in range(L):
        tokens = [0] * nodes
        taken = [0] * nodes

        def key(n: int, taken=taken, tokens=tokens):
            return (1, 0) if taken[n] >= per else (0, tokens[n])

        for g in order[layer]:
            n = min(range(nodes), key=key)
            out[layer, g] = n * per + taken[n]
            tokens[n] += group_w[layer, g]
            taken[n] += 1
    return out


def _chunkwise(tokens: torch.Tensor, P: int, local: int, chunk: int):
    """Replicate and lay out ``tokens: float32[S, L, E]`` (S history steps) on ``P`` slots in
    chunks of ``chunk`` slots, ``local`` slots per GPU. Returns ``(phy2log: int32[L, P],
    log2phy: int32[L, E, P - E + 1], count: int32[L, E])``."""
    S, L, E = tokens.shape
    extra = P - E
    C = P // chunk
    e, r = E // C, extra // C
    phy2log = torch.empty(L, P, dtype=torch.int)
    log2phy = torch.full((L, E, extra + 1), -1, dtype=torch.int)
    count = torch.ones(L, E, dtype=torch.int)
    rows = torch.arange(L * C, dtype=torch.int)
    chunk_ids = torch.arange(C, dtype=torch.int)
    phy2log.view(L, C, chunk)[:, :, :e] = torch.arange(E, dtype=torch.int).view(C, e)
    log2phy[:, :, 0] = (
        torch.arange(e, dtype=torch.int).expand(C, e) + chunk_ids[:, None] * chunk
    ).view(E)
    distinct = tokens + torch.arange(E, dtype=torch.int) * 1e-4
    for i in range(r):
        now = (distinct / count).view(S, L, C, e)
        after = (tokens / (count + 1)).view_as(now)
        top, arg = now.max(-1, keepdim=True)
        top = top.expand_as(now).contiguous()
        now.scatter_(-1, arg, after.gather(-1, arg))
        top.scatter_(-1, arg, now.max(-1, keepdim=True).values)
        pick = top.sum(0).argmin(-1)  # [L, C]: the expert to replicate in each chunk
        phy2log.view(L, C, chunk)[:, :, e + i] = pick + chunk_ids * e
        flat = pick.view(L * C)
        ordinal = count.view(L * C, e).gather(-1, flat.view(-1, 1)).squeeze(1)
        slot = (chunk_ids * chunk + e + i).expand(L, C).flatten()
        log2phy.view(L * C, e, extra + 1)[rows, flat, ordinal] = slot
        count.view(L * C, e)[rows, flat] += 1
    if local > 1:  # deal each chunk's replicas to its GPUs, heaviest first, in snake order
        p2l = phy2log.to(torch.int64)
        per_replica = tokens.sum(0).gather(-1, p2l) / count.gather(-1, p2l)
        idx = per_replica.view(L, C, chunk).argsort(-1, descending=True)
        idx += torch.arange(0, P, chunk, dtype=idx.dtype)[None, :, None]
        idx = idx.view(L, C, local, chunk // local)
        idx[:, :, 1::2, :] = idx[:, :, 1::2, :].flip(-1)
        idx = idx.transpose(2, 3).reshape(L, P)
        phy2log = phy2log.gather(-1, idx)
        empty = log2phy == -1
        log2phy[empty] = 0
        log2phy = (
            idx.argsort(-1).gather(-1, log2phy.view(L, -1).to(torch.int64))
            .view_as(log2phy).to(torch.int)
        )
        log2phy[empty] = -1
    return phy2log, log2phy, count


def _hierarchical(tokens: torch.Tensor, P: int, local: int, groups: int, nodes: int):
    S, L, E = tokens.shape
    gsize = E // groups
    perm = _pack_groups(tokens.sum(0).unflatten(-1, (groups, -1)).sum(-1), nodes)
    log2mlog = ((perm * gsize).unsqueeze(-1) + torch.arange(gsize, dtype=torch.int64)).flatten(-2)
    mlog2log = torch.empty_like(log2mlog)
    mlog2log.scatter_(1, log2mlog, torch.arange(E, dtype=torch.int64).expand(L, -1))
    node_tokens = tokens.gather(2, mlog2log.unsqueeze(0).expand(S, -1, -1))
    phy2mlog, mlog2phy, mcount = _chunkwise(node_tokens, P, local, P // nodes)
    phy2log = mlog2log.gather(1, phy2mlog.to(torch.int64))
    mlog2phy.gather(1, log2mlog.unsqueeze(-1).expand(-1, -1, mlog2phy.size(-1)))
    mcount.gather(1, log2mlog)
    return phy2log


def rebalance(load, num_slots: int, num_groups: int, num_nodes: int, num_gpus: int) -> np.ndarray:
    """``phy2log: int64[L, P]`` for ``load: float[L, E]`` (one history step) as SGLang's
    ``deepseek_vec`` places it (``deepseek_vec_hierarchical`` iff ``num_groups % num_nodes
    == 0``, DeepSeek's rule)."""
    tokens = torch.as_tensor(np.asarray(load)).float().cpu()[None]
    local = num_slots // num_gpus
    if num_groups % num_nodes == 0:
        out = _hierarchical(tokens, num_slots, local, num_groups, num_nodes)
    else:
        out = _chunkwise(tokens, num_slots, local, num_slots)[0]
    return out.to(torch.int64).numpy()
