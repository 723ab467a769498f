"""Tables the dispatch policies read from a placement: the checked layer row, each expert's slot
on each GPU, ``local_first``'s fixed table per source GPU, and the even split of an expert's
picks over its replicas. Primitives: no policy here (docs/core.md, "Dispatch policies")."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from eplb.args import check_type
from eplb.errors import InputError
from eplb.placement import Placement

__all__ = ["dispatch_stack", "dispatch_table", "dispatch_tables", "even_share", "gpu_slots",
           "layer_row"]


def layer_row(placement: Placement, layer_index: int) -> int:
    """The placement row ``layer_index`` names (negative counts from the end), checked."""
    check_type("placement", placement, Placement, "an eplb.Placement")
    L = placement.num_layers
    if isinstance(layer_index, bool) or not isinstance(layer_index, (int, np.integer)):
        raise InputError(f"layer_index must be an integer, got {layer_index!r}")
    if not -L <= layer_index < L:
        raise InputError(f"layer_index {layer_index} is outside the placement's {L} layers")
    return int(layer_index) % L


def dispatch_table(placement: Placement, layer_index: int = 0) -> np.ndarray:
    """``int64[G, E]``: the slot each source GPU sends expert ``e`` to under ``local_first``."""
    layer = layer_row(placement, layer_index)
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


def dispatch_stack(placement: Placement) -> np.ndarray:
    """``int64[L, G, E]``: `dispatch_table` of every layer."""
    return np.stack([dispatch_table(placement, i) for i in range(placement.num_layers)])


@lru_cache(maxsize=8)
def dispatch_tables(placement: Placement) -> np.ndarray:
    """`dispatch_stack` of ``placement``, cached (the step-time model asks once per step)."""
    return dispatch_stack(placement)


def gpu_slots(placement: Placement, layer: int) -> np.ndarray:
    """``int64[E, G]``: lowest slot of expert ``e`` on GPU ``g`` (``-1`` if none)."""
    topo = placement.topology
    E, G, S = placement.num_experts, topo.num_gpus, topo.slots_per_gpu
    slots = np.arange(topo.num_slots)[::-1]  # reversed: the lowest slot is written last
    slots = slots[placement.phy2log[layer][slots] >= 0]  # empty slots (-1) hold no expert
    table = np.full((E, G), -1, dtype=np.int64)
    table[placement.phy2log[layer][slots], slots // S] = slots
    return table


def even_share(placement: Placement) -> np.ndarray:
    """``float64[L, P]``: ``1 / logcnt`` of each slot's expert (0 for an empty slot)."""
    cnt = np.take_along_axis(placement.logcnt, np.maximum(placement.phy2log, 0), 1)
    return np.where(placement.phy2log >= 0, 1.0 / np.maximum(cnt, 1), 0.0)
