"""Placements under DeepSeek's group-to-node contract (every replica of an expert on its group's
node): the group-to-node assignment minimising the largest node bound, the per-node greedy,
the exact enumeration when small, and `best_hierarchical`, the ``hierarchical`` policy's
placement (also the start of ``relaxed`` and of ``ilp`` with ``hierarchical=True``).
docs/solvers.md, "hierarchical".
"""

from __future__ import annotations

from math import comb

import numpy as np

from eplb.errors import InfeasibleError
from eplb.solvers.primitives import exhaustive
from eplb.solvers.primitives.analytic_bounds import EXACT_GROUPS, flat_bound, subset_bounds
from eplb.solvers.primitives.deepseek_kernels import pack, placement_table
from eplb.solvers.primitives.even_split import pack_even, place_even
from eplb.solvers.primitives.layout import duplicates, max_load
from eplb.solvers.primitives.partitions import best_partitions
from eplb.tolerance import better
from eplb.topology import Topology


def _node_bounds(
    load_row: np.ndarray, subsets: list[list[int]], topology: Topology, M: int
) -> np.ndarray:
    """``float64[C]`` node bound of each group subset (inf if empty or too big), batched by
    subset size."""
    out = np.full(len(subsets), np.inf)
    by_size: dict[int, list[int]] = {}
    for i, sub in enumerate(subsets):
        if sub and len(sub) * M <= topology.gpus_per_node * topology.slots_per_gpu:
            by_size.setdefault(len(sub), []).append(i)
    gl = load_row.reshape(-1, M)
    for k, idx in by_size.items():
        rows = gl[np.array([subsets[i] for i in idx])].reshape(len(idx), k * M)
        out[idx] = flat_bound(rows, topology.gpus_per_node, topology.slots_per_gpu)
    return out


def _no_fit(num_experts: int, topology: Topology, num_groups: int) -> str:
    M = num_experts // num_groups
    node = topology.gpus_per_node * topology.slots_per_gpu
    return (
        f"the group contract is infeasible: {num_groups} groups of {M} experts cannot go to "
        f"{topology.num_nodes} nodes of {node} slots with every node holding whole groups "
        f"(at most {node // M} per node, every node at least one); use more slots per "
        "GPU, another num_groups or a global policy"
    )


def contract_fallback(num_experts: int, topology: Topology, num_groups: int) -> str | None:
    """Why ``num_groups`` groups of ``num_experts / num_groups`` experts cannot keep the
    group-to-node contract on ``topology`` (every node, all of whose slots hold a replica,
    must hold at least one whole group and at most its slots' worth), or None when they can.
    A contract policy then follows DeepSeek's rule and places globally, saying so
    (docs/solvers.md, "When the contract cannot hold")."""
    N = topology.num_nodes
    if num_groups < N:
        return (
            f"{num_groups} groups on {N} nodes: every node's slots must hold whole groups, so "
            "fewer groups than nodes cannot keep the contract"
        )
    M = num_experts // num_groups
    room = (topology.gpus_per_node * topology.slots_per_gpu) // M
    if room < 1 or room * N < num_groups:
        return _no_fit(num_experts, topology, num_groups)
    return None


def check_contract(num_experts: int, topology: Topology, num_groups: int) -> None:
    """Raise `InfeasibleError` (naming the cause) unless ``num_groups`` groups of
    ``num_experts / num_groups`` experts can be split over the nodes: every node holds at
    least one whole group and at most its slots' worth (`contract_fallback`)."""
    why = contract_fallback(num_experts, topology, num_groups)
    if why is not None:
        raise InfeasibleError(why)


