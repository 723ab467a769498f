"""Issue 18, part 2: every consumer of a placement with failed GPUs treats their slots (-1) as
empty; NumPy reads index -1 as the last expert, so each use below once put the last expert
(or a crash) on a dead GPU. Each test pins one site. Issue 33, part 1: live slots left empty
(as `craft` leaves them) are taken by every function that takes a placement."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eplb import Placement, Topology, solvers
from eplb.errors import InfeasibleError
from eplb.evaluation import metrics, traffic
from eplb.executor import MoELayer
from eplb.executor.executor import ReferenceExecutor
from eplb.solvers.analysis.failures import solve_surviving
from eplb.solvers.analysis.migration import replicas_moved
from eplb.solvers.primitives import local_first
from eplb.solvers.primitives.relabel import relabel
from eplb.solvers.primitives.traffic_cost import expected_rdma
from eplb.testing import assert_valid_placement
from eplb.testing.meta import assert_meta_truthful
from eplb.testing.strategies import placements, problems

POLICIES = ["even", "random", "local_first", "weighted", "lp"]
ONE = Placement(np.array([[0, -1]]), 1, Topology(1, 2, 1, failed_gpus=[1]))


@pytest.mark.parametrize("policy", POLICIES)
def test_dispatch_never_reaches_the_failed_gpu(policy):
    """The issue's case: one expert on GPU 0, GPU 1 failed; ``lp`` sent half the picks to
    GPU 1 (``[[2, 2]]``, counts ``[15.5, 15.5]``)."""
    rank = np.array([0, 1, 0, 1])
    ids = traffic.simulate(ONE, topk_ids=np.zeros((4, 1, 1), int), token_rank=rank, policy=policy)
    assert ids.gpu_tokens.tolist() == [[4, 0]]
    counts = traffic.simulate(ONE, load=np.array([[31.0]]), top_k=1, policy=policy)
    assert counts.gpu_tokens.tolist() == [[31.0, 0.0]]


@pytest.fixture(scope="module")
def failed():
    """Two layers, 4 experts on 2 nodes x 2 GPUs x 2 slots, GPU 2 failed (slots 4, 5 empty)."""
    topo = Topology(2, 2, 2, failed_gpus=[2])
    load = np.array([[10.0, 20, 30, 40], [40.0, 30, 20, 10]])
    p = solvers.solve("greedy", load, topo)
    assert (p.phy2log[:, 4:6] == -1).all()
    return p, load


def test_gpu_matrix_with_empty_slots(failed):
    """Was ``ValueError: 'list' argument must have no negative elements`` (key -1)."""
    p, _ = failed
    m = metrics.gpu_matrix(p)
    assert np.allclose(m.sum(2), 1.0) and (m[:, :, 2] == 0).all()


def test_metrics_gpu_loads_with_empty_slots(failed):
    p, load = failed
    got = metrics.gpu_loads(p, load)
    assert np.allclose(got, p.gpu_load(load)) and (got[:, 2] == 0).all()
    assert np.allclose(got.sum(1), load.sum(1))


def test_expected_rdma_with_empty_slots(failed):
    """Was an InputError ("expert ids outside 0..3") for a valid placement."""
    p, load = failed
    node = np.arange(8) // 4
    want = []
    for row, w in zip(p.phy2log, load, strict=True):
        nodes = [len({node[s] for s in range(8) if row[s] == e}) for e in range(4)]
        want.append(float((w * (1 - np.array(nodes) / 2)).sum()))
    assert np.allclose(expected_rdma(p, load), want)


def test_local_first_loads_with_empty_slots(failed):
    """Node counts and local-first loads skip empty slots (was a negative bincount key)."""
    p, load = failed
    topo = p.topology
    k = local_first.node_counts(p.phy2log, 4, topo)
    assert (k.sum((1, 2)) == 6).all()  # 6 live slots per layer
    gl = local_first.gpu_loads(load, p.phy2log, topo)
    assert (gl[:, 2] == 0).all() and np.allclose(gl.sum(1), load.sum(1))


def test_executor_holds_no_weights_on_a_failed_gpu(failed):
    """A failed GPU's slots held the last expert's weights; they hold none, and the forward
    pass still equals the dense one."""
    p, _ = failed
    layer = MoELayer(4, 6, 5, 2, dtype=np.float64, seed=1)
    ex = ReferenceExecutor(layer, p)
    w1, w3, w2 = ex.rank_weights(0)
    assert not w1[2].any() and not w3[2].any() and not w2[2].any()
    x = np.random.default_rng(0).standard_normal((10, 6))
    ids, w = layer.route(x)
    out, _ = ex.forward(x, ids, w, np.resize([0, 1, 3], 10))  # sources: the live GPUs
    assert np.allclose(out, layer.dense_forward(x, ids, w), atol=1e-10)


# ---------------------------------------------------------------- issue 33, part 1
# A valid placement may leave live slots empty (-1, as `craft` does): every function that
# takes a placement takes one (the strategy `placements(..., empty_slots=True)` draws them).


LIVE = Placement([[0, -1, 1, -1]], 2, Topology(1, 2, 2))  # the issue's live placement
ILP = {"deterministic_time": 0.05, "workers": 1, "progress": False}
QUICK = settings(max_examples=8, deadline=None, derandomize=True, database=None)


@pytest.mark.parametrize(
    ("name", "opts"),
    [
        ("repair", {}),
        ("repair", {"tolerance": 0.01}),
        ("repair", {"migration_budget": 1}),
        ("greedy", {"tolerance": 0.01}),  # the old spelling of repair
        ("robust", {"tolerance": 0.01}),
        ("ilp", {"migration_weight": 1.0, **ILP}),
        ("ilp", {"migration_budget": 1, **ILP}),
    ],
)
def test_issue_live_placement_with_empty_slots(name, opts):
    """Issue 33's minimal input: each raised ``ValueError: 'list' argument must have no
    negative elements`` (`np.bincount` of -1)."""
    load = np.array([[1.0, 2.0]])
    p = solvers.solve(name, load, LIVE.topology, previous=LIVE, **opts)
    assert_valid_placement(p, load)
    assert_meta_truthful(p, load, previous=LIVE)
    if "migration_budget" in opts:  # at most that many replicas moved, empty slots or not
        assert p.meta["solver"]["replicas_moved"][0] <= opts["migration_budget"]


def _takes_previous():
    """Every registered policy (`solve` takes ``previous=`` for all: it relabels, or the
    policy places against it), with options for small checks."""
    for name in solvers.available():
        if name.startswith(("eval_", "test_", "_check_")):
            continue
        opts = {"ilp": ILP, "ilp_weighted": {"workers": 1, "progress": False}}.get(name, {})
        yield pytest.param(name, opts, id=name)
    yield pytest.param("ilp", {"migration_weight": 0.5, **ILP}, id="ilp-migration_weight")
    yield pytest.param("ilp", {"migration_budget": 2, **ILP}, id="ilp-migration_budget")
    yield pytest.param("robust", {"tolerance": 0.01}, id="robust-tolerance")
    yield pytest.param("repair", {"migration_budget": 2}, id="repair-migration_budget")


@pytest.mark.parametrize(("name", "opts"), list(_takes_previous()))
@QUICK
@given(data=st.data())
def test_every_policy_takes_a_live_placement_with_empty_slots(name, opts, data):
    """``solve(..., previous=live)`` with empty slots in ``live`` (failed GPUs too) gives a
    valid placement whose meta is true; where the policy does not place against ``live``
    itself it only relabels (the same GPU loads as without ``previous``)."""
    needs = solvers.needs_groups(name, opts)
    load, topo, groups = data.draw(problems(max_layers=2, failures=True, no_groups=not needs))
    live = data.draw(placements(load, topo, empty_slots=True))
    assert (live.phy2log[:, topo.slot_alive] < 0).any() or live.num_slots - len(
        topo.failed_gpus) * topo.slots_per_gpu == load.shape[1]
    try:
        p = solvers.solve(name, load, topo, num_groups=groups, previous=live, **opts)
    except InfeasibleError:  # e.g. lplb where no replica graph fits: refused as without it
        with pytest.raises(InfeasibleError):
            solvers.solve(name, load, topo, num_groups=groups, **opts)
        return
    assert_valid_placement(p, load)
    assert_meta_truthful(p, load, previous=live)
    if not p.meta["solver"].get("relabeled"):
        plain = solvers.solve(name, load, topo, num_groups=groups, **opts)
        assert np.allclose(np.sort(plain.gpu_load(load), 1), np.sort(p.gpu_load(load), 1),
                           rtol=1e-9, atol=1e-300)
    if "migration_budget" in opts:
        assert max(p.meta["solver"]["replicas_moved"]) <= opts["migration_budget"]


@QUICK
@given(data=st.data(), tolerance=st.sampled_from([0.0, 0.01]))
def test_repair_from_empty_slots_is_within_tolerance_of_greedy(data, tolerance):
    """Repair fills empty slots (never empties one): every layer within ``tolerance`` of a
    fresh greedy solve (the documented guarantee without a budget)."""
    load, topo, _ = data.draw(problems(max_layers=3))
    live = data.draw(placements(load, topo, empty_slots=True))
    p = solvers.solve("repair", load, topo, previous=live, tolerance=tolerance)
    fresh = solvers.solve("greedy", load, topo).gpu_load(load).max(1)
    assert (p.gpu_load(load).max(1) <= fresh * (1 + tolerance) * (1 + 1e-9) + 1e-300).all()
    kept = (live.phy2log >= 0) & (p.phy2log < 0)  # no slot the live placement used is emptied
    taken = set(p.meta["solver"]["incremental"]["fresh_layers"])
    assert not kept[[i for i in range(load.shape[0]) if i not in taken]].any()


@QUICK
@given(data=st.data())
def test_relabel_and_moves_with_empty_slots_on_both_sides(data):
    """`relabel` and `replicas_moved` take placements with empty slots on either side: the
    GPU contents are only permuted, and the moves (slots whose GPU held none of their expert,
    `eplb.moves`' meaning, counted here in plain Python) never grow."""
    load, topo, _ = data.draw(problems(max_layers=2))
    old = data.draw(placements(load, topo, empty_slots=True))
    new = data.draw(placements(load, topo, empty_slots=None))
    out = relabel(new, old)
    S, G = topo.slots_per_gpu, topo.num_gpus

    def gpus(p):
        return [[Counter(int(e) for e in row[g * S:(g + 1) * S] if e >= 0) for g in range(G)]
                for row in p.phy2log]

    for a, b in zip(gpus(new), gpus(out), strict=True):
        assert sorted(map(sorted, (c.elements() for c in a))) == sorted(
            map(sorted, (c.elements() for c in b)))
    moved = [sum(c for g in range(G) for e, c in n[g].items() if e not in o[g])
             for n, o in zip(gpus(out), gpus(old), strict=True)]
    assert replicas_moved(old, out).tolist() == moved
    assert (replicas_moved(old, out) <= replicas_moved(old, new)).all()


def test_relabel_does_not_read_an_empty_slot_as_the_last_expert():
    """`relabel.overlap` indexed the old counts with -1, i.e. the last expert: here it kept
    the labels and moved expert 1; now it swaps GPUs 1 and 2 and moves nothing."""
    topo = Topology(1, 3, 1)
    old, new = Placement([[0, 1, -1]], 2, topo), Placement([[0, -1, 1]], 2, topo)
    out = relabel(new, old)
    assert out.phy2log.tolist() == [[0, 1, -1]] and replicas_moved(old, out).tolist() == [0]


def test_survivors_keep_the_live_placements_empty_slots():
    """`solve_surviving` turned a live placement's empty slots into replicas of expert 0 (so
    relabeling saw copies that were not there); they stay empty."""
    topo = Topology(1, 3, 2, failed_gpus=[2])
    live = Placement([[0, -1, 1, 2, -1, -1]], 3, Topology(1, 3, 2))
    load = np.array([[1.0, 2.0, 3.0]])
    _, prev, _, _ = solve_surviving(lambda ld, t, p: None, load, topo, previous=live)
    assert prev.phy2log.tolist() == [[0, -1, 1, 2]]
    p = solvers.solve("greedy", load, topo, previous=live)
    assert_valid_placement(p, load)
    assert_meta_truthful(p, load, previous=live)


def test_lplb_after_a_gpu_failure_says_it_cannot_place():
    """Issue 33: lplb refused 178 of 184 post-failure cases with an error about a topology
    the user never gave; the error now names the failed GPUs and the survivors' topology."""
    load = np.ones((1, 24))
    assert solvers.solve("lplb", load, Topology(2, 4, 6)).validate()
    with pytest.raises(InfeasibleError) as err:
        solvers.solve("lplb", load, Topology(2, 4, 6, failed_gpus=[1]))
    msg = str(err.value)
    assert "'lplb' cannot place on the 7 GPUs that survive failed GPUs [1]" in msg
    assert "Topology(1, 7, 6)" in msg and "power-of-two" in msg
