"""Relabel interchangeable GPUs and nodes so a new placement keeps the previous one's replicas.

Permuting GPUs inside a node, whole nodes, and slots inside a GPU changes no load; `relabel`
picks the permutation keeping the most replicas in place (Hungarian matchings of GPUs per
node pair, then of nodes). docs/solvers.md, "Low-migration rebalancing".
"""

from __future__ import annotations

import numpy as np

from eplb.errors import InputError
from eplb.placement import Placement
from eplb.solvers.primitives.layout import gpu_counts


def check_pair(old: Placement, new: Placement) -> None:
    """Refuse two placements that are not of one problem (same topology, shape, experts)."""
    if not isinstance(old, Placement) or not isinstance(new, Placement):
        raise InputError("replicas_moved needs two Placements")
    if old.topology != new.topology or old.phy2log.shape != new.phy2log.shape:
        raise InputError(
            f"placements differ in shape: {old!r} vs {new!r}; compare placements of one problem"
        )
    if old.num_experts != new.num_experts:
        raise InputError(f"placements have {old.num_experts} and {new.num_experts} experts")


def _ordinal(slot_e: np.ndarray) -> np.ndarray:
    """``int64[L, G, S]``: how many earlier slots of the same GPU hold the same expert."""
    S = slot_e.shape[2]
    same = slot_e[..., :, None] == slot_e[..., None, :]  # [L, G, S, S]
    earlier = np.tril(np.ones((S, S), dtype=bool), -1)
    return (same & earlier).sum(-1)


def overlap(new_e: np.ndarray, old_e: np.ndarray, num_experts: int) -> np.ndarray:
    """``int64[L, G, G]`` the value of new GPU ``g`` taking old GPU ``h``'s place: its slots
    whose expert ``h`` held (the complement of `eplb.moves`' moves) times ``S + 1``, plus the
    replicas kept one for one (a tie-break).

    ``new_e, old_e: int64[L, G, S]`` slot tables (``-1``: an empty slot, which holds nothing
    to keep).
    """
    L, G, S = new_e.shape
    old_cnt = gpu_counts(old_e.reshape(L, -1), num_experts, S)  # [L, G(h), E]
    layer = np.arange(L)[:, None, None, None]
    h = np.arange(G)[None, None, :, None]
    held = old_cnt[layer, h, np.maximum(new_e, 0)[:, :, None, :]]  # [L, G(g), G(h), S]
    # a slot is kept when its GPU held that expert (`eplb.moves`: a local copy crosses no
    # link); an empty slot keeps none. Ties go to the most replicas kept one for one (the
    # multiset overlap), so a permuted placement maps back exactly.
    used = (new_e >= 0)[:, :, None, :]
    kept = ((held > 0) & used).sum(-1)
    same = ((_ordinal(new_e)[:, :, None, :] < held) & used).sum(-1)
    return kept * (S + 1) + same


def best_relabel(ov: np.ndarray, gpus_per_node: int) -> np.ndarray:
    """``int64[G]``: old position for each new GPU, maximising kept replicas for one layer.

    ``ov: int[G, G]`` overlaps; nodes map to nodes as blocks, GPUs inside a node freely.
    """
    from scipy.optimize import linear_sum_assignment  # lazy: scipy is heavy; start-up avoids it

    G = ov.shape[0]
    gpn = gpus_per_node
    N = G // gpn
    blocks = ov.reshape(N, gpn, N, gpn).transpose(0, 2, 1, 3)  # [a, b, gpn, gpn]
    inner = np.empty((N, N, gpn), dtype=np.int64)
    # a block without overlap is the all-zero matrix: solved once, its answer reused
    r0, c0 = linear_sum_assignment(np.zeros((gpn, gpn), dtype=ov.dtype), maximize=True)
    inner[:, :, r0] = c0
    for a, b in zip(*np.nonzero(blocks.any(axis=(2, 3))), strict=True):
        r, c = linear_sum_assignment(blocks[a, b], maximize=True)
        inner[a, b, r] = c
    value = np.take_along_axis(blocks, inner[..., None], -1).sum((-2, -1)).astype(np.float64)
    ra, cb = linear_sum_assignment(value, maximize=True)
    target = np.empty(G, dtype=np.int64)
    for a, b in zip(ra, cb, strict=True):
        target[a * gpn : (a + 1) * gpn] = b * gpn + inner[a, b]
    return target


