"""`assert_valid_placement`: a placement's invariants as one assertion (no hypothesis needed)."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from eplb.errors import EplbError
from eplb.placement import Placement
from eplb.tolerance import SUM_TOL


def assert_valid_placement(
    p: Placement,
    load: ArrayLike | None = None,
    *,
    no_duplicates: bool = False,
    group_contract: int | None = None,
) -> None:
    """Raise ``AssertionError`` unless ``p`` is a valid placement.

    Always: ``p`` is a `Placement` whose `Placement.validate` passes (every slot holds an
    expert, every expert has a replica, shares are ``>= 0`` and sum to 1 per expert).
    ``load: float[L, E]``: the placement has its shape, and the GPU loads account for every
    token exactly once (relative `SUM_TOL`, and the rounding of subnormal shares).
    ``no_duplicates``: no GPU holds two replicas of one expert.
    ``group_contract``: the number of expert groups (``E / group_contract`` consecutive
    experts each) that must each live on a single node, as DeepSeek's hierarchical policy.
    """
    if not isinstance(p, Placement):
        raise AssertionError(f"expected a Placement, got {type(p).__name__}")
    try:
        p.validate()
    except EplbError as exc:
        raise AssertionError(f"invalid placement: {exc}") from None
    topo = p.topology
    L, E = p.num_layers, p.num_experts
    if load is not None:
        load = np.asarray(load, dtype=np.float64)
        if load.shape != (L, E):
            raise AssertionError(f"placement is for [{L}, {E}] but load has shape {load.shape}")
        gpu = p.gpu_load(load)
        total = load.sum(1)
        # absolute part: an even split of a subnormal load rounds each replica's share by up to
        # the smallest float (issue 33: [[5e-324]] on two slots sums to 0)
        tiny = topo.num_slots * float(np.finfo(np.float64).smallest_subnormal)
        bad = ~np.isclose(gpu.sum(1), total, rtol=SUM_TOL, atol=tiny)
        if bad.any():
            layer = int(np.argmax(bad))
            raise AssertionError(
                f"layer {layer}: GPU loads sum to {gpu.sum(1)[layer]!r}, not the layer's "
                f"{total[layer]!r} tokens"
            )
    S = topo.slots_per_gpu
    if no_duplicates:
        g = p.phy2log.reshape(L, topo.num_gpus, S)
        for layer in range(L):
            for gpu_id in range(topo.num_gpus):
                held = g[layer, gpu_id]
                vals, cnt = np.unique(held[held >= 0], return_counts=True)
                if (cnt > 1).any():
                    raise AssertionError(
                        f"layer {layer}: GPU {gpu_id} holds {int(cnt.max())} replicas of expert "
                        f"{int(vals[np.argmax(cnt)])}"
                    )
    if group_contract is not None:
        k = int(group_contract)
        if k < 1 or E % k:
            raise AssertionError(f"group_contract {k} does not divide {E} experts")
        node = topo.node_of_slot
        group = p.phy2log // (E // k)
        for layer in range(L):
            for grp in range(k):
                nodes = np.unique(node[group[layer] == grp])
                if nodes.size > 1:
                    raise AssertionError(
                        f"layer {layer}: group {grp} (experts {grp * (E // k)}.."
                        f"{(grp + 1) * (E // k) - 1}) is on nodes {nodes.tolist()}, not one node"
                    )
