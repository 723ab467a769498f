"""`assert_meta_truthful`: every ``meta["solver"]`` field a policy reports that can be read
off the returned placement is recomputed from it (plain loops, an oracle independent of the
solvers' own vectorised code) and compared. docs/solvers.md, "The properties `check_solver`
runs" (``meta``).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from numpy.typing import ArrayLike

from eplb.placement import Placement
from eplb.tolerance import PROOF_TOL, REL_TOL, proven
from eplb.topology import Topology

__all__ = ["CHECKED_FIELDS", "assert_meta_truthful"]

# the fields recomputed (others, e.g. seconds, params or a policy's own notes, are not)
CHECKED_FIELDS = (
    "duplicates", "group_to_node", "foreign_replicas", "foreign_budget", "covered_experts",
    "fully_replicated", "used_slots", "expert_slots_per_gpu", "total_slots", "objective_sum",
    "bound_sum", "objective", "objective_max", "bound", "bound_min", "gap", "gap_max",
    "gap_mean", "status", "optimal_layers", "replicas_moved", "replicas_moved_total",
)
_RTOL = 1e-9  # sums of the same loads in another order


def _gpus(row: np.ndarray, S: int) -> list[list[int]]:
    """The experts on each GPU of one layer's ``row: int64[P]`` (empty slots left out)."""
    return [[int(e) for e in row[g * S:(g + 1) * S] if e >= 0] for g in range(row.size // S)]


def _node_view(topo: Topology) -> tuple[bool, np.ndarray]:
    """``(nodes_real, live_nodes)``: whether node-naming meta can be read on the real nodes
    (no node is partly failed; a partly failed node makes `solve` place the survivors as one
    node, and node meta of a policy that does not keep the contract then describes that one
    node) and ``int64[K]`` the nodes with a live GPU."""
    gpn = topo.gpus_per_node
    dead = np.zeros(topo.num_gpus, dtype=bool)
    dead[list(topo.failed_gpus)] = True
    per = dead.reshape(topo.num_nodes, gpn)
    partial = bool((per.any(1) & ~per.all(1)).any())
    return not partial, np.flatnonzero(~per.all(1))


def _close(a: float, b: float, what: str, tol: float = _RTOL) -> None:
    scale = max(abs(a), abs(b))
    assert abs(a - b) <= tol * scale + 1e-300, f"meta {what} is {a!r}, the placement gives {b!r}"


def assert_meta_truthful(
    p: Placement, load: ArrayLike, *, previous: Placement | None = None
) -> None:
    """Raise ``AssertionError`` naming the first ``meta["solver"]`` field of ``p`` (for
    ``load: float[L, E]``) that its placement contradicts (`CHECKED_FIELDS`).

    ``duplicates``: surplus replicas sharing a GPU with one of their expert, all layers;
    ``group_to_node[l][k]``: a node holding a replica of every expert of group ``k``;
    ``foreign_replicas[l]``: replicas off their group's node (``<= foreign_budget``);
    ``covered_experts[l]``: experts on every live node; ``fully_replicated``: experts on every
    live GPU, the fewest over layers; ``used_slots[l]``: non-empty slots;
    ``expert_slots_per_gpu``: the most non-empty slots one GPU holds over all layers
    (``total_slots`` at least their sum); ``objective_sum``: the summed max GPU loads
    (``bound_sum`` at most it); ``objective[l]``: the max GPU load (plus ``rdma_weight *
    expected_rdma / G`` and ``migration_weight * moves`` where the solve priced them), with
    ``bound <= objective``, ``gap = 1 - bound / objective``, ``optimal`` only where
    ``bound`` proves it, and the aggregates; ``replicas_moved[l]``: replicas on a GPU that did
    not hold that expert in ``previous`` (a multiset difference per GPU). Node-naming fields
    are read on the real nodes unless a node is partly failed (docs)."""
    info = dict(p.meta.get("solver") or {})
    load = np.asarray(load, dtype=np.float64)
    topo = p.topology
    S, G = topo.slots_per_gpu, topo.num_gpus
    gpn = topo.gpus_per_node
    alive = [g for g in range(G) if g not in set(topo.failed_gpus)]
    gpus = [_gpus(row, S) for row in p.phy2log]
    nodes_real, live_nodes = _node_view(topo)
    if "duplicates" in info:
        dup = sum(len(g) - len(set(g)) for layer in gpus for g in layer)
        assert info["duplicates"] == dup, (
            f"meta duplicates is {info['duplicates']!r}, the placement has {dup}"
        )
    if "fully_replicated" in info:
        full = min(len(set.intersection(*(set(layer[g]) for g in alive))) for layer in gpus)
        assert info["fully_replicated"] == full, (
            f"meta fully_replicated is {info['fully_replicated']!r}, but {full} experts are on "
            "every GPU (fewest over the layers)"
        )
    used = (p.phy2log >= 0).sum(1)
    if "used_slots" in info:
        assert list(info["used_slots"]) == used.tolist(), (
            f"meta used_slots is {info['used_slots']!r}, the placement uses {used.tolist()}"
        )
    if "expert_slots_per_gpu" in info:
        most = max(sum(len(layer[g]) for layer in gpus) for g in range(G))
        assert info["expert_slots_per_gpu"] == most, (
            f"meta expert_slots_per_gpu is {info['expert_slots_per_gpu']!r}, the fullest GPU "
            f"holds {most}"
        )
    if "total_slots" in info:
        assert info["total_slots"] >= int(used.sum()), (
            f"meta total_slots {info['total_slots']!r} is below the {int(used.sum())} used"
        )
    gl = p.gpu_load(load)  # [L, G]
    peak = gl.max(1)
    if "objective_sum" in info:
        _close(float(info["objective_sum"]), float(peak.sum()), "objective_sum")
        if "bound_sum" in info:
            assert info["bound_sum"] <= peak.sum() * (1 + _RTOL), (
                f"meta bound_sum {info['bound_sum']!r} is above the placement's "
                f"{float(peak.sum())!r}"
            )
    if nodes_real:
        _check_nodes(info, p, gpus, live_nodes)
    if "replicas_moved" in info and previous is not None:
        old = [_gpus(row, S) for row in previous.phy2log]
        moved = [
            sum(sum((Counter(n[g]) - Counter(o[g])).values()) for g in range(G))
            for n, o in zip(gpus, old, strict=True)
        ]
        assert list(info["replicas_moved"]) == moved, (
            f"meta replicas_moved is {info['replicas_moved']!r}, the placement moves {moved}"
        )
        assert info.get("replicas_moved_total") == sum(moved), (
            f"meta replicas_moved_total is {info.get('replicas_moved_total')!r}, not {sum(moved)}"
        )
    if "objective" in info and isinstance(info["objective"], list):
        _check_objective(info, p, load, peak, previous, nodes_real, gpn)


def _check_nodes(info: dict, p: Placement, gpus: list, live_nodes: np.ndarray) -> None:
    """``group_to_node``, ``foreign_replicas``, ``foreign_budget``, ``covered_experts`` on the
    real nodes."""
    topo, E = p.topology, p.num_experts
    gpn = topo.gpus_per_node
    on_node = [
        [set().union(*(layer[g] for g in range(n * gpn, (n + 1) * gpn)))
         for n in range(topo.num_nodes)]
        for layer in gpus
    ]
    g2n = info.get("group_to_node")
    if g2n is not None:
        k = len(g2n[0])
        M = E // k
        for layer, row in enumerate(g2n):
            for grp, node in enumerate(row):
                need = set(range(grp * M, (grp + 1) * M))
                has = on_node[layer][node] & need if 0 <= node < topo.num_nodes else set()
                assert has == need, (
                    f"meta group_to_node says layer {layer} group {grp} is on node {node}, "
                    f"which holds {sorted(has)} of its experts {sorted(need)}"
                )
        if "foreign_replicas" in info:
            S = topo.slots_per_gpu
            off = []
            for layer, row in enumerate(p.phy2log):
                home = np.repeat(np.asarray(g2n[layer]), M)
                off.append(int(sum(1 for s, e in enumerate(row)
                                   if e >= 0 and s // S // gpn != home[e])))
            assert list(info["foreign_replicas"]) == off, (
                f"meta foreign_replicas is {info['foreign_replicas']!r}, the placement has {off} "
                "replicas off their group's node"
            )
            if "foreign_budget" in info:
                assert max(off) <= info["foreign_budget"], (
                    f"{max(off)} replicas off their group's node, above foreign_budget "
                    f"{info['foreign_budget']!r}"
                )
    if "covered_experts" in info:
        cov = [len(set.intersection(*(layer[n] for n in live_nodes))) for layer in on_node]
        assert list(info["covered_experts"]) == cov, (
            f"meta covered_experts is {info['covered_experts']!r}, {cov} experts are on every "
            "live node"
        )


def _check_objective(info, p, load, peak, previous, nodes_real, gpn) -> None:
    """``objective`` per layer (with the priced traffic and moves), ``bound``, ``gap``,
    ``status`` and the aggregates."""
    from eplb.solvers.primitives.traffic_cost import expected_rdma  # lazy: testing <- solvers

    obj = np.asarray(info["objective"], dtype=np.float64)
    params = info.get("params") or {}
    lam = float(info.get("rdma_weight") or params.get("rdma_weight") or 0.0)
    mu = float(params.get("migration_weight") or 0.0)
    want = peak.copy()
    if lam:
        if not nodes_real:
            return  # priced on the survivors' one node (docs)
        topo = p.topology
        live = [g for g in range(topo.num_gpus) if g not in set(topo.failed_gpus)]
        if topo.failed_gpus:  # whole nodes failed: the traffic of the nodes left
            keep = np.repeat(np.asarray(live) * topo.slots_per_gpu, topo.slots_per_gpu) + (
                np.tile(np.arange(topo.slots_per_gpu), len(live)))
            small = Topology(len(live) // gpn, gpn, topo.slots_per_gpu)
            rdma = expected_rdma(p.phy2log[:, keep], load, small)
        else:
            rdma = expected_rdma(p, load)
        want = want + lam * rdma / len(live)
    if mu and previous is not None:
        want = want + mu * np.asarray(info.get("replicas_moved", np.zeros(len(obj))))
    for layer, (a, b) in enumerate(zip(obj, want, strict=True)):
        _close(float(a), float(b), f"objective[{layer}]", 1e-9)
    if "objective_max" in info:
        _close(float(info["objective_max"]), float(obj.max()), "objective_max")
    if "bound" not in info:
        return
    bound = np.asarray(info["bound"], dtype=np.float64)
    bad = bound > obj * (1 + REL_TOL) + 1e-300
    assert not bad.any(), (
        f"meta bound[{int(np.argmax(bad))}] {bound[bad][0]!r} is above the objective "
        f"{obj[bad][0]!r} of the returned placement"
    )
    if "bound_min" in info:
        _close(float(info["bound_min"]), float(bound.min()), "bound_min")
    if "gap" in info:
        gap = np.where(obj > 0, 1 - bound / np.where(obj > 0, obj, 1), 0.0)
        got = np.asarray(info["gap"], dtype=np.float64)
        assert np.allclose(got, np.maximum(gap, 0), rtol=1e-9, atol=PROOF_TOL), (
            f"meta gap is {got.tolist()}, 1 - bound / objective gives {gap.tolist()}"
        )
        if "gap_max" in info:
            _close(float(info["gap_max"]), float(got.max()), "gap_max")
        if "gap_mean" in info:
            _close(float(info["gap_mean"]), float(got.mean()), "gap_mean")
    if "status" in info:
        status = list(info["status"])
        for layer, s in enumerate(status):
            assert s != "optimal" or proven(bound[layer], obj[layer]), (
                f"meta status says layer {layer} is optimal, but its bound {bound[layer]!r} "
                f"does not prove the objective {obj[layer]!r}"
            )
        if "optimal_layers" in info:
            assert info["optimal_layers"] == status.count("optimal"), (
                f"meta optimal_layers is {info['optimal_layers']!r}, status lists "
                f"{status.count('optimal')}"
            )
