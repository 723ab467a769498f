"""Dispatch policies: which replica slot serves each (token, k) pick of a logical expert.

The single definition of ``even``, ``random``, ``weighted``, ``local_first`` and ``lp``, from the
placement tables only, as a runtime would; the executor and ``eplb.evaluation.traffic`` both
call it, so their choices agree for the same seed. Rules: docs/core.md, "Dispatch policies".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from eplb.args import as_int_array, check_seed, check_type
from eplb.errors import InputError
from eplb.executor import minmax
from eplb.placement import Placement
from eplb.registry import Registry


@dataclass(frozen=True)
class Dispatch:
    """A registered dispatch policy: ``fn(ids, placement, layer, rank, seed) -> int64[N, K]``
    slots; ``rank`` (source GPU of each token, ``int64[N]``) is None unless ``needs_rank``."""

    fn: Callable[..., np.ndarray]
    needs_rank: bool = False


DISPATCH: Registry[Dispatch] = Registry("dispatch policy")


def _policy(name: str, *, needs_rank: bool = False):
    def deco(fn):
        DISPATCH.add(name, Dispatch(fn, needs_rank))
        return fn

    return deco


def check_policy(policy: str) -> str:
    """``policy`` if it names a registered dispatch policy (else `InputError`)."""
    DISPATCH.get(policy)
    return policy


def _layer(placement: Placement, layer_index: int) -> int:
    check_type("placement", placement, Placement, "an eplb.Placement")
    L = placement.num_layers
    if isinstance(layer_index, bool) or not isinstance(layer_index, (int, np.integer)):
        raise InputError(f"layer_index must be an integer, got {layer_index!r}")
    if not -L <= layer_index < L:
        raise InputError(f"layer_index {layer_index} is outside the placement's {L} layers")
    return int(layer_index) % L


def dispatch_table(placement: Placement, layer_index: int = 0) -> np.ndarray:
    """``int64[G, E]``: the slot each source GPU sends expert ``e`` to under ``local_first``."""
    layer = _layer(placement, layer_index)
    topo = placement.topology
    l2p = placement.log2phy[layer]  # [E, R]
    valid = l2p >= 0
    gpu = np.where(valid, l2p // topo.slots_per_gpu, -1)  # [E, R]
    node = np.where(valid, gpu // topo.gpus_per_node, -1)
    src = np.arange(topo.num_gpus)
    same_gpu = gpu[None] == src[:, None, None]  # [G, E, R]
    same_node = node[None] == topo.node_of_gpu[:, None, None]
    anywhere = np.broadcast_to(valid[None], same_gpu.shape)
    tier = np.where(
        same_gpu.any(-1, keepdims=True),
        same_gpu,
        np.where(same_node.any(-1, keepdims=True), same_node, anywhere),
    )
    count = tier.sum(-1)  # [G, E], >= 1 for a valid placement
    pick = src[:, None] % np.maximum(count, 1)
    position = np.cumsum(tier, axis=-1) - 1  # index among candidates at each replica
    chosen = tier & (position == pick[..., None])
    replica = chosen.argmax(-1)
    return np.take_along_axis(np.broadcast_to(l2p[None], same_gpu.shape), replica[..., None], -1)[
        ..., 0
    ]


def route(
    topk_ids: np.ndarray,
    placement: Placement,
    *,
    layer_index: int = 0,
    policy: str = "even",
    token_rank: np.ndarray | None = None,
    seed: int = 0,
) -> np.ndarray:
    """Map logical picks ``topk_ids: int[N, K]`` to replica slots ``int64[N, K]``.

    ``token_rank: int[N]`` (source GPU of each token) is required by ``local_first``.
    """
    spec = DISPATCH.get(policy)
    layer = _layer(placement, layer_index)
    seed = check_seed("seed", seed)
    ids = as_int_array("topk_ids", topk_ids, ndim=2)
    E = placement.num_experts
    if ids.size and (ids.min() < 0 or ids.max() >= E):
        raise InputError(f"topk_ids must be expert ids in 0..{E - 1}")
    ids = ids.astype(np.int64, copy=False)
    rank = None
    if spec.needs_rank and token_rank is None:
        raise InputError(f"the {policy} policy needs token_rank (source GPU of each token)")
    if token_rank is not None:  # checked also where the policy does not use it
        rank = as_int_array("token_rank", token_rank)
        G = placement.topology.num_gpus
        if rank.shape != (len(ids),):
            raise InputError(f"token_rank must be int[{len(ids)}], got shape {rank.shape}")
        if rank.size and (rank.min() < 0 or rank.max() >= G):
            raise InputError(f"token_rank must be GPU ids in 0..{G - 1}")
        rank = rank.astype(np.int64) if spec.needs_rank else None
    return spec.fn(ids, placement, layer, rank, seed)


@_policy("even")
def _even(ids, placement, layer, rank, seed):
    N, K = ids.shape
    cnt = placement.logcnt[layer][ids]
    replica = np.arange(N * K, dtype=np.int64).reshape(N, K) % cnt
    return placement.log2phy[layer][ids, replica]


@_policy("random")
def _random(ids, placement, layer, rank, seed):
    cnt = placement.logcnt[layer][ids]
    u = np.random.default_rng([seed, layer]).random(ids.shape)
    replica = np.minimum((u * cnt).astype(np.int64), cnt - 1)
    return placement.log2phy[layer][ids, replica]


@_policy("local_first", needs_rank=True)
def _local_first(ids, placement, layer, rank, seed):
    return dispatch_table(placement, layer)[rank[:, None], ids]


@_policy("weighted")
def _weighted(ids, placement, layer, rank, seed):
    l2p = placement.log2phy[layer]
    cnt = placement.logcnt[layer][ids]
    u = np.random.default_rng([seed, layer]).random(ids.shape)
    share = placement.share[layer]  # [P]
    shares = np.where(l2p >= 0, share[np.maximum(l2p, 0)], 0.0)  # [E, R]
    cum = np.cumsum(shares, axis=1)
    cum /= cum[:, -1:]
    # first replica whose cumulative share exceeds u
    replica = np.minimum((u[..., None] >= cum[ids]).sum(-1), cnt - 1)
    return l2p[ids, replica]


@_policy("lp", needs_rank=True)
def _lp(ids, placement, layer, rank, seed):
    return _lp_route(ids, rank, placement, layer)


# every registered dispatch policy, in the order the docs list them
POLICIES = tuple(DISPATCH.names())


def gpu_slots(placement: Placement, layer: int) -> np.ndarray:
    """``int64[E, G]``: lowest slot of expert ``e`` on GPU ``g`` (``-1`` if none)."""
    topo = placement.topology
    E, G, S = placement.num_experts, topo.num_gpus, topo.slots_per_gpu
    slots = np.arange(topo.num_slots)[::-1]  # reversed: the lowest slot is written last
    slots = slots[placement.phy2log[layer][slots] >= 0]  # empty slots (-1) hold no expert
    table = np.full((E, G), -1, dtype=np.int64)
    table[placement.phy2log[layer][slots], slots // S] = slots
    return table


def lp_plan(amounts: np.ndarray, placement: Placement, layer_index: int = 0) -> np.ndarray:
    """The ``lp`` policy's plan for one batch: ``int64[G, E, G]`` (``float64`` for float
    ``amounts``) picks of expert ``e`` from source
    GPU ``s`` served on GPU ``g``, for ``amounts: [G, E]`` picks per (source GPU, expert) of
    layer ``layer_index``. Integers (whole picks) are split exactly; floats (e.g. expected
    counts) follow the same rule on amounts scaled to integers (about 2**40 picks in all) and
    back, so within about 1e-12 of the layer's picks. Rules: docs/core.md, "Dispatch policies"."""
    layer = _layer(placement, layer_index)
    G, E = placement.topology.num_gpus, placement.num_experts
    amounts = np.asarray(amounts)
    if amounts.shape != (G, E):
        raise InputError(f"amounts must be [{G}, {E}] (source GPU x expert), got {amounts.shape}")
    if amounts.dtype.kind in "iub":
        if (amounts < 0).any():
            raise InputError("amounts must be picks >= 0")
        return _plan(amounts.astype(np.int64), placement, layer)[0]
    amounts = amounts.astype(np.float64)
    if not np.isfinite(amounts).all() or (amounts < 0).any():
        raise InputError("amounts must be finite picks >= 0")
    total = float(amounts.sum())
    scale = 2.0**40 / total if total > 0 else 1.0
    out = _plan(np.rint(amounts * scale).astype(np.int64), placement, layer)[0]
    return out / scale


