"""Hypothesis strategies for placement problems (requires ``hypothesis``).

Loads (``float64[L, E]``, with ties, zeros and skew), topologies, problems, placements and
token-level routing, sized for brute force. See docs/solvers.md, section "The strategies".
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from numpy.typing import ArrayLike

from eplb.placement import Placement
from eplb.topology import Topology

__all__ = [
    "SCALES", "failed_gpus", "loads", "placements", "problems", "token_routing", "topologies",
]


_LAYERS = st.integers(1, 2)
_EXPERTS = st.integers(2, 8)
_TOKENS = st.integers(1, 64)


@st.composite
def loads(
    draw,
    layers: int | st.SearchStrategy[int] = _LAYERS,
    experts: int | st.SearchStrategy[int] = _EXPERTS,
    *,
    max_count: int = 1000,
) -> np.ndarray:
    """``float64[L, E]`` token counts in ``0..max_count`` (skewed ones above); ``layers`` /
    ``experts``: ints or integer strategies."""
    L = draw(layers) if isinstance(layers, st.SearchStrategy) else int(layers)
    E = draw(experts) if isinstance(experts, st.SearchStrategy) else int(experts)
    kind = draw(st.sampled_from(["random", "ties", "zeros", "skew", "float"]))
    if kind == "ties":
        values = st.sampled_from([0, max_count // 10, max_count // 10, max_count // 2])
    elif kind == "float":
        values = st.floats(0, max_count, allow_nan=False, allow_infinity=False)
    else:
        values = st.integers(0, max_count)
    rows = draw(st.lists(st.lists(values, min_size=E, max_size=E), min_size=L, max_size=L))
    load = np.array(rows, dtype=np.float64)
    if kind == "zeros":
        mask = np.array(draw(st.lists(st.booleans(), min_size=E, max_size=E)))
        load[:, mask] = 0.0
    elif kind == "skew":
        hot = draw(st.lists(st.integers(0, E - 1), min_size=1, max_size=max(1, E // 3)))
        load[:, hot] = load[:, hot] * draw(st.integers(10, 100)) + max_count
    return load


@st.composite
def topologies(
    draw, max_nodes: int = 2, max_gpus_per_node: int = 3, max_slots: int = 4, min_slots: int = 1
) -> Topology:
    """A small `Topology`."""
    return Topology(
        draw(st.integers(1, max_nodes)),
        draw(st.integers(1, max_gpus_per_node)),
        draw(st.integers(min_slots, max_slots)),
    )


# load scales drawn on purpose by problems(scales=True): far below and far above a token
# count, powers of two (exact: integer counts stay integer multiples of a unit; a layer's
# total stays under solve's 2**53 limit)
SCALES = (1.0, 2.0**-1000, 2.0**-30, 2.0**30)


@st.composite
def problems(
    draw,
    *,
    max_nodes: int = 2,
    max_gpus_per_node: int = 3,
    max_group_size: int = 3,
    max_layers: int = 2,
    spare_slots: int = 2,
    failures: bool = False,
    no_groups: bool = False,
    scales: bool = False,
) -> tuple[np.ndarray, Topology, int | None]:
    """``(load: float64[L, E], topology, num_groups)`` with ``E = num_groups * M``,
    ``num_groups`` a multiple of the nodes and ``S`` between the fewest slots per GPU that
    hold the experts and ``spare_slots`` more. ``failures``: the topology may have failed
    GPUs (none, a whole node, or part of one, each drawn as often; the survivors still hold
    the experts). ``no_groups``: ``num_groups`` is None in half the problems. ``scales``: the
    load is multiplied by one of `SCALES` (extreme ones as often as 1)."""
    N = draw(st.integers(1, max_nodes))
    gpn = draw(st.integers(1, max_gpus_per_node))
    groups = N * draw(st.integers(1, 2))
    M = draw(st.integers(1, max_group_size))
    E = groups * M
    G = N * gpn
    S0 = max(1, -(-E // G))
    S = draw(st.integers(S0, S0 + spare_slots))
    load = draw(loads(st.integers(1, max_layers), E))
    if scales:
        load = load * draw(st.sampled_from(SCALES))
    topo = Topology(N, gpn, S)
    if failures and G > 1:
        kind = draw(st.sampled_from(["none", "node", "part"]))
        failed = draw(failed_gpus(topo, E, kind=kind)) if kind != "none" else []
        if failed:
            topo = topo.with_failed(failed)
    if no_groups and draw(st.booleans()):
        return load, topo, None
    return load, topo, groups


@st.composite
def failed_gpus(
    draw, topology: Topology, num_experts: int, *, kind: str | None = None
) -> list[int]:
    """Sorted GPU indices to fail (possibly none) such that the surviving slots still hold
    ``num_experts`` experts: ``kind="node"`` a whole node (where one can fail), ``"part"`` at
    least one GPU short of a whole node (the survivors then form one node for a policy), None
    either (or none)."""
    G, S, gpn = topology.num_gpus, topology.slots_per_gpu, topology.gpus_per_node
    most = G - -(-num_experts // S)  # survivors must hold every expert
    if most < 1:
        return []
    if kind is None:
        kind = "node" if draw(st.booleans()) else "any"
    if kind == "node" and topology.num_nodes > 1 and gpn <= most:
        node = draw(st.integers(0, topology.num_nodes - 1))
        return list(range(node * gpn, (node + 1) * gpn))
    k = draw(st.integers(1 if kind == "part" else 0, most))
    out = sorted(draw(st.lists(st.integers(0, G - 1), min_size=k, max_size=k, unique=True)))
    if kind == "part" and gpn > 1 and len(out) % gpn == 0:  # not whole nodes: spare one GPU
        node = out[0] // gpn
        if all(node * gpn + i in out for i in range(gpn)):
            out.remove(node * gpn + gpn - 1)
    return out


@st.composite
def placements(
    draw,
    load_or_experts: ArrayLike | int,
    topology: Topology,
    layers: int | None = None,
    *,
    empty_slots: bool | None = False,
) -> Placement:
    """A random valid `Placement` of ``E`` experts (``load_or_experts``: a ``[L, E]`` load or
    ``E``; ``layers`` defaults to the load's) on the live slots of ``topology`` (a failed
    GPU's slots ``-1``); every expert at least once, duplicates on a GPU allowed.
    ``empty_slots``: ``True`` leaves some live slots empty (``-1``, as ``craft`` does; at
    least one per layer wherever the live slots outnumber the experts), ``None`` draws
    whether to, ``False`` (default) fills every live slot."""
    if isinstance(load_or_experts, (int, np.integer)):
        E, L = int(load_or_experts), layers or 1
    else:
        L, E = np.shape(load_or_experts)
    live = np.flatnonzero(topology.slot_alive)
    if empty_slots is None:
        empty_slots = draw(st.booleans())
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    rows = np.full((L, topology.num_slots), -1, dtype=np.int64)
    for layer in range(L):
        used = live.size
        if empty_slots and live.size > E:
            used = int(rng.integers(E, live.size))  # E .. live - 1 used slots
        slots = rng.choice(live, size=used, replace=False)
        rows[layer, slots] = rng.permutation(np.concatenate([np.arange(E),
                                                             rng.integers(0, E, used - E)]))
    return Placement(rows, E, topology)


@st.composite
def token_routing(
    draw,
    layers: int = 2,
    experts: int = 8,
    top_k: int = 2,
    *,
    num_tokens: int | st.SearchStrategy[int] = _TOKENS,
    num_ranks: int = 4,
    num_groups: int | None = None,
    topk_groups: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(topk_ids: int16[N, L, K], token_rank: int32[N])``: each token picks ``K`` distinct
    experts per layer (from ``topk_groups`` of ``num_groups`` groups when both are given) and
    comes from one of ``num_ranks`` source ranks. Skewed: experts are drawn Zipf-like."""
    if num_groups and (
        experts % num_groups or top_k > (topk_groups or num_groups) * (experts // num_groups)
    ):
        raise ValueError(
            f"top_k {top_k} does not fit {topk_groups} of {num_groups} groups of {experts} experts"
        )
    N = draw(num_tokens) if isinstance(num_tokens, st.SearchStrategy) else int(num_tokens)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    weight = 1.0 / np.arange(1, experts + 1) ** draw(st.sampled_from([0.0, 1.0, 2.0]))
    ids = np.empty((N, layers, top_k), dtype=np.int16)
    size = experts // num_groups if num_groups else experts
    for layer in range(layers):
        perm = rng.permutation(experts)  # which experts are hot differs per layer
        w = weight[np.argsort(perm)]
        for n in range(N):
            allowed = np.arange(experts)
            if num_groups and topk_groups:
                grp = rng.choice(num_groups, size=topk_groups, replace=False)
                allowed = (grp[:, None] * size + np.arange(size)).ravel()
            p = w[allowed] / w[allowed].sum()
            ids[n, layer] = rng.choice(allowed, size=top_k, replace=False, p=p)
    rank = rng.integers(0, num_ranks, size=N).astype(np.int32)
    return ids, rank
