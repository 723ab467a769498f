"""What a rebalance moves: the one meaning of "a replica moved", shared by every layer above.

A replica *moves* when a GPU must receive that expert's weights over a link: per layer and GPU,
every non-empty slot of the new placement whose expert had no replica on that GPU in the old
one. This is what `eplb.executor.ReferenceExecutor.rebalance` transfers (`weight_moves`: a slot
copies from a replica on its own GPU when there is one, a local copy that crosses no link).
So, per (layer, GPU):

- reordering slots inside a GPU moves nothing;
- another copy of an expert the GPU already holds moves nothing (a local copy);
- each slot of an expert the GPU did not hold counts, so two replicas of one expert landing on
  a GPU that held none count 2 (the executor copies each slot over the link);
- an empty slot (``-1``) holds nothing: emptying a slot moves nothing, filling one counts.

Old and new may differ in slots per GPU (a change of redundancy), not in layers or GPUs. Solver
meta (``replicas_moved``), ``replay``, the serving simulator's rebalances and ``advise`` all
count through `gpu_moves`. docs/core.md, "Replicas moved".
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from eplb.args import as_int_array, check_int, check_number
from eplb.errors import InputError
from eplb.placement import Placement

__all__ = ["gpu_moves", "migration_bytes", "replicas_moved"]


def gpu_moves(old: ArrayLike, new: ArrayLike, num_gpus: int) -> np.ndarray:
    """``int64[L, G]``: replicas each GPU receives over a link to turn ``old: int[L, P_old]``
    into ``new: int[L, P_new]`` (slot ``p`` on GPU ``p // (P / G)``; ``-1`` an empty slot)."""
    G = check_int("num_gpus", num_gpus, 1)
    a = as_int_array("old", old, ndim=2)
    b = as_int_array("new", new, ndim=2)
    if a.shape[0] != b.shape[0]:
        raise InputError(
            f"old has {a.shape[0]} layers and new {b.shape[0]}; compare placements of one model"
        )
    for name, t in (("old", a), ("new", b)):
        if t.shape[1] % G:
            raise InputError(f"{name} has {t.shape[1]} slots, not a multiple of {G} GPUs")
        if t.size and t.min() < -1:
            raise InputError(f"{name} holds {t.min()}; experts are >= 0 and -1 is an empty slot")
    L = a.shape[0]
    if L == 0 or b.shape[1] == 0:
        return np.zeros((L, G), dtype=np.int64)
    top = int(max(a.max(initial=-1), b.max(initial=-1))) + 2  # expert + 1 in 0..top-1
    if L * G * top >= 2**62:
        raise InputError(f"expert ids up to {top - 2} are too large to compare")

    def keys(t: np.ndarray) -> np.ndarray:  # (layer, GPU, expert) as one integer per slot
        gpu = np.arange(t.shape[1]) // (t.shape[1] // G)
        return (np.arange(L)[:, None] * G + gpu[None, :]) * top + (t + 1)

    ka = keys(a)[a >= 0]
    landed = (b >= 0) & ~np.isin(keys(b), ka)
    return landed.reshape(L, G, -1).sum(-1).astype(np.int64)


def _check_pair(old: Placement, new: Placement) -> None:
    for name, p in (("old", old), ("new", new)):
        if not isinstance(p, Placement):
            raise InputError(f"{name} must be a Placement, got {type(p).__name__}")
    t, u = old.topology, new.topology
    if (old.num_layers, t.num_nodes, t.gpus_per_node) != (
        new.num_layers, u.num_nodes, u.gpus_per_node
    ):
        raise InputError(
            f"placements differ: {old.num_layers} layers on {t.num_nodes}x{t.gpus_per_node} "
            f"GPUs vs {new.num_layers} on {u.num_nodes}x{u.gpus_per_node}; compare placements "
            "of one model on one cluster"
        )
    if old.num_experts != new.num_experts:
        raise InputError(f"placements have {old.num_experts} and {new.num_experts} experts")


def replicas_moved(old: Placement, new: Placement) -> np.ndarray:
    """``int64[L]``: replicas of ``new`` a GPU receives over a link (`gpu_moves`, per layer)."""
    _check_pair(old, new)
    return gpu_moves(old.phy2log, new.phy2log, new.topology.num_gpus).sum(1)


def migration_bytes(old: Placement, new: Placement, expert_bytes: float) -> np.ndarray:
    """``float64[G]``: bytes each GPU receives to go from ``old`` to ``new``, all layers
    (`gpu_moves` times ``expert_bytes``, the bytes of one expert's weights)."""
    _check_pair(old, new)
    eb = check_number("expert_bytes", expert_bytes, 0)
    return gpu_moves(old.phy2log, new.phy2log, new.topology.num_gpus).sum(0) * float(eb)