def _order_slots(new_slots: np.ndarray, old_slots: np.ndarray) -> np.ndarray:
    """``int64[M, S]``: for each of ``M`` GPUs, the permutation of ``new_slots: int[M, S]``
    putting experts back in their slots of ``old_slots: int[M, S]``: old slot ``k`` (in
    order) takes the first unused new slot holding its expert; the slots left over fill the
    remaining positions in their order."""
    M, S = new_slots.shape
    perm = np.full((M, S), -1, dtype=np.int64)
    used = np.zeros((M, S), dtype=bool)
    rows = np.arange(M)
    for k in range(S):
        hit = (new_slots == old_slots[:, k, None]) & ~used  # [M, S]
        first = hit.argmax(1)
        found = hit[rows, first]
        perm[found, k] = first[found]
        used[rows[found], first[found]] = True
    # per row, the unused new slots (in order) go to the unmatched positions (in order):
    # both row-major listings hold the same number of entries per row
    perm[perm < 0] = np.nonzero(~used)[1]
    return perm


def relabel(
    placement: Placement, previous: Placement, *, classes: np.ndarray | None = None
) -> Placement:
    """``placement`` with GPUs, nodes and slots relabeled to keep ``previous``'s replicas.

    The multiset of GPU loads, each GPU's set of replicas (up to relabeling), node membership
    of groups and the shares of every replica are unchanged. ``classes: int[L, G]``: a GPU
    of ``placement`` only takes the position of a GPU of its own class in that layer (e.g. its
    used-slot count, so each position's expert memory summed over layers is kept; the
    identity always qualifies, so every GPU finds one). Empty slots (``-1``) may be in either
    placement. Meta that names GPUs or nodes is the caller's to map (`relabel_map`).
    """
    return relabel_map(placement, previous, classes=classes)[0]


def node_map(target: np.ndarray, gpus_per_node: int) -> np.ndarray:
    """``int64[L, N]``: ``out[l, a]`` is the node that node ``a`` of the placement became in
    layer ``l``, for ``target: int64[L, G]`` of `relabel_map` (nodes move as blocks)."""
    return target[:, ::gpus_per_node] // gpus_per_node


def relabel_map(
    placement: Placement, previous: Placement, *, classes: np.ndarray | None = None
) -> tuple[Placement, np.ndarray]:
    """`relabel`, and ``target: int64[L, G]``: the GPU that GPU ``g`` of ``placement`` became in
    each layer (`node_map` gives the nodes'), to carry meta that names GPUs or nodes (e.g.
    ``group_to_node``) over to the relabeled placement."""
    check_pair(previous, placement)
    topo = placement.topology
    L, P = placement.phy2log.shape
    G, S, gpn = topo.num_gpus, topo.slots_per_gpu, topo.gpus_per_node
    new_e = placement.phy2log.reshape(L, G, S)
    old_e = previous.phy2log.reshape(L, G, S)
    share = None if placement.replica_share is None else placement.replica_share.reshape(L, G, S)
    ov = overlap(new_e, old_e, placement.num_experts)
    if classes is not None:  # a class match outweighs every overlap a layer can have
        cls = np.asarray(classes).reshape(L, G)
        ov = ov + (P + 1) * (cls[:, :, None] == cls[:, None, :])
    out_e = np.empty_like(new_e)
    out_s = None if share is None else np.empty_like(share)
    # target[layer, g]: the old GPU position new GPU g takes
    target = np.stack([best_relabel(ov[layer], gpn) for layer in range(L)]).reshape(-1)
    layer = np.repeat(np.arange(L), G)
    old_at = old_e[layer, target]  # [L * G, S] old slots of each new GPU's position
    perm = _order_slots(new_e.reshape(L * G, S), old_at)
    rows = np.arange(L * G)[:, None]
    out_e[layer, target] = new_e.reshape(L * G, S)[rows, perm]
    if share is not None:
        out_s[layer, target] = share.reshape(L * G, S)[rows, perm]
    out = Placement(
        out_e.reshape(L, P),
        placement.num_experts,
        topo,
        None if out_s is None else out_s.reshape(L, P),
        placement.meta,
        placement.layer_ids,
    )
    return out, target.reshape(L, G)
