"""`assert_meta_truthful`: every ``meta["solver"]`` field a policy reports that can be read
off the returned placement is recomputed from it (plain loops, an oracle independent of the
solvers' own vectorised code) and compared. docs/solvers.md, "The properties `check_solver`
runs" (``meta``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numpy.typing import ArrayLike

from eplb.placement import Placement
from eplb.tolerance import PROOF_TOL, REL_TOL, proven
from eplb.topology import Topology

__all__ = ["CHECKED_FIELDS", "assert_meta_truthful"]

_RTOL = 1e-9  # sums of the same loads in another order


@dataclass
class _View:
    """The placement, its load and meta, read plainly: experts per GPU and per node."""

    p: Placement
    load: np.ndarray  # float64[L, E]
    info: dict
    previous: Placement | None

    @cached_property
    def gpus(self) -> list[list[list[int]]]:
        """``[layer][gpu]``: the experts on each GPU (empty slots left out)."""
        return [_gpus(row, self.p.topology.slots_per_gpu) for row in self.p.phy2log]

    @cached_property
    def alive(self) -> list[int]:
        t = self.p.topology
        return [g for g in range(t.num_gpus) if g not in set(t.failed_gpus)]

    @cached_property
    def peak(self) -> np.ndarray:
        """``float64[L]`` max GPU load per layer."""
        return self.p.gpu_load(self.load).max(1)

    @cached_property
    def nodes_real(self) -> bool:
        """Node-naming meta is read on the real nodes unless a node is partly failed (`solve`
        places the survivors as one node then; node meta of a policy that does not keep the
        contract describes that one node)."""
        t = self.p.topology
        dead = np.zeros(t.num_gpus, dtype=bool)
        dead[list(t.failed_gpus)] = True
        per = dead.reshape(t.num_nodes, t.gpus_per_node)
        return not bool((per.any(1) & ~per.all(1)).any())

    @cached_property
    def on_node(self) -> list[list[set[int]]]:
        """``[layer][node]``: the experts with a replica on each node."""
        gpn, N = self.p.topology.gpus_per_node, self.p.topology.num_nodes
        return [[set().union(*(layer[g] for g in range(n * gpn, (n + 1) * gpn)))
                 for n in range(N)] for layer in self.gpus]

    def field(self, name: str):
        return self.info[name]


def _gpus(row: np.ndarray, S: int) -> list[list[int]]:
    return [[int(e) for e in row[g * S:(g + 1) * S] if e >= 0] for g in range(row.size // S)]


def _equal(v: _View, name: str, want) -> None:
    assert v.field(name) == want, f"meta {name} is {v.field(name)!r}, the placement gives {want!r}"


def _close(got: float, want: float, name: str, tol: float = _RTOL) -> None:
    assert abs(got - want) <= tol * max(abs(got), abs(want)) + 1e-300, (
        f"meta {name} is {got!r}, the placement gives {want!r}"
    )


def _duplicates(v: _View) -> None:
    """Surplus replicas sharing a GPU with one of their expert, all layers."""
    _equal(v, "duplicates", sum(len(g) - len(set(g)) for layer in v.gpus for g in layer))


def _fully_replicated(v: _View) -> None:
    """Experts on every live GPU, the fewest over the layers."""
    _equal(v, "fully_replicated",
           min(len(set.intersection(*(set(layer[g]) for g in v.alive))) for layer in v.gpus))


def _used_slots(v: _View) -> None:
    _equal(v, "used_slots", [sum(len(g) for g in layer) for layer in v.gpus])


def _expert_slots_per_gpu(v: _View) -> None:
    """The most non-empty slots one GPU holds over all layers."""
    G = v.p.topology.num_gpus
    _equal(v, "expert_slots_per_gpu", max(sum(len(layer[g]) for layer in v.gpus)
                                          for g in range(G)))


def _total_slots(v: _View) -> None:
    used = int((v.p.phy2log >= 0).sum())
    assert v.field("total_slots") >= used, (
        f"meta total_slots {v.field('total_slots')!r} is below the {used} slots used"
    )


def _objective_sum(v: _View) -> None:
    """The summed max GPU loads; ``bound_sum`` at most it."""
    _close(float(v.field("objective_sum")), float(v.peak.sum()), "objective_sum")
    if "bound_sum" in v.info:
        assert v.field("bound_sum") <= v.peak.sum() * (1 + _RTOL), (
            f"meta bound_sum {v.field('bound_sum')!r} is above the placement's "
            f"{float(v.peak.sum())!r}"
        )


def _group_to_node(v: _View) -> None:
    """``group_to_node[l][k]``: a node holding a replica of every expert of group ``k``."""
    if not v.nodes_real:
        return
    g2n = v.field("group_to_node")
    N, M = v.p.topology.num_nodes, v.p.num_experts // len(g2n[0])
    for layer, row in enumerate(g2n):
        for grp, node in enumerate(row):
            need = set(range(grp * M, (grp + 1) * M))
            has = v.on_node[layer][node] & need if 0 <= node < N else set()
            assert has == need, (
                f"meta group_to_node says layer {layer} group {grp} is on node {node}, which "
                f"holds {sorted(has)} of its experts {sorted(need)}"
            )


def _foreign_replicas(v: _View) -> None:
    """Replicas off their group's node (``group_to_node``), at most ``foreign_budget``."""
    if not v.nodes_real or "group_to_node" not in v.info:
        return
    g2n = v.field("group_to_node")
    topo = v.p.topology
    M, per_node = v.p.num_experts // len(g2n[0]), topo.gpus_per_node * topo.slots_per_gpu
    off = [sum(1 for s, e in enumerate(row) if e >= 0 and s // per_node != g2n[layer][e // M])
           for layer, row in enumerate(v.p.phy2log)]
    _equal(v, "foreign_replicas", off)
    if "foreign_budget" in v.info:
        assert max(off) <= v.field("foreign_budget"), (
            f"{max(off)} replicas off their group's node, above foreign_budget "
            f"{v.field('foreign_budget')!r}"
        )


def _covered_experts(v: _View) -> None:
    """Experts with a replica on every node that has a live GPU."""
    if not v.nodes_real:
        return
    gpn = v.p.topology.gpus_per_node
    live = sorted({g // gpn for g in v.alive})
    _equal(v, "covered_experts",
           [len(set.intersection(*(layer[n] for n in live))) for layer in v.on_node])


def _replicas_moved(v: _View) -> None:
    """Slots on a GPU that held no replica of their expert in ``previous`` (`eplb.moves`'
    meaning: a local copy is no move), counted with sets per GPU."""
    if v.previous is None:
        return
    old = [_gpus(row, v.p.topology.slots_per_gpu) for row in v.previous.phy2log]
    moved = [sum(sum(1 for e in n[g] if e >= 0 and e not in set(o[g])) for g in range(len(n)))
             for n, o in zip(v.gpus, old, strict=True)]
    _equal(v, "replicas_moved", moved)
    _equal(v, "replicas_moved_total", sum(moved))


def _objective(v: _View) -> None:
    """Per layer: the max GPU load, plus ``rdma_weight * expected_rdma / G`` and
    ``migration_weight * replicas_moved`` where the solve priced them."""
    if not isinstance(v.field("objective"), list):
        return
    params = v.info.get("params") or {}
    lam = float(v.info.get("rdma_weight") or params.get("rdma_weight") or 0.0)
    mu = float(params.get("migration_weight") or 0.0)
    want = v.peak.copy()
    if lam:
        if not v.nodes_real:
            return  # priced on the survivors' one node (docs)
        want = want + lam * _rdma(v) / len(v.alive)
    if mu and v.previous is not None:
        want = want + mu * np.asarray(v.info.get("replicas_moved", np.zeros(len(want))))
    obj = np.asarray(v.field("objective"), dtype=np.float64)
    for layer, (a, b) in enumerate(zip(obj, want, strict=True)):
        _close(float(a), float(b), f"objective[{layer}]")
    if "objective_max" in v.info:
        _close(float(v.field("objective_max")), float(obj.max()), "objective_max")


def _rdma(v: _View) -> np.ndarray:
    """Expected RDMA picks per layer on the live nodes (`traffic_cost.expected_rdma`)."""
    from eplb.solvers.primitives.traffic_cost import expected_rdma  # lazy: testing <- solvers

    topo = v.p.topology
    if not topo.failed_gpus:
        return expected_rdma(v.p, v.load)
    S, gpn = topo.slots_per_gpu, topo.gpus_per_node  # whole nodes failed: the nodes left
    keep = (np.asarray(v.alive)[:, None] * S + np.arange(S)).ravel()
    return expected_rdma(v.p.phy2log[:, keep], v.load, Topology(len(v.alive) // gpn, gpn, S))


def _certificate(v: _View) -> None:
    """``bound <= objective``, ``gap = 1 - bound / objective``, ``optimal`` only where the
    bound proves it, and the aggregates."""
    obj = np.asarray(v.field("objective"), dtype=np.float64)
    bound = np.asarray(v.field("bound"), dtype=np.float64)
    bad = bound > obj * (1 + REL_TOL) + 1e-300
    assert not bad.any(), (
        f"meta bound[{int(np.argmax(bad))}] {bound[bad][0]!r} is above the objective "
        f"{obj[bad][0]!r} of the returned placement"
    )
    if "bound_min" in v.info:
        _close(float(v.field("bound_min")), float(bound.min()), "bound_min")
    if "gap" in v.info:
        gap = np.maximum(np.where(obj > 0, 1 - bound / np.where(obj > 0, obj, 1), 0.0), 0)
        got = np.asarray(v.field("gap"), dtype=np.float64)
        assert np.allclose(got, gap, rtol=1e-9, atol=PROOF_TOL), (
            f"meta gap is {got.tolist()}, 1 - bound / objective gives {gap.tolist()}"
        )
        for agg, val in (("gap_max", got.max()), ("gap_mean", got.mean())):
            if agg in v.info:
                _close(float(v.field(agg)), float(val), agg)
    status = list(v.info.get("status", []))
    for layer, s in enumerate(status):
        assert s != "optimal" or proven(bound[layer], obj[layer]), (
            f"meta status says layer {layer} is optimal, but its bound {bound[layer]!r} does "
            f"not prove the objective {obj[layer]!r}"
        )
    if "optimal_layers" in v.info:
        _equal(v, "optimal_layers", status.count("optimal"))


# field -> its check (run when the field is in meta["solver"]); fields named in a check's
# docstring beside its key are checked with it
_CHECKS: dict[str, Callable[[_View], None]] = {
    "duplicates": _duplicates,
    "fully_replicated": _fully_replicated,
    "used_slots": _used_slots,
    "expert_slots_per_gpu": _expert_slots_per_gpu,
    "total_slots": _total_slots,
    "objective_sum": _objective_sum,  # and bound_sum
    "group_to_node": _group_to_node,
    "foreign_replicas": _foreign_replicas,  # and foreign_budget
    "covered_experts": _covered_experts,
    "replicas_moved": _replicas_moved,  # and replicas_moved_total
    "objective": _objective,  # and objective_max
    "bound": _certificate,  # with objective: bound_min, gap, gap_max, gap_mean, status, ...
}
# the fields recomputed (others, e.g. seconds, params or a policy's own notes, are not)
CHECKED_FIELDS = (*_CHECKS, "bound_sum", "foreign_budget", "replicas_moved_total",
                  "objective_max", "bound_min", "gap", "gap_max", "gap_mean", "status",
                  "optimal_layers")


def assert_meta_truthful(
    p: Placement, load: ArrayLike, *, previous: Placement | None = None
) -> None:
    """Raise ``AssertionError`` naming the first ``meta["solver"]`` field of ``p`` (for
    ``load: float[L, E]``; ``previous``: the live placement it was solved against) that its
    placement contradicts. The fields (`CHECKED_FIELDS`) and what each must be are the
    docstrings of the checks; node-naming fields are read on the real nodes unless a node is
    partly failed (docs/solvers.md)."""
    info = dict(p.meta.get("solver") or {})
    view = _View(p, np.asarray(load, dtype=np.float64), info, previous)
    for name, check in _CHECKS.items():
        if name in info and (name != "bound" or "objective" in info):
            check(view)
