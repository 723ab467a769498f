"""One meaning of "a replica moved" (issue 32, part 3): the executor's.

A GPU receives a replica over a link only when it held no copy of that expert before; a second
copy of an expert already on the GPU is a local copy. Solver meta, ``replay``, the serving
simulator's rebalance records and ``advise`` all count through `eplb.moves`; these tests pin
that they agree with each other, with the reference executor's transfers and with a brute force.
"""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eplb import InputError, Placement, Topology, solvers
from eplb.evaluation.replay import replay
from eplb.evaluation.serving.config.model import get_model
from eplb.evaluation.serving.config.schema import EplbConfig
from eplb.evaluation.serving.simulator.planner import Planner, migration_bytes
from eplb.executor import MoELayer, ReferenceExecutor
from eplb.moves import gpu_moves, replicas_moved
from eplb.solvers.analysis import migration
from eplb.traces import Trace

# the module (the package's name `advise` is its function)
ADVISE = importlib.import_module("eplb.evaluation.serving.advise")


def brute_force(old: np.ndarray, new: np.ndarray, G: int) -> np.ndarray:
    """``int64[L, G]``: per GPU, the new non-empty slots whose expert it did not hold."""
    L = old.shape[0]
    so, sn = old.shape[1] // G, new.shape[1] // G
    out = np.zeros((L, G), dtype=np.int64)
    for lay in range(L):
        for g in range(G):
            held = {int(e) for e in old[lay, g * so : (g + 1) * so] if e >= 0}
            out[lay, g] = sum(1 for e in new[lay, g * sn : (g + 1) * sn] if e >= 0
                              and int(e) not in held)
    return out


def executor_moves(old: Placement, new: Placement) -> np.ndarray:
    """``int64[L]``: replicas the reference executor copies over NVLink or RDMA."""
    layer = MoELayer(old.num_experts, 2, 2, top_k=1, seed=0)
    ex = ReferenceExecutor(layer, old)
    for li in range(old.num_layers):
        ex.rank_weights(li)  # load every layer: rebalance copies the loaded ones
    ex.rebalance(new)
    rep = ex.last_rebalance
    return (rep.nvlink_bytes + rep.rdma_bytes) // rep.expert_bytes


def test_a_local_duplicate_is_not_a_move_for_anyone():
    """The disagreement of issue 32: deepseek on load [50, 50] from ``previous`` [0 1 | 0 1]
    places [0 0 | 1 1]; the solver's meta said 2 replicas moved (a per-GPU multiset count),
    the simulator's migration bytes 0. Each GPU already held the expert it doubles: the
    executor copies both locally, nothing crosses a link."""
    topo = Topology(1, 2, 2)
    old = Placement([[0, 1, 0, 1]], 2, topo).validate()
    new = solvers.solve("deepseek", np.array([[50.0, 50.0]]), topo, previous=old)
    assert new.phy2log.tolist() == [[0, 0, 1, 1]]
    assert executor_moves(old, new).tolist() == [0]
    assert new.meta["solver"]["replicas_moved"] == [0]
    assert new.meta["solver"]["replicas_moved_total"] == 0
    assert migration.replicas_moved(old, new).tolist() == [0]
    assert migration_bytes(old, new, 1.0).tolist() == [0.0, 0.0]


def test_definition_by_hand():
    topo = Topology(1, 2, 2)
    old = Placement([[0, 1, 2, -1]], 3, topo)
    # reordered inside a GPU: nothing; an emptied slot: nothing
    assert gpu_moves(old.phy2log, [[1, 0, -1, 2]], 2).tolist() == [[0, 0]]
    # GPU 1 gains expert 0 twice (held none: 2 copies over the link), GPU 0 gains 2 once
    assert gpu_moves(old.phy2log, [[2, 1, 0, 0]], 2).tolist() == [[1, 2]]
    # fewer slots per GPU (3 -> 1) and an empty old GPU
    assert gpu_moves([[0, 1, 2, -1, -1, -1]], [[2, 1]], 2).tolist() == [[0, 1]]
    assert replicas_moved(old, Placement([[2, 1, 0, 0]], 3, topo)).tolist() == [3]


@pytest.mark.parametrize(
    "args",
    [
        ([[0, 1]], [[0, 1]], 0),
        ([[0, 1]], [[0, 1, 2]], 2),
        ([[0, 1]], [[0], [1]], 1),
        ([[0, -2]], [[0, 1]], 1),
        ([[0.5, 1]], [[0, 1]], 1),
        ([0, 1], [[0, 1]], 1),
        ("01", [[0, 1]], 1),
    ],
)
def test_bad_tables_are_refused_with_input_errors(args):
    with pytest.raises(InputError):
        gpu_moves(*args)