def heuristic_assignment(load: np.ndarray, topology: Topology, num_groups: int) -> np.ndarray:
    """``int64[L, num_groups]`` node of each group of ``load: float64[L, E]``: LPT by group
    load (with room), then the
    best move or swap of a group off the node with the largest node bound while it drops."""
    L, E = load.shape
    N = topology.num_nodes
    M = E // num_groups
    room = (topology.gpus_per_node * topology.slots_per_gpu) // M
    if room * N < num_groups:
        raise InfeasibleError(f"{num_groups} groups of {M} experts do not fit on {N} nodes")
    out = np.zeros((L, num_groups), dtype=np.int64)
    gl = load.reshape(L, num_groups, M).sum(2)
    for layer in range(L):
        node_load = np.zeros(N)
        members: list[list[int]] = [[] for _ in range(N)]
        for g in np.argsort(-gl[layer], kind="stable"):
            sizes = np.array([len(m) for m in members])
            empty = np.nonzero(sizes == 0)[0]
            left = num_groups - sizes.sum()
            pool = empty if left <= empty.size else np.nonzero(sizes < room)[0]
            n = int(pool[np.argmin(node_load[pool])])
            members[n].append(int(g))
            node_load[n] += gl[layer, g]
        vals = _node_bounds(load[layer], members, topology, M)
        for _ in range(4 * num_groups):
            a = int(np.argmax(vals))
            moves, subsets = [], []
            for b in range(N):
                if b == a:
                    continue
                for g in members[a]:
                    rest_a = [x for x in members[a] if x != g]
                    if rest_a:
                        moves.append((g, None, b))
                        subsets += [rest_a, members[b] + [g]]
                    for h in members[b]:
                        moves.append((g, h, b))
                        subsets += [rest_a + [h], [x for x in members[b] if x != h] + [g]]
            if not moves:
                break
            v = _node_bounds(load[layer], subsets, topology, M).reshape(-1, 2)
            worst = v.max(1)
            i = int(np.argmin(worst))
            if not better(worst[i], vals[a]):
                break
            g, h, b = moves[i]
            members[a].remove(g)
            members[b].append(g)
            if h is not None:
                members[b].remove(h)
                members[a].append(h)
            vals[a], vals[b] = v[i]
        for n, m in enumerate(members):
            out[layer, m] = n
    return out


def assign_groups(load: np.ndarray, topology: Topology, num_groups: int) -> np.ndarray:
    """``int64[L, num_groups]``: node of each group of ``load: float64[L, E]`` minimising the
    largest node bound."""
    N = topology.num_nodes
    if num_groups <= EXACT_GROUPS:
        f = subset_bounds(load, topology, num_groups)
        _, masks = best_partitions(f, N)  # [L, N]
        L = load.shape[0]
        bits = (masks[:, :, None] >> np.arange(num_groups)) & 1  # [L, N, groups]
        if not np.all(bits.sum(1) == 1):
            raise InfeasibleError(
                f"{num_groups} groups cannot be split over {N} nodes of "
                f"{topology.gpus_per_node * topology.slots_per_gpu} slots"
            )
        # order blocks by their smallest group so the labelling is canonical
        first = np.argmax(bits, axis=2)  # [L, N] lowest group of each block
        order = np.argsort(first, axis=1, kind="stable")
        bits = np.take_along_axis(bits, order[:, :, None], 1)
        return np.argmax(bits, axis=1).reshape(L, num_groups)
    return heuristic_assignment(load, topology, num_groups)


EXACT_WORK = 4_000_000  # tables x layers evaluated at most by the exact mode


