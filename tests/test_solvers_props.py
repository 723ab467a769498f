"""Properties of every registered solver on random small problems (hypothesis): placement
invariants, determinism, never below the lower bound, relabeling with ``previous=`` keeps the
multiset of GPU loads; plus migration, traffic proxy and bad-input errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import solvers
from eplb import InputError, Placement, Topology
from solvers.bounds import lower_bound
from solvers.migration import relabel, replicas_moved
from solvers.traffic_cost import expected_rdma

SOLVER_OPTIONS = {
    "deepseek": [{}],
    "greedy": [{}],
    "greedy_weighted": [{}],
    "greedy_traffic": [{"rdma_weight": 2.0}],
    "hierarchical": [{}],
    "ilp": [
        {"deterministic_time": 0.5, "workers": 1},
        {"deterministic_time": 0.5, "workers": 1, "hierarchical": True},
        {"deterministic_time": 0.5, "workers": 1, "rdma_weight": 1.0},
    ],
    "ilp_weighted": [{"workers": 1}],
}
NEEDS_PREVIOUS = {"repair"}  # property-tested in test_solvers_incremental.py


@st.composite
def problems(draw, max_layers=2):
    """(load [L, E], topology, num_groups) with E = groups * M, groups a multiple of N."""
    N = draw(st.integers(1, 2))
    gpn = draw(st.integers(1, 3))
    groups = N * draw(st.integers(1, 2))
    M = draw(st.integers(1, 3))
    E = groups * M
    G = N * gpn
    S = draw(st.integers(max(1, -(-E // G)), max(1, -(-E // G)) + 2))
    L = draw(st.integers(1, max_layers))
    shape = st.lists(st.integers(0, 1000), min_size=E, max_size=E)
    rows = draw(st.lists(shape, min_size=L, max_size=L))
    load = np.array(rows, dtype=float)
    if draw(st.booleans()):  # one hot expert per layer
        load[:, 0] *= draw(st.integers(2, 20))
    return load, Topology(N, gpn, S), groups


def _all_runs():
    """Every registered solver (test spies of other suites excluded), with its option sets."""
    for name in solvers.available():
        if name.startswith(("eval_", "test_")) or name in NEEDS_PREVIOUS:
            continue
        for o in SOLVER_OPTIONS.get(name, [{}]):
            yield name, o


def test_issue_solvers_are_registered():
    assert set(SOLVER_OPTIONS) <= set(solvers.available())


@pytest.mark.parametrize(
    ("name", "opts"),
    list(_all_runs()),
    ids=[f"{n}-{'-'.join(o) or 'plain'}" for n, o in _all_runs()],
)
@settings(max_examples=25, deadline=None)
@given(prob=problems())
def test_solver_properties(name, opts, prob):
    load, topo, groups = prob
    kw = dict(opts)
    num_groups = groups
    p = solvers.solve(name, load, topo, num_groups=num_groups, seed=3, **kw)
    # invariants (solve validates; check the essentials again explicitly)
    p.validate()
    assert p.phy2log.shape == (load.shape[0], topo.num_slots)
    assert (p.logcnt >= 1).all() and (p.logcnt.sum(1) == topo.num_slots).all()
    assert p.meta["solver"]["name"] == name
    # determinism for a seed
    q = solvers.solve(name, load, topo, num_groups=num_groups, seed=3, **kw)
    assert q.equals(p)
    # never below the lower bound (of the problem class the solver addresses)
    weighted = p.replica_share is not None
    is_hier = p.meta["solver"].get("policy") == "hierarchical"
    lb = lower_bound(load, topo, num_groups=groups, hierarchical=is_hier, weighted=weighted)
    gpu = p.gpu_load(load)
    assert (gpu.max(1) >= lb * (1 - 1e-9) - 1e-9).all()
    if not weighted:
        assert (gpu.max(1) >= lower_bound(load, topo) * (1 - 1e-9) - 1e-9).all()
    if is_hier:  # every group on one node
        node = topo.node_of_slot
        grp = p.phy2log // (load.shape[1] // groups)
        for layer in range(load.shape[0]):
            for k in range(groups):
                assert len(set(node[grp[layer] == k])) == 1
    if name in ("greedy", "greedy_weighted", "hierarchical") and not p.meta["solver"].get("exact"):
        # no two replicas of an expert on a GPU wherever the GPU's node has enough experts,
        # except on layers taken from DeepSeek's placement (strictly better there)
        ds_layers = set(p.meta["solver"].get("deepseek_layers", []))
        L, N = load.shape[0], topo.num_nodes
        by_node = p.phy2log.reshape(L, N, -1)
        e = np.sort(p.phy2log.reshape(L, N, topo.gpus_per_node, -1), axis=3)
        dup = (e[..., 1:] == e[..., :-1]).any(-1)  # [L, N, gpn]
        for layer in range(L):
            for n in range(N):
                pool = load.shape[1] if not is_hier else len(set(by_node[layer, n]))
                if pool >= topo.slots_per_gpu and layer not in ds_layers:
                    assert not dup[layer, n].any()
        if load.shape[1] >= topo.slots_per_gpu and not is_hier and not ds_layers:
            assert p.meta["solver"]["duplicates"] == 0
            if not weighted:
                assert p.logcnt.max() <= topo.num_gpus


@pytest.mark.parametrize(
    ("name", "opts"),
    list(_all_runs()),
    ids=[f"{n}-{'-'.join(o) or 'plain'}" for n, o in _all_runs()],
)
@settings(max_examples=15, deadline=None)
@given(prob=problems(), seed=st.integers(0, 1000))
def test_previous_relabels_without_changing_loads(name, opts, prob, seed):
    """Issue 12: previous= changes nothing but labels, for every solver and option set."""
    load, topo, groups = prob
    rng = np.random.default_rng(seed)
    prev_load = load * rng.uniform(0.5, 1.5, size=load.shape)
    ng = groups
    previous = solvers.solve(name, prev_load, topo, num_groups=ng, **opts)
    plain = solvers.solve(name, load, topo, num_groups=ng, **opts)
    moved = solvers.solve(name, load, topo, num_groups=ng, previous=previous, **opts)
    # multiset of GPU loads unchanged; per-GPU replica sets unchanged up to GPU relabeling
    assert np.allclose(np.sort(moved.gpu_load(load), 1), np.sort(plain.gpu_load(load), 1))
    L, G = load.shape[0], topo.num_gpus

    def gpu_sets(p):
        rows = np.sort(p.phy2log.reshape(L, G, -1), axis=2)
        return [sorted(map(tuple, r)) for r in rows]

    assert gpu_sets(moved) == gpu_sets(plain)
    got = np.array(moved.meta["solver"]["replicas_moved"])
    assert np.array_equal(got, replicas_moved(previous, moved))
    assert (got <= replicas_moved(previous, plain)).all()
    if plain.replica_share is not None:  # shares travel with their replicas
        assert np.allclose(np.sort(moved.gpu_load(load), 1), np.sort(plain.gpu_load(load), 1))
    # relabeling the same placement against itself moves nothing
    same = solvers.solve(name, prev_load, topo, num_groups=ng, previous=previous, **opts)
    assert same.meta["solver"]["replicas_moved_total"] == 0


@settings(max_examples=60, deadline=None)
@given(prob=problems(), grouped=st.booleans())
def test_greedy_never_worse_than_deepseek(prob, grouped):
    """Issue 12: on every input and layer, global and (with groups) hierarchical DeepSeek."""
    load, topo, groups = prob
    ng = groups if grouped else None
    mine = solvers.solve("greedy", load, topo, num_groups=ng).gpu_load(load).max(1)
    ds = solvers.solve("deepseek", load, topo, num_groups=ng).gpu_load(load).max(1)
    assert (mine <= ds * (1 + 1e-12)).all()
    if grouped:  # and never worse than DeepSeek's global placement either
        ds = solvers.solve("deepseek", load, topo).gpu_load(load).max(1)
        assert (mine <= ds * (1 + 1e-12)).all()


def test_greedy_counterexample_from_issue_12():
    load = np.array([[512.0, 1, 512, 1, 2]])
    topo = Topology(1, 2, 3)
    mine = solvers.solve("greedy", load, topo).gpu_load(load).max()
    assert mine <= solvers.solve("deepseek", load, topo).gpu_load(load).max() == 515


@settings(max_examples=60, deadline=None)
@given(prob=problems())
def test_hierarchical_never_worse_than_deepseek(prob):
    """Issue 12: under the same contract (groups a multiple of the nodes), every layer."""
    load, topo, groups = prob
    mine = solvers.solve("hierarchical", load, topo, num_groups=groups).gpu_load(load).max(1)
    ds = solvers.solve("deepseek", load, topo, num_groups=groups).gpu_load(load).max(1)
    assert (mine <= ds * (1 + 1e-12)).all()


@settings(max_examples=15, deadline=None)
@given(prob=problems(), seed=st.integers(0, 1000))
def test_relabel_recovers_a_permuted_placement(prob, seed):
    load, topo, groups = prob
    p = solvers.solve("greedy", load, topo)
    rng = np.random.default_rng(seed)
    N, gpn, S = topo.num_nodes, topo.gpus_per_node, topo.slots_per_gpu
    L = load.shape[0]
    t = p.phy2log.reshape(L, N, gpn, S)[:, rng.permutation(N)]
    t = t[:, :, rng.permutation(gpn)][..., rng.permutation(S)]
    shuffled = Placement(t.reshape(L, -1), p.num_experts, topo)
    assert (replicas_moved(p, relabel(shuffled, p)) == 0).all()
    assert np.array_equal(relabel(shuffled, p).phy2log, p.phy2log)


def test_relabel_keeps_shares_with_their_replicas():
    load = np.array([[40.0, 30, 20, 10, 5, 5]])
    topo = Topology(2, 2, 2)
    a = solvers.solve("greedy_weighted", load, topo)
    b = solvers.solve("greedy_weighted", load * [[1, 1, 1, 1, 2, 2]], topo, previous=a)
    assert np.allclose(
        np.sort(b.gpu_load(load * [[1, 1, 1, 1, 2, 2]]), 1),
        np.sort(
            solvers.solve(
                "greedy_weighted",
                load * [[1, 1, 1, 1, 2, 2]],
                topo,
            ).gpu_load(load * [[1, 1, 1, 1, 2, 2]]),
            1,
        ),
    )


def test_replicas_moved_counts_per_gpu_differences():
    topo = Topology(1, 2, 2)
    old = Placement([[0, 1, 2, 3]], 4, topo)
    assert replicas_moved(old, Placement([[1, 0, 3, 2]], 4, topo)).tolist() == [0]
    assert replicas_moved(old, Placement([[0, 2, 1, 3]], 4, topo)).tolist() == [2]
    assert replicas_moved(old, Placement([[2, 3, 0, 1]], 4, topo)).tolist() == [4]


def test_expected_rdma_proxy():
    topo = Topology(2, 1, 2)  # two nodes of one GPU
    load = np.array([[100.0, 10, 10]])
    spread = Placement([[0, 1, 0, 2]], 3, topo)  # expert 0 on both nodes
    packed = Placement([[0, 0, 1, 2]], 3, topo)
    assert expected_rdma(spread, load).tolist() == [0 + 5 + 5]
    assert expected_rdma(packed, load).tolist() == [50 + 5 + 5]
    assert expected_rdma(spread.phy2log, load, topo).tolist() == [10.0]
    with pytest.raises(InputError):
        expected_rdma(spread.phy2log, load)


def test_traffic_weight_trades_balance_for_rdma():
    rng = np.random.default_rng(0)
    load = rng.zipf(1.6, size=(3, 32)).astype(float)
    topo = Topology(4, 2, 5)
    plain = solvers.solve("greedy", load, topo)
    zero = solvers.solve("greedy", load, topo, rdma_weight=0.0)  # old spelling: plain greedy
    assert zero.equals(plain)
    lam = 50.0
    aware = solvers.solve("greedy_traffic", load, topo, rdma_weight=lam)
    assert aware.equals(solvers.solve("greedy", load, topo, rdma_weight=lam))  # old spelling

    def objective(p):
        return p.gpu_load(load).max(1) + lam * expected_rdma(p, load) / topo.num_gpus

    assert (objective(aware) <= objective(plain) * (1 + 1e-9)).all()
    assert expected_rdma(aware, load).sum() < expected_rdma(plain, load).sum()
    assert np.allclose(aware.meta["solver"]["objective"], objective(aware))


def test_ilp_migration_budget_limits_moves():
    rng = np.random.default_rng(1)
    topo = Topology(1, 3, 2)
    a_load = rng.integers(1, 50, size=(1, 5)).astype(float)
    b_load = a_load[:, ::-1].copy()
    prev = solvers.solve("greedy", a_load, topo)
    free = solvers.solve("ilp", b_load, topo, previous=prev, deterministic_time=2, workers=1)
    capped = solvers.solve(
        "ilp",
        b_load,
        topo,
        previous=prev,
        deterministic_time=2,
        workers=1,
        migration_budget=1,
        counts="free",
    )
    assert capped.meta["solver"]["replicas_moved_total"] <= 1
    assert capped.gpu_load(b_load).max() >= free.gpu_load(b_load).max() - 1e-9
    pen = solvers.solve(
        "ilp",
        b_load,
        topo,
        previous=prev,
        deterministic_time=2,
        workers=1,
        migration_weight=1e6,
        counts="free",
    )
    assert pen.meta["solver"]["replicas_moved_total"] == 0  # a huge penalty keeps everything


@pytest.mark.parametrize(
    ("name", "kw", "match"),
    [
        ("greedy", {"rdma_weight": -1}, "rdma_weight"),
        ("ilp", {"counts": "some"}, "counts"),
        ("ilp", {"migration_weight": 1.0}, "previous"),
        ("ilp", {"workers": 0}, "workers"),
        ("hierarchical", {}, "num_groups"),
        ("hierarchical", {"num_groups": 3}, "divide"),
        ("hierarchical", {"num_groups": 1}, "every node"),
    ],
)
def test_bad_options_raise_clear_errors(name, kw, match):
    load = np.ones((1, 8))
    with pytest.raises(InputError, match=match):
        solvers.solve(name, load, Topology(2, 2, 3), **kw)


def test_lower_bound_input_errors():
    with pytest.raises(InputError, match="num_groups"):
        lower_bound(np.ones((1, 8)), Topology(2, 2, 2), hierarchical=True)
    with pytest.raises(InputError, match="lp"):
        lower_bound(np.ones((1, 8)), Topology(2, 2, 2), lp="yes")


def test_ilp_process_pool_keeps_layer_order_and_results():
    rng = np.random.default_rng(7)
    load = rng.integers(0, 100, size=(3, 6)).astype(float)
    topo = Topology(1, 3, 3)
    one = solvers.solve("ilp", load, topo, deterministic_time=0.5, workers=1, counts="free")
    two = solvers.solve("ilp", load, topo, deterministic_time=0.5, workers=2, counts="free")
    assert two.equals(one)
    assert two.meta["solver"]["objective"] == pytest.approx(one.gpu_load(load).max(1).tolist())
