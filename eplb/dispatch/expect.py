"""Expected routing in counts mode: the co-occurrence model a dispatch policy's expected shares
go through to give the probability that a token visits a GPU or a node (the per-node RDMA
dedup of the traffic model). Primitives, no policy: `Dispatch.expected_visits` (per source)
and `Dispatch.routing` + `visit_probabilities` (every source alike, the fast path) use them.

The model (docs/evaluation.md, `eplb.evaluation.traffic`): a token from source ``s`` includes
expert ``e`` with probability ``p[s, e]``; with expert groups (``num_groups``, a token selects
``topk_groups`` of them), it selects group ``j`` with probability ``q[s, j]`` and a member
expert with ``r = p / q`` (`group_probs`). A pick of ``e`` lands on GPU ``g`` with the policy's
share ``w[e, g]``; then ``P(no pick on g) = prod_j (1 - q_j + q_j prod_{e in j} (1 - r_e
w[e, g]))`` (`log_miss`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from eplb.placement import Placement
from eplb.topology import Topology

__all__ = ["SlotRouting", "group_model", "group_probs", "log_miss", "merge_bins",
           "merged_share", "slot_routing", "source_keys", "visit_probabilities", "with_share"]


# ------------------------------------------------------------------ per source
def group_probs(p: np.ndarray, top_k: int, groups: tuple[int, int] | None):
    """Group model: ``gid: int64[E]``, ``q: float64[L, G, NG]`` (probability a token selects
    each group) and ``r: float64[L, G, E]`` (inclusion of ``e`` given its group is selected)
    from inclusion probabilities ``p: float64[L, G, E]``; ``groups``: ``(num_groups,
    topk_groups)`` or None (no limit: one group)."""
    L, G, E = p.shape
    if groups is None:
        return np.zeros(E, dtype=np.int64), np.ones((L, G, 1)), p
    num_groups, topk_groups = groups
    gid = np.arange(E, dtype=np.int64) // (E // num_groups)
    pg = p.reshape(L, G, num_groups, E // num_groups)
    mass = pg.sum(-1)  # expected picks per token in each group
    q = np.clip(mass * (topk_groups / top_k), pg.max(-1), 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(q[..., gid] > 0, p / q[..., gid], 0.0)
    return gid, q, np.minimum(r, 1.0)


def source_keys(L: int, G: int, NG: int) -> np.ndarray:
    """``int64[L, G, 1]``: ``(layer * G + source) * NG``, the first `log_miss` key of each
    (layer, source) cell."""
    return (np.arange(L)[:, None, None] * G + np.arange(G)[None, :, None]) * NG


def log_miss(term, key, q, bins):
    """``float64[L, G, bins]``: log P(no pick in bin) from per-pick ``term`` (log of the
    chance that a pick of that expert does not land in the bin, given its group is selected)
    scattered by ``key = ((l * G + s) * NG + group) * bins + bin``; ``q: float64[L, G, NG]``."""
    L, G, NG = q.shape
    inner = np.exp(np.bincount(key.ravel(), term.ravel(), minlength=L * G * NG * bins))
    inner = inner.reshape(L, G, NG, bins)
    with np.errstate(divide="ignore"):
        return np.log(1.0 - q[..., None] + q[..., None] * inner).sum(2)


def merged_share(phy2log: np.ndarray, weight: np.ndarray, per_bin: int) -> np.ndarray:
    """``float64[L, P]``: ``weight`` summed over slots of one expert inside each bin of
    ``per_bin`` consecutive slots, held by the first such slot (others 0)."""
    L, P = phy2log.shape
    B = P // per_bin
    e = phy2log.reshape(L * B, per_bin)
    w = weight.reshape(L * B, per_bin)
    order = np.argsort(e, axis=1, kind="stable")
    es = np.take_along_axis(e, order, 1)
    ws = np.take_along_axis(w, order, 1)
    start = np.ones_like(es, dtype=bool)
    start[:, 1:] = es[:, 1:] != es[:, :-1]
    idx = np.flatnonzero(start.ravel())
    merged = np.zeros(ws.size)
    merged[idx] = np.add.reduceat(ws.ravel(), idx)
    out = np.empty_like(merged.reshape(L * B, per_bin))
    np.put_along_axis(out, order, merged.reshape(L * B, per_bin), 1)
    return out.reshape(L, P)


# ------------------------------------------------- every source alike (the fast path)
# When every source's picks follow one distribution (``load=``, or the step-time model's
# steps), the visit probabilities do not depend on the source: the group-limited model is
# evaluated once per (layer, GPU) instead of per (layer, source, GPU), in O(L * P), from
# tables prepared once per placement (`slot_routing`). Same model, same numbers
# (tests/test_serving_steptime compares the two paths).
@dataclass(frozen=True, eq=False)
class SlotRouting:
    """Per-placement tables of the fast path (`slot_routing`).

    Shape: ``expert: int64[L, P]`` expert of each slot (0 for an empty one); ``share:
    float64[L, P]`` share of its expert's picks a slot receives (0 when empty); ``w_gpu``,
    ``w_node: float64[L, P]`` that share summed over the expert's slots on the same GPU /
    node, held by the first such slot (others 0); ``key_gpu``, ``key_node: int64[L, P]``
    bincount keys ``(layer, GPU or node, group)`` of each slot.
    """

    expert: np.ndarray
    share: np.ndarray
    w_gpu: np.ndarray
    w_node: np.ndarray
    key_gpu: np.ndarray
    key_node: np.ndarray


def merge_bins(expert: np.ndarray, share: np.ndarray, per_bin: int) -> np.ndarray:
    """`merged_share` by pairwise comparison inside each bin (``float64[L, P]``; the fast
    path's tables, kept apart from the sort-based one so each path's rounding stays put)."""
    L, P = expert.shape
    e = expert.reshape(L, P // per_bin, per_bin)
    w = share.reshape(L, P // per_bin, per_bin)
    same = e[..., :, None] == e[..., None, :]  # [L, B, S, S]
    idx = np.arange(per_bin)
    earlier = same & (idx[None, :] < idx[:, None])  # a same-expert slot before this one
    first = ~earlier.any(-1)
    merged = (same * w[..., None, :]).sum(-1)
    return np.where(first, merged, 0.0).reshape(L, P)


def slot_routing(
    placement: Placement, share: np.ndarray, num_groups: int, topk_groups: int
) -> SlotRouting:
    """`SlotRouting` of ``placement`` whose slots get ``share: float64[L, P]`` of their
    expert's picks (zeroed on empty slots), with ``num_groups`` expert groups of which a token
    selects ``topk_groups``."""
    topo = placement.topology
    empty = placement.phy2log < 0  # slots of failed GPUs: no expert, no picks
    expert = np.maximum(placement.phy2log, 0)
    L = expert.shape[0]
    if empty.any():
        share = np.where(empty, 0.0, share)
    ng = num_groups if topk_groups < num_groups else 1
    group = expert // (placement.num_experts // ng)
    rows = np.arange(L)[:, None]
    key_gpu = (rows * topo.num_gpus + topo.gpu_of_slot[None, :]) * ng + group
    key_node = (rows * topo.num_nodes + topo.node_of_slot[None, :]) * ng + group
    return SlotRouting(
        expert,
        share,
        merge_bins(expert, share, topo.slots_per_gpu),
        merge_bins(expert, share, topo.slots_per_gpu * topo.gpus_per_node),
        key_gpu,
        key_node,
    )


def with_share(rt: SlotRouting, share: np.ndarray, topology: Topology) -> SlotRouting:
    """``rt`` with another ``share: float64[L, P]`` per slot (e.g. the ``lp`` split of one
    step, `lp_shares`): the same slots and keys, merged weights recomputed."""
    return SlotRouting(
        rt.expert,
        share,
        merge_bins(rt.expert, share, topology.slots_per_gpu),
        merge_bins(rt.expert, share, topology.slots_per_gpu * topology.gpus_per_node),
        rt.key_gpu,
        rt.key_node,
    )


def group_model(p: np.ndarray, top_k: int, num_groups: int, topk_groups: int):
    """The group-limited model (`group_probs`) for sources alike: ``q: float64[L, NG]`` (a
    token selects a group; ``NG = 1`` without a limit) and ``r: float64[L, E]`` (an expert of
    a selected group) from inclusion probabilities ``p: float64[L, E]``."""
    groups = None if topk_groups >= num_groups else (num_groups, topk_groups)
    if groups is None:
        return np.ones((p.shape[0], 1)), p
    _, q, r = group_probs(p[:, None, :], top_k, groups)
    return q[:, 0], r[:, 0]


def visit_probabilities(
    routing: SlotRouting,
    p: np.ndarray,
    topology: Topology,
    *,
    top_k: int,
    num_groups: int,
    topk_groups: int,
) -> tuple[np.ndarray, np.ndarray]:
    """``v: float64[L, G]`` and ``vn: float64[L, N]``: probability that a token visits each
    GPU and each node, from inclusion probabilities ``p: float64[L, E]`` (``top_k`` x each
    expert's share of the picks, clipped at 1) routed by ``routing``."""
    q, r = group_model(p, top_k, num_groups, topk_groups)
    L = p.shape[0]
    ng = q.shape[1]
    rs = np.take_along_axis(r, routing.expert, 1)
    out = []
    for w, key, bins in (
        (routing.w_gpu, routing.key_gpu, topology.num_gpus),
        (routing.w_node, routing.key_node, topology.num_nodes),
    ):
        with np.errstate(divide="ignore"):
            term = np.log1p(-np.minimum(rs * w, 1.0))
        inner = np.exp(np.bincount(key.ravel(), term.ravel(), minlength=L * bins * ng))
        inner = inner.reshape(L, bins, ng)
        if ng == 1:
            with np.errstate(divide="ignore"):  # a certain visit: log(0) = -inf, v = 1
                miss = np.log(inner[..., 0])
        else:
            qq = q[:, None, :]
            with np.errstate(divide="ignore"):
                miss = np.log(np.maximum(1.0 - qq + qq * inner, 0.0)).sum(-1)
        out.append(-np.expm1(miss))
    return out[0], out[1]