def test_placements_of_other_problems_are_refused():
    topo = Topology(1, 2, 2)
    p = Placement([[0, 1, 0, 1]], 2, topo)
    with pytest.raises(InputError, match="experts"):
        replicas_moved(p, Placement([[0, 1, 2, 1]], 3, topo))
    with pytest.raises(InputError, match="GPUs"):
        replicas_moved(p, Placement([[0, 1, 0, 1]], 2, Topology(1, 4, 1)))
    with pytest.raises(InputError, match="Placement"):
        replicas_moved(p.phy2log, p)


@st.composite
def pairs(draw):
    """Two valid placements of one problem: every expert placed, other slots random experts
    or empty (-1); slots per GPU may differ when ``same_slots`` is False."""
    N, gpn, L = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 3))
    E = draw(st.integers(1, 5))
    same = draw(st.booleans())
    G = N * gpn
    lo = -(-E // G)  # slots per GPU that hold every expert
    s_old = draw(st.integers(lo, lo + 2))
    s_new = s_old if same else draw(st.integers(lo, lo + 2))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    empty = draw(st.floats(0, 0.6))

    def table(S):
        P = G * S
        rows = []
        for _ in range(L):
            row = np.where(rng.random(P) < empty, -1, rng.integers(0, E, P))
            row[rng.permutation(P)[:E]] = rng.permutation(E)  # every expert at least once
            rows.append(row)
        return Placement(np.array(rows), E, Topology(N, gpn, S)).validate()

    return table(s_old), table(s_new)


@pytest.fixture
def fixed_solver():
    """Registers ``moves_fixed`` for one test: it returns ``box["new"]`` as is (marked
    relabeled, so `solvers.solve` keeps its slots)."""
    box: dict = {}

    def fixed(load, topology, *, num_groups=None, previous=None, seed=0, time_limit=None):
        p = box["new"]
        return Placement(p.phy2log, p.num_experts, topology, meta={"solver": {"relabeled": True}})

    solvers.register("moves_fixed")(fixed)
    try:
        yield box
    finally:
        solvers.unregister("moves_fixed")


def _planner(topo: Topology, E: int, L: int) -> Planner:
    base = get_model("deepseek_v3")
    model = dataclasses.replace(base, num_layers=base.dense_layers + L, num_experts=E,
                                num_groups=1, topk_groups=1, top_k=1)
    return Planner(EplbConfig(solver="moves_fixed"), model, topo, seed=0, unit_key=(0, 0))


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pair=pairs())
def test_the_four_counts_agree_with_the_executor(pair, fixed_solver):
    """Solver meta, replay, the simulator's rebalance plan and advise's bytes count the same
    moves on random pairs (empty slots, other slot counts), equal to the executor's link
    copies and to a brute force."""
    old, new = pair
    G, L = new.topology.num_gpus, new.num_layers
    want = brute_force(old.phy2log, new.phy2log, G)
    eb = 7.0
    assert np.array_equal(gpu_moves(old.phy2log, new.phy2log, G), want)
    assert np.array_equal(replicas_moved(old, new), want.sum(1))
    assert np.array_equal(migration.replicas_moved(old, new), want.sum(1))
    assert np.array_equal(ADVISE.migration_bytes(old, new, eb), want.sum(0) * eb)  # advise
    assert np.array_equal(migration_bytes(old, new, eb), want.sum(0) * eb)  # simulator records
    if old.topology != new.topology:
        return  # a change of slots per GPU: solve, replay and the executor keep one topology
    assert np.array_equal(executor_moves(old, new), want.sum(1))
    fixed_solver["new"] = new
    topo, E = new.topology, new.num_experts
    load = np.ones((L, E))
    meta = solvers.solve("moves_fixed", load, topo, previous=old).meta["solver"]  # solver meta
    assert meta["replicas_moved"] == want.sum(1).tolist()
    assert meta["replicas_moved_total"] == int(want.sum())
    trace = Trace(np.ones((2, L, E)), meta={"top_k": 1})
    first = Placement(old.phy2log, E, topo, layer_ids=trace.layer_ids)
    frame = replay(trace, topo, solver="moves_fixed", initial=first, expert_bytes=eb)
    assert frame["replicas_moved"].tolist() == [0, int(want.sum())]  # replay
    assert frame["bytes_moved"].tolist() == [0.0, want.sum() * eb]
    planner = _planner(topo, E, L)
    plan = planner.plan(old, load, load)  # the simulator's rebalance records
    assert plan.replicas_moved == int(want.sum())
    assert plan.bytes_moved == want.sum() * planner.expert_bytes
