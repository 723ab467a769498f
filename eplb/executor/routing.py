"""Dispatch policies: which replica slot serves each (token, k) pick of a logical expert.

Uses only the placement tables (``log2phy``, ``logcnt``, ``replica_share``), as a runtime would.
This module is the single definition of the policies; the executor and the traffic model
(`evaluation.traffic`) both call it, so their choices agree for the same seed.

Policies (``N`` tokens, top-``K``, ``e`` a picked expert with ``c = logcnt[e]`` replicas, listed
in ascending slot order as ``log2phy[e, 0..c-1]``):

- ``even``: replica ``(n * K + k) % c`` (flat pick index modulo replica count, as vLLM does).
- ``random``: replica ``floor(u * c)``, ``u ~ U[0, 1)`` drawn from
  ``numpy.random.default_rng([seed, layer_index])`` with shape ``[N, K]`` (as SGLang's dynamic
  dispatch: uniform over replicas).
- ``weighted``: the same ``u``, mapped through the cumulative ``replica_share`` of the expert's
  replicas (even split when the placement has no shares).
- ``local_first``: a fixed table per source rank (as SGLang's static dispatch): a replica on
  the token's own GPU if any, else one on its node, else any; among the candidates of that tier
  (ascending slot order), source GPU ``g`` takes candidate ``g % len(candidates)``, which spreads
  source ranks evenly over the replicas.
"""

from __future__ import annotations

import numpy as np

from eplb.args import as_int_array, check_seed, check_type
from eplb.errors import InputError
from eplb.placement import Placement

POLICIES = ("even", "random", "local_first", "weighted")


def check_policy(policy: str) -> str:
    if not isinstance(policy, str) or policy not in POLICIES:
        raise InputError(f"unknown dispatch policy {policy!r}; use one of {', '.join(POLICIES)}")
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
    check_policy(policy)
    layer = _layer(placement, layer_index)
    seed = check_seed("seed", seed)
    ids = as_int_array("topk_ids", topk_ids, ndim=2)
    E = placement.num_experts
    if ids.size and (ids.min() < 0 or ids.max() >= E):
        raise InputError(f"topk_ids must be expert ids in 0..{E - 1}")
    ids = ids.astype(np.int64, copy=False)
    N, K = ids.shape
    l2p = placement.log2phy[layer]
    cnt = placement.logcnt[layer][ids]  # [N, K]
    if policy == "even":
        replica = np.arange(N * K, dtype=np.int64).reshape(N, K) % cnt
    elif policy in ("random", "weighted"):
        u = np.random.default_rng([seed, layer]).random((N, K))
        if policy == "random":
            replica = np.minimum((u * cnt).astype(np.int64), cnt - 1)
        else:
            share = placement.share[layer]  # [P]
            shares = np.where(l2p >= 0, share[np.maximum(l2p, 0)], 0.0)  # [E, R]
            cum = np.cumsum(shares, axis=1)
            cum /= cum[:, -1:]
            # first replica whose cumulative share exceeds u
            replica = (u[..., None] >= cum[ids]).sum(-1)
            replica = np.minimum(replica, cnt - 1)
    else:  # local_first
        if token_rank is None:
            raise InputError("the local_first policy needs token_rank (source GPU of each token)")
        rank = as_int_array("token_rank", token_rank)
        G = placement.topology.num_gpus
        if rank.shape != (N,):
            raise InputError(f"token_rank must be int[{N}], got shape {rank.shape}")
        if rank.size and (rank.min() < 0 or rank.max() >= G):
            raise InputError(f"token_rank must be GPU ids in 0..{G - 1}")
        return dispatch_table(placement, layer)[rank.astype(np.int64)[:, None], ids]
    return l2p[ids, replica]