def exact_hierarchical(
    load: np.ndarray, topology: Topology, num_groups: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """The group-constrained optimum of ``load: float64[L, E]`` by enumeration, when small
    enough: ``(phy2log:
    int64[L, P], group_node: int64[L, num_groups])``, else None.

    Every subset of groups that fits on a node gets its exact node optimum
    (`exhaustive.best_tables` on the node's ``G/N`` GPUs); the partition of the groups over
    the nodes minimising the largest node optimum (`best_partitions`) is then the optimum of
    the layer under the contract.
    """
    L, E = load.shape
    N, gpn, S = topology.num_nodes, topology.gpus_per_node, topology.slots_per_gpu
    M = E // num_groups
    if num_groups > EXACT_GROUPS:
        return None
    fits = [k for k in range(1, num_groups + 1) if k * M <= gpn * S]
    work = 0
    for k in fits:
        n_tab = exhaustive.num_tables(k * M, gpn, S)
        if n_tab > exhaustive.MAX_TABLES:
            return None
        work += n_tab * L * comb(num_groups, k)
    if work > EXACT_WORK:
        return None
    f = np.full((1 << num_groups, L), np.inf)
    node_tab: dict[int, np.ndarray] = {}
    for mask in range(1, 1 << num_groups):
        members = [g for g in range(num_groups) if mask >> g & 1]
        if len(members) not in fits:
            continue
        experts = (np.array(members)[:, None] * M + np.arange(M)).ravel()
        tab, val = exhaustive.best_tables(load[:, experts], gpn, S)
        f[mask] = val
        node_tab[mask] = experts[tab]  # [L, gpn * S] expert ids
    value, masks = best_partitions(f, N)  # [L, N]
    if not np.all(np.isfinite(value)):  # no partition fits: the contract is infeasible
        raise InfeasibleError(_no_fit(E, topology, num_groups))
    bits = (masks[:, :, None] >> np.arange(num_groups)) & 1
    if not np.all(bits.sum(1) == 1):
        return None
    order = np.argsort(np.argmax(bits, axis=2), axis=1, kind="stable")  # nodes by first group
    masks = np.take_along_axis(masks, order, 1)
    phy2log = np.stack(
        [
            np.concatenate([node_tab[int(masks[layer, n])][layer] for n in range(N)])
            for layer in range(L)
        ]
    )
    bits = np.take_along_axis(bits, order[:, :, None], 1)
    return phy2log, np.argmax(bits, axis=1)


def place_hierarchical(
    load: np.ndarray, topology: Topology, group_node: np.ndarray, num_groups: int, budget: int
) -> tuple[np.ndarray, int]:
    """``(phy2log: int64[L, P], duplicates)`` for ``load: float64[L, E]`` from ``group_node:
    int64[L, num_groups]``: the even-split greedy inside each node."""
    L, E = load.shape
    N, gpn, S = topology.num_nodes, topology.gpus_per_node, topology.slots_per_gpu
    M = E // num_groups
    expert_node = np.repeat(group_node, M, axis=1)  # [L, E]
    present = (expert_node[:, None, :] == np.arange(N)[None, :, None]).reshape(L * N, E)
    rows = np.repeat(load, N, axis=0)
    packed = pack_even(rows, gpn, S, present=present, budget=budget)
    return packed.slot_e.reshape(L, N * gpn * S), int(packed.duplicates().sum())


def best_hierarchical(
    load: np.ndarray, topology: Topology, groups: int, budget: int = 10_000
) -> tuple[np.ndarray, dict]:
    """``(phy2log: int64[L, P], info)`` for ``load: float64[L, E]`` under the contract with
    ``groups`` groups (already checked: they divide ``E``, one per node at least): exact when
    small, else the best assignment with the per-node greedy, DeepSeek's equal-count group
    packing and DeepSeek's own placement as further candidates per layer. ``info``:
    ``policy``, ``group_to_node``, ``duplicates``, ``exact`` (and ``deepseek_layers``)."""
    L, E = load.shape
    S = topology.slots_per_gpu
    M = E // groups
    if M > topology.gpus_per_node * S:
        raise InfeasibleError(
            f"a group of {M} experts does not fit in a node's "
            f"{topology.gpus_per_node * S} slots; use more slots or groups"
        )
    check_contract(E, topology, groups)
    exact = exact_hierarchical(load, topology, groups)
    if exact is not None:
        phy2log, group_node = exact
        info = {
            "policy": "hierarchical",
            "group_to_node": group_node.tolist(),
            "duplicates": int(duplicates(phy2log, S).sum()),
            "exact": True,
        }
        return phy2log, info
    group_node = assign_groups(load, topology, groups)
    phy2log, _ = place_hierarchical(load, topology, group_node, groups, budget)
    deepseek_layers = np.zeros(L, dtype=bool)
    if groups % topology.num_nodes == 0:
        # DeepSeek's equal-count group packing as a second candidate, kept where it packs better
        gl = load.reshape(L, groups, M).sum(2)
        alt_node, _ = pack(gl.astype(np.float32), topology.num_nodes)
        alt, _ = place_hierarchical(load, topology, alt_node, groups, budget)
        mine = max_load(load, phy2log, S)
        theirs = max_load(load, alt, S)
        take = better(theirs, mine)
        phy2log = np.where(take[:, None], alt, phy2log)
        group_node = np.where(take[:, None], alt_node, group_node)
        mine = np.where(take, theirs, mine)
        # DeepSeek's own placement under the same contract: never worse than it on a layer
        ds, _ = placement_table(load, topology, groups)
        take = better(max_load(load, ds, S), mine)
        phy2log = np.where(take[:, None], ds, phy2log)
        group_node = np.where(take[:, None], alt_node, group_node)
        deepseek_layers = take
    info = {
        "policy": "hierarchical",
        "group_to_node": group_node.tolist(),
        "duplicates": int(duplicates(phy2log, S).sum()),
        "exact": False,
        "deepseek_layers": np.nonzero(deepseek_layers)[0].tolist(),
    }
    return phy2log, info


def place_uneven_nodes(
    load: np.ndarray, node_gpus: list[int], slots_per_gpu: int, num_groups: int, budget: int
) -> np.ndarray:
    """``int64[L, sum(node_gpus) * S]`` placement of ``load: float64[L, E]`` keeping every
    group on one node when node ``n`` has ``node_gpus[n] >= 1`` GPUs (a partly failed node
    has fewer; nodes in slot order). Groups go heaviest first to the node with the smallest
    load per GPU after taking them, with room, every node at least one group; then the
    even-split greedy inside each node. `InfeasibleError` when the groups cannot fit."""
    L, E = load.shape
    S = slots_per_gpu
    M = E // num_groups
    gpus = np.asarray(node_gpus, dtype=np.int64)
    N = gpus.size
    room = gpus * S // M
    if (room < 1).any() or room.sum() < num_groups or num_groups < N:
        raise InfeasibleError(
            f"the group contract is infeasible on the surviving GPUs: {num_groups} groups of "
            f"{M} experts cannot go to nodes of {(gpus * S).tolist()} slots, every node holding "
            "at least one whole group; use a global policy"
        )
    gl = load.reshape(L, num_groups, M).sum(2)
    start = np.r_[0, np.cumsum(gpus * S)]
    out = np.empty((L, int(start[-1])), dtype=np.int64)
    for layer in range(L):
        node_load = np.zeros(N)
        size = np.zeros(N, dtype=np.int64)
        members: list[list[int]] = [[] for _ in range(N)]
        for left, g in enumerate(np.argsort(-gl[layer], kind="stable")):
            empty = np.nonzero(size == 0)[0]
            pool = empty if num_groups - left <= empty.size else np.nonzero(size < room)[0]
            n = int(pool[np.argmin((node_load[pool] + gl[layer, g]) / gpus[pool])])
            members[n].append(int(g))
            node_load[n] += gl[layer, g]
            size[n] += 1
        for n in range(N):
            experts = (np.array(sorted(members[n]))[:, None] * M + np.arange(M)).ravel()
            packed = pack_even(load[layer : layer + 1, experts], int(gpus[n]), S, budget=budget)
            out[layer, start[n] : start[n + 1]] = experts[packed.slot_e.reshape(-1)]
    return out


def global_fallback(
    load: np.ndarray, topology: Topology, budget: int, why: str
) -> tuple[np.ndarray, dict]:
    """``(phy2log: int64[L, P], info)``: ``greedy``'s global placement of ``load: float64[L,
    E]`` for a contract policy whose contract cannot hold (``why``), recorded in ``info``
    (``policy: "global"``, ``fallback``: the reason, ``fallback_to``)."""
    phy2log, _ = place_even(load, topology, None, budget)
    info = {
        "policy": "global",
        "fallback": why,
        "fallback_to": "greedy",
        "duplicates": int(duplicates(phy2log, topology.slots_per_gpu).sum()),
    }
    return phy2log, info
