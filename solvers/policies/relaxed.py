"""``relaxed``: the group contract, relaxed where off-node replicas pay for themselves.

Each expert's home replica stays on its group's node (``hierarchical``'s assignment); up to
``relax * (P - E)`` redundant slots hold replicas on other nodes, placed on the exact
``local_first`` loads (`solvers.primitives.local_first`); never worse than ``hierarchical``
under ``local_first``. docs/solvers.md, "relaxed".
"""

from __future__ import annotations

from typing import Annotated

import numpy as np

from eplb.errors import InputError
from eplb.placement import Placement
from eplb.solvers.primitives import local_first, packing
from eplb.solvers.primitives.group_placement import (
    best_hierarchical,
    contract_fallback,
    global_fallback,
)
from eplb.solvers.primitives.layout import duplicates
from eplb.solvers.primitives.relabel import node_map, relabel_map
from eplb.solvers.primitives.validation import NonNegInt, Range, check_groups
from eplb.solvers.registry import register
from eplb.tolerance import REL_TOL
from eplb.topology import Topology

CANDIDATES = 16  # experts (largest per-replica loads) tried per step of the count search


def _sorted_desc(v: np.ndarray) -> np.ndarray:
    return -np.sort(-v, axis=-1)


def _lex_less(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``bool[...]``: sorted vectors ``a < b`` lexicographically beyond `REL_TOL` (``[..., N]``)."""
    with np.errstate(invalid="ignore"):
        diff = np.abs(a - b) > REL_TOL * np.abs(b)
    diff &= ~(np.isinf(a) & np.isinf(b) & (a == b))
    first = diff.argmax(-1)[..., None]
    av = np.take_along_axis(a, first, -1)[..., 0]
    bv = np.take_along_axis(b, first, -1)[..., 0]
    return diff.any(-1) & (av < bv)


def _node_state(load: np.ndarray, k: np.ndarray, topology: Topology):
    """Expected tokens per node and expert ``share: [L, N, E]`` under ``local_first`` and the
    per-replica load ``share / k`` (0 where absent)."""
    src = local_first.node_sources(k.transpose(0, 2, 1), topology.gpus_per_node)
    share = load[:, None, :] / topology.num_gpus * src.transpose(0, 2, 1)
    per = np.divide(share, k, out=np.zeros_like(share), where=k > 0)
    return share, per


def design_counts(
    load: np.ndarray, topology: Topology, home: np.ndarray, foreign: int, max_steps: int
) -> np.ndarray:
    """``int64[L, N, E]`` replicas per node for ``load: float64[L, E]`` with ``home:
    int64[L, E]`` the node of each expert's group and at most ``foreign`` replicas per layer
    off their home node (docs/solvers.md, relaxed, step 1). Every node's slots are filled."""
    L, E = load.shape
    N, gpn, S = topology.num_nodes, topology.gpus_per_node, topology.slots_per_gpu
    room = gpn * S
    homemask = home[:, None, :] == np.arange(N)[None, :, None]  # [L, N, E]
    k = homemask.astype(np.int64)
    used = np.zeros(L, dtype=np.int64)
    share, per = _node_state(load, k, topology)
    cur = _sorted_desc(np.maximum(share.sum(2) / gpn, per.max(2)))
    C = min(CANDIDATES, E)
    eye = np.eye(N, dtype=np.int64)
    active = np.arange(L) if foreign > 0 and N > 1 else np.arange(0)
    for _ in range(max_steps):
        if not active.size:
            break
        n = active.size
        kk, sh, pe = k[active], share[active], per[active]
        nl = sh.sum(2)  # [n, N]
        o = np.argsort(-pe, axis=2, kind="stable")[:, :, :2]
        top1 = np.take_along_axis(pe, o[:, :, :1], 2)[:, :, 0]
        top2 = np.take_along_axis(pe, o[:, :, 1:2], 2)[:, :, 0] if E > 1 else np.zeros_like(top1)
        cand = np.argsort(-pe.max(1), axis=1, kind="stable")[:, :C]  # [n, C]
        take = np.broadcast_to(cand[:, None, :], (n, N, C))
        kc = np.take_along_axis(kk, take, 2).transpose(0, 2, 1)  # [n, C, N]
        hc = np.take_along_axis(homemask[active], take, 2).transpose(0, 2, 1)
        # moves: a replica on every node missing the expert, or one more on one node
        knew = np.concatenate(
            [(kc + (kc == 0))[:, :, None, :], kc[:, :, None, :] + eye[None, None]], 2
        )  # [n, C, M, N]
        delta = knew - kc[:, :, None, :]
        extra = (delta * ~hc[:, :, None, :]).sum(-1)  # [n, C, M] off-node replicas added
        w = np.take_along_axis(load[active], cand, 1) / topology.num_gpus
        sh_new = w[:, :, None, None] * local_first.node_sources(knew, gpn)
        sh_old = np.take_along_axis(sh, take, 2).transpose(0, 2, 1)
        nl_new = nl[:, None, None, :] + sh_new - sh_old[:, :, None, :]
        per_new = np.divide(sh_new, knew, out=np.zeros_like(sh_new), where=knew > 0)
        rest = np.where(o[:, None, :, 0] == cand[:, :, None], top2[:, None], top1[:, None])
        val = _sorted_desc(np.maximum(nl_new / gpn, np.maximum(rest[:, :, None], per_new)))
        slots = kk.sum(2)[:, None, None, :] + delta
        bad = (slots > room).any(-1) | (knew > gpn).any(-1) | (delta.sum(-1) == 0)
        bad |= used[active][:, None, None] + extra > foreign
        val[bad] = np.inf
        flat = val.reshape(n, -1, N)
        best = flat[:, 0].copy()
        arg = np.zeros(n, dtype=np.int64)
        for j in range(1, flat.shape[1]):  # first best move (candidate order) per layer
            t = _lex_less(flat[:, j], best)
            best[t] = flat[t, j]
            arg[t] = j
        gain = _lex_less(best, cur[active])
        if not gain.any():
            break
        lay = active[gain]
        ci, mi = np.divmod(arg[gain], knew.shape[2])
        k[lay, :, cand[gain, ci]] = knew[gain, ci, mi]
        used[lay] += extra[gain, ci, mi]
        share[lay], per[lay] = _node_state(load[lay], k[lay], topology)
        cur[lay] = best[gain]
        active = lay
    return _fill(load, k, topology, homemask, foreign - used)


def _fill(
    load: np.ndarray, k: np.ndarray, topology: Topology, home: np.ndarray, left_off: np.ndarray
) -> np.ndarray:
    """Fill every node's free slots with replicas of experts it already holds, the largest
    per-replica load first (at most one per GPU while possible); an expert off its home node
    (``home: bool[L, N, E]``) only while the layer's off-node budget lasts (``left_off:
    int64[L]``, replicas; before issue 33 the fill could exceed it)."""
    gpn, S = topology.gpus_per_node, topology.slots_per_gpu
    L, N, E = k.shape
    k = k.copy()
    left_off = np.array(left_off, dtype=np.int64, copy=True)
    for _ in range(gpn * S):
        if not (k.sum(2) < gpn * S).any():
            break
        _, per = _node_state(load, k, topology)  # one state per step, every node picks on it
        for b in range(N):  # node by node, so the off-node budget is counted exactly
            li = np.nonzero(k[:, b].sum(1) < gpn * S)[0]
            if not li.size:
                continue
            kb, pb = k[li, b], per[li, b]  # [n, E]
            ok = (kb > 0) & (home[li, b] | (left_off[li, None] > 0))
            capped = np.where(ok & (kb < gpn), pb, -np.inf)
            any_ = np.where(ok, pb, -np.inf)  # duplicates only when unavoidable
            pick = np.where(np.isfinite(capped.max(1))[:, None], capped, any_)
            e = pick.argmax(1)
            k[li, b, e] += 1
            left_off[li] -= ~home[li, b, e]
    return k


def _pack(load: np.ndarray, k: np.ndarray, topology: Topology, budget: int) -> np.ndarray:
    """``int64[L, P]``: nodes packed with the counts fixed (per-replica load ``share / k``)."""
    L, N, E = k.shape
    share, _ = _node_state(load, k, topology)
    packed = packing.lpt(
        share.reshape(L * N, E),
        k.reshape(L * N, E),
        topology.gpus_per_node,
        topology.slots_per_gpu,
    )
    packing.improve(packed, budget=budget)
    return packed.phy2log().reshape(L, topology.num_slots)


def _lf_max(load: np.ndarray, phy2log: np.ndarray, topology: Topology) -> np.ndarray:
    return local_first.gpu_loads(load, phy2log, topology).max(1)


@register(
    "relaxed",
    guarantees=lambda o, topology, groups: {"group_contract"} if o["relax"] == 0 else set(),
    needs_groups=True,
)
def relaxed(
    load: np.ndarray,
    topology: Topology,
    *,
    num_groups: int | None = None,
    previous: Placement | None = None,
    relax: Annotated[float, Range(0.0, 1.0)] = 1.0,
    budget: NonNegInt = 10_000,
) -> Placement:
    """Group contract relaxed for ``local_first`` dispatch, ``load: float64[L, E]`` (module
    docstring).

    ``relax`` in [0, 1]: share of the ``P - E`` redundant slots that may hold replicas off
    their group's node (0: the group contract). ``num_groups`` is required. ``budget``: swap
    iterations of the node packing and steps of the count search and polish. Deterministic.
    """
    L, E = load.shape
    groups = check_groups(num_groups, E, topology.num_nodes)
    if not 0.0 <= float(relax) <= 1.0:
        raise InputError(f"relax must be in [0, 1], got {relax!r}")
    S = topology.slots_per_gpu
    why = contract_fallback(E, topology, groups)
    if why is not None:  # no contract to relax: DeepSeek's rule, the global policy, said so
        phy2log, info = global_fallback(load, topology, budget, why)
        return Placement(phy2log, E, topology, meta={"solver": info})
    base, base_info = best_hierarchical(load, topology, groups, budget)
    group_node = np.asarray(base_info["group_to_node"], dtype=np.int64)
    home = np.repeat(group_node, E // groups, axis=1)  # [L, E]
    foreign = int(round(float(relax) * (topology.num_slots - E)))
    k = design_counts(load, topology, home, foreign, budget)
    phy2log = _pack(load, k, topology, budget)
    phy2log, _ = local_first.polish(load, phy2log, topology, budget=budget)
    mine = _lf_max(load, phy2log, topology)
    theirs = _lf_max(load, base, topology)
    keep = ~(mine < theirs * (1 - REL_TOL))  # hierarchical's layer unless strictly worse
    phy2log = np.where(keep[:, None], base, phy2log)
    best = np.where(keep, theirs, mine)
    relabeled = False
    if previous is not None:
        moved, target = relabel_map(Placement(phy2log, E, topology), previous)
        moved, _ = local_first.polish(load, moved.phy2log, topology, budget=budget)
        ok = ~(_lf_max(load, moved, topology) > best * (1 + REL_TOL))
        phy2log = np.where(ok[:, None], moved, phy2log)
        # the relabeled layers' nodes moved: the groups' home nodes with them
        nodes = node_map(target, topology.gpus_per_node)
        group_node = np.where(ok[:, None], np.take_along_axis(nodes, group_node, 1), group_node)
        home = np.repeat(group_node, E // groups, axis=1)
        relabeled = True
    off = topology.node_of_slot[None, :] != np.take_along_axis(home, phy2log, 1)
    nodes = local_first.node_counts(phy2log, E, topology) > 0  # [L, N, E]
    info = {
        "policy": "relaxed",
        "relabeled": relabeled,
        "group_to_node": group_node.tolist(),
        "foreign_budget": foreign,
        "foreign_replicas": off.sum(1).tolist(),
        "covered_experts": nodes.all(1).sum(1).tolist(),
        "hierarchical_layers": np.nonzero(keep)[0].tolist(),
        "duplicates": int(duplicates(phy2log, S).sum()),
    }
    return Placement(phy2log, E, topology, meta={"solver": info})