def _plan(work: np.ndarray, placement: Placement, layer: int):
    """`lp_plan` on integer ``work: int64[G, E]``; also returns the flexible experts
    ``int64[J]`` (on two or more GPUs) and each expert's home GPU ``int64[E]`` (-1 if
    flexible)."""
    topo = placement.topology
    G, E, N = topo.num_gpus, placement.num_experts, topo.num_nodes
    held = gpu_slots(placement, layer) >= 0  # [E, G]
    ngpu = held.sum(1)
    flex = np.nonzero(ngpu >= 2)[0]
    home = np.where(ngpu == 1, held.argmax(1), -1)
    single = np.nonzero(ngpu == 1)[0]
    out = np.zeros((G, E, G), dtype=np.int64)
    out[:, single, home[single]] = work[:, single]
    fixed = np.bincount(home[single], weights=work[:, single].sum(0), minlength=G)
    if flex.size:
        arc_j, arc_g = np.nonzero(held[flex])
        node = topo.node_of_gpu
        per_node = np.zeros((N, flex.size), dtype=np.int64)
        np.add.at(per_node, node, work[:, flex])
        _, flow = minmax.split(
            work[:, flex].sum(0),
            fixed.astype(np.int64),
            arc_j,
            arc_g,
            source_nodes=per_node.T,
            gpu_node=node,
        )
        out[:, flex, :] = minmax.plan(work[:, flex].T, flow, arc_j, arc_g, node).transpose(1, 0, 2)
    return out, flex, home


def _lp_route(ids: np.ndarray, rank: np.ndarray, placement: Placement, layer: int) -> np.ndarray:
    """``lp`` slots ``int64[N, K]`` of one batch: `lp_plan` of its pick counts; the picks of a
    (source GPU, flexible expert) group take the plan's GPUs in ascending order, in token
    order."""
    topo = placement.topology
    G, E = topo.num_gpus, placement.num_experts
    N, K = ids.shape
    flat = ids.ravel()
    key = np.repeat(rank, K) * E + flat  # (source GPU, expert) of every pick
    amounts = np.bincount(key, minlength=G * E).reshape(G, E)
    table, flex, home = _plan(amounts, placement, layer)
    dest = home[flat]
    moving = np.nonzero(dest < 0)[0]
    if moving.size:
        sub = key[moving]
        sub = sub.astype(np.uint16) if G * E <= 2**16 else sub  # radix sort for 16 bits
        order = np.argsort(sub, kind="stable")
        per = table[:, flex, :].reshape(-1)  # in (source, flexible expert, GPU) key order
        dest[moving[order]] = np.repeat(np.tile(np.arange(G), per.size // G), per)
    return gpu_slots(placement, layer)[flat, dest].reshape(N, K)
