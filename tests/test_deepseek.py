"""The `deepseek` solver: DeepSeek's published example, the loop oracle, properties, real data."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from eplb import InfeasibleError, InputError, Topology, solvers, traces
from eplb.solvers.primitives.deepseek_kernels import rebalance_experts
from eplb.testing.deepseek_reference import rebalance as reference

README_LOAD = [
    [90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
    [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27],
]
README_PHY2LOG = [
    [5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
    [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1],
]
README_LOGCNT = [[1, 2, 1, 1, 2, 2, 1, 1, 1, 1, 2, 1], [1, 2, 1, 1, 1, 2, 2, 1, 2, 1, 1, 1]]


def test_deepseek_readme_example():
    phy2log, log2phy, logcnt = rebalance_experts(np.array(README_LOAD), 16, 4, 2, 8)
    assert phy2log.tolist() == README_PHY2LOG
    assert logcnt.tolist() == README_LOGCNT
    # DeepSeek's log2phy lists replicas by creation order; every listed slot holds the expert
    for layer in range(2):
        for e in range(12):
            slots = [s for s in log2phy[layer, e] if s >= 0]
            assert len(slots) == logcnt[layer, e]
            assert all(phy2log[layer, s] == e for s in slots)


def test_registry_solver_matches_api_and_is_valid():
    topo = Topology(2, 4, 2)
    p = solvers.solve("deepseek", README_LOAD, topo, num_groups=4)
    assert p.phy2log.tolist() == README_PHY2LOG
    assert p.logcnt.tolist() == README_LOGCNT
    assert p.meta["solver"]["name"] == "deepseek"
    assert p.meta["solver"]["policy"] == "hierarchical"
    assert p.meta["solver"]["seconds"] >= 0
    # Placement.log2phy is by ascending slot (vLLM/SGLang convention)
    assert p.log2phy[0, 1].tolist() == [13, 15]


@pytest.mark.parametrize(
    ("load", "topo", "expected_max", "expected_cnt0"),
    [
        ([[1000, 1, 1, 1, 1, 1, 1, 1]], Topology(1, 4, 3), 401.0, 5),
        ([[600, 560, 120, 120, 20, 10, 10, 10]], Topology(1, 8, 2), 232.0, 5),
    ],
)
def test_known_weaknesses_reproduce(load, topo, expected_max, expected_cnt0):
    p = solvers.solve("deepseek", load, topo)
    assert p.gpu_load(load).max() == expected_max
    assert p.logcnt[0, 0] == expected_cnt0


@st.composite
def problems(draw, integer: bool | None = None):
    """Random (load, topology, num_groups) with DeepSeek's preconditions met."""
    nodes = draw(st.integers(1, 3))
    gpn = draw(st.integers(1, 4))
    G = nodes * gpn
    groups = draw(st.sampled_from([1, 2, 3, 4, 6]))
    per_group = draw(st.integers(1, 4))
    E = groups * per_group
    S = draw(st.integers(-(-E // G), -(-E // G) + 3))
    assume(S * G >= E)
    integer = draw(st.booleans()) if integer is None else integer
    L = draw(st.integers(1, 3))
    if integer:
        elem = st.integers(0, 50)
    else:
        elem = st.floats(0, 1e4, allow_nan=False, allow_infinity=False)
    load = np.array(
        draw(st.lists(st.lists(elem, min_size=E, max_size=E), min_size=L, max_size=L)),
        dtype=np.float64,
    )
    return load, Topology(nodes, gpn, S), groups


@given(problems())
def test_vectorised_equals_loop_oracle(problem):
    load, topo, groups = problem
    p = solvers.solve("deepseek", load, topo, num_groups=groups)
    want = reference(load, topo.num_slots, groups, topo.num_nodes, topo.num_gpus)
    np.testing.assert_array_equal(p.phy2log, want)


@given(problems())
def test_invariants_determinism_and_layer_independence(problem):
    load, topo, groups = problem
    a = solvers.solve("deepseek", load, topo, num_groups=groups)
    b = solvers.solve("deepseek", load.copy(), topo, num_groups=groups)
    a.validate()
    assert a.equals(b)
    for layer in range(load.shape[0]):
        one = solvers.solve("deepseek", load[layer : layer + 1], topo, num_groups=groups)
        np.testing.assert_array_equal(one.phy2log[0], a.phy2log[layer])
    # the GPU loads account for every token exactly once
    np.testing.assert_allclose(a.gpu_load(load).sum(-1), load.sum(-1), rtol=1e-12)


@given(problems(integer=True), st.integers(0, 20))
def test_scaling_by_power_of_two_changes_nothing(problem, exp):
    load, topo, groups = problem
    a = solvers.solve("deepseek", load, topo, num_groups=groups)
    b = solvers.solve("deepseek", load * 2.0**exp, topo, num_groups=groups)
    np.testing.assert_array_equal(a.phy2log, b.phy2log)


def _tie_free(load: np.ndarray, P: int) -> bool:
    """No two different experts ever tie on load/count (float32) for counts 1..P."""
    c = np.arange(1, P + 1, dtype=np.float32)
    for row in load.astype(np.float32):
        if np.any(row <= 0):
            return False
        q = (row[:, None] / c[None, :]).ravel()
        owner = np.repeat(np.arange(row.size), P)
        order = np.argsort(q, kind="stable")
        qs, os_ = q[order], owner[order]
        same = qs[1:] == qs[:-1]
        if np.any(same & (os_[1:] != os_[:-1])):
            return False
    return True


@given(problems(integer=True), st.randoms(use_true_random=False))
def test_relabeling_experts_relabels_the_placement(problem, rnd):
    """Global policy, tie-free loads, S >= 2: load'[pi(e)] = load[e]  =>  phy2log' = pi[phy2log].

    (With S == 1 packing is positional, see the test below.)"""
    load, topo, _ = problem
    assume(topo.slots_per_gpu >= 2)
    load = load + 1 + np.arange(load.shape[1]) * 1e-3  # positive, distinct
    assume(_tie_free(load, topo.num_slots))
    E = load.shape[1]
    pi = np.arange(E)
    rnd.shuffle(pi)
    relabeled = np.empty_like(load)
    relabeled[:, pi] = load
    a = solvers.solve("deepseek", load, topo)
    b = solvers.solve("deepseek", relabeled, topo)
    np.testing.assert_array_equal(b.phy2log, pi[a.phy2log])


@given(problems(integer=True), st.randoms(use_true_random=False))
def test_hierarchical_group_permutation_relabels(problem, rnd):
    """Hierarchical, tie-free experts and groups: permuting whole groups relabels the output."""
    load, topo, groups = problem
    # groups_per_node >= 2 and S >= 2: otherwise packing is positional (item i -> pack i)
    assume(groups % topo.num_nodes == 0 and groups // topo.num_nodes >= 2)
    assume(topo.slots_per_gpu >= 2)
    load = load + 1 + np.arange(load.shape[1]) * 1e-3
    assume(_tie_free(load, topo.num_slots))
    L, E = load.shape
    gs = E // groups
    group_sums = load.reshape(L, groups, gs).sum(-1).astype(np.float32)
    assume(all(len(set(row.tolist())) == groups for row in group_sums))
    gperm = np.arange(groups)
    rnd.shuffle(gperm)
    pi = (gperm[:, None] * gs + np.arange(gs)).ravel()  # expert e of group g -> group gperm[g]
    relabeled = np.empty_like(load)
    relabeled[:, pi] = load
    a = solvers.solve("deepseek", load, topo, num_groups=groups)
    b = solvers.solve("deepseek", relabeled, topo, num_groups=groups)
    np.testing.assert_array_equal(b.phy2log, pi[a.phy2log])


@st.composite
def one_slot_problems(draw):
    """(load, topology) with one slot per GPU (``S == 1``, so ``G >= E``), drawn directly."""
    E = draw(st.integers(1, 12))
    nodes = draw(st.integers(1, 3))
    gpn = -(-E // nodes) + draw(st.integers(0, 2))
    L = draw(st.integers(1, 3))
    elem = st.floats(0, 1e4, allow_nan=False, allow_infinity=False)
    load = np.array(
        draw(st.lists(st.lists(elem, min_size=E, max_size=E), min_size=L, max_size=L)),
        dtype=np.float64,
    )
    return load, Topology(nodes, gpn, 1)


@given(one_slot_problems())
def test_one_slot_per_gpu_packs_positionally(problem):
    """S == 1, global policy: slot j < E holds expert j; extra slots in replica creation order."""
    load, topo = problem
    p = solvers.solve("deepseek", load, topo)
    E = load.shape[1]
    np.testing.assert_array_equal(p.phy2log[:, :E], np.broadcast_to(np.arange(E), (len(load), E)))


def test_hierarchical_keeps_groups_on_their_node():
    rng = np.random.default_rng(1)
    load = rng.integers(0, 1000, size=(5, 64)).astype(float)
    topo = Topology(4, 2, 10)  # 80 slots, 16 per node
    p = solvers.solve("deepseek", load, topo, num_groups=8)
    group = p.phy2log // 8
    node = topo.node_of_slot
    for layer in range(5):
        nodes_of_group = {g: set(node[group[layer] == g]) for g in range(8)}
        assert all(len(ns) == 1 for ns in nodes_of_group.values())


@pytest.mark.parametrize(
    ("load", "topo", "groups", "match"),
    [
        (np.ones((2, 12)), Topology(2, 4, 2), 8, "num_groups 8 does not divide 12 experts"),
        (np.ones((2, 40)), Topology(2, 4, 2), 4, "16 slots cannot hold 40 experts"),
        (np.ones(12), Topology(2, 4, 2), 4, "2-D"),
        (np.full((1, 12), np.nan), Topology(2, 4, 2), 4, "finite"),
        (-np.ones((1, 12)), Topology(2, 4, 2), 4, ">= 0"),
        (np.ones((1, 12)), Topology(2, 4, 2), 0, "num_groups must be an integer >= 1"),
    ],
)
def test_preconditions_raise_clear_errors(load, topo, groups, match):
    with pytest.raises((InputError, InfeasibleError), match=match):
        solvers.solve("deepseek", load, topo, num_groups=groups)


def test_api_preconditions_name_the_value():
    with pytest.raises(InputError, match="slots 15 is not a multiple of 8 GPUs; use 16"):
        rebalance_experts(np.ones((1, 12)), 15, 4, 2, 8)
    with pytest.raises(InputError, match="8 GPUs do not split evenly over 3 nodes"):
        rebalance_experts(np.ones((1, 12)), 16, 3, 3, 8)


@pytest.mark.parametrize("shape", [(0, 8), (3, 0)])
def test_empty_weight_is_an_input_error(shape):
    """Issue 33: ``rebalance_experts(np.zeros((0, 8)), 16, 4, 2, 4)`` raised a raw
    ``ValueError`` (a reshape); DeepSeek's fails there too (a max over an empty ``logcnt``),
    so it is an `InputError` naming the shape."""
    with pytest.raises(InputError, match=rf"weight has shape \({shape[0]}, {shape[1]}\)"):
        rebalance_experts(np.zeros(shape), 16, 4, 2, 4)


def test_group_count_off_the_nodes_falls_back_to_global_like_deepseek():
    """Issue 19 part 5: DeepSeek's ``rebalance_experts`` (and vLLM's port, whose
    ``test_parameter_validation`` uses this input) takes the global policy whenever
    ``num_groups % num_nodes != 0``, also when the groups do not divide the experts."""
    weight = [[10, 20, 30, 40]]
    p = solvers.solve("deepseek", weight, Topology(2, 2, 2), num_groups=3)
    assert p.phy2log.tolist() == [[2, 1, 2, 1, 3, 3, 3, 0]]
    assert p.meta["solver"]["policy"] == "global"
    assert p.meta["solver"]["params"]["num_groups"] == 3
    phy2log, log2phy, logcnt = rebalance_experts(weight, 8, 3, 2, 4)
    assert phy2log.tolist() == [[2, 1, 2, 1, 3, 3, 3, 0]]
    assert logcnt.tolist() == [[1, 2, 2, 3]] and log2phy.shape == (1, 4, 3)
    # the global policy ignores the node count: DeepSeek's does not ask it to divide the GPUs
    phy2log, _, _ = rebalance_experts(np.arange(12.0)[None], 16, 2, 3, 8)
    np.testing.assert_array_equal(phy2log, reference(np.arange(12.0)[None], 16, 2, 3, 8))
    # what DeepSeek's refuses stays refused: slots not a multiple of the GPUs, or a group
    # count that selects the hierarchical policy but does not divide the experts
    with pytest.raises(InputError, match="slots 7 is not a multiple of 4 GPUs"):
        rebalance_experts(weight, 7, 2, 2, 4)
    with pytest.raises(InputError, match="num_groups 8 does not divide 4 experts"):
        solvers.solve("deepseek", weight, Topology(2, 2, 2), num_groups=8)
    with pytest.raises(InputError, match="num_groups must be >= 1 for the hierarchical"):
        rebalance_experts(weight, 8, 0, 2, 4)
    # the other policies keep groups that divide the experts
    with pytest.raises(InputError, match="num_groups 3 does not divide 4 experts"):
        solvers.solve("greedy", weight, Topology(2, 2, 2), num_groups=3)


@st.composite
def fallback_problems(draw):
    """(load, topology, num_groups) with ``num_groups % num_nodes != 0``: DeepSeek's global
    fallback; the group count need not divide the experts."""
    nodes = draw(st.integers(2, 3))
    gpn = draw(st.integers(1, 3))
    E = draw(st.integers(1, 12))
    G = nodes * gpn
    S = draw(st.integers(-(-E // G), -(-E // G) + 2))
    groups = draw(st.integers(1, 16).filter(lambda g: g % nodes))
    L = draw(st.integers(1, 3))
    elem = st.one_of(st.integers(0, 6), st.floats(0, 1e4, allow_nan=False))  # ties and not
    load = np.array(
        draw(st.lists(st.lists(elem, min_size=E, max_size=E), min_size=L, max_size=L)),
        dtype=np.float64,
    )
    return load, Topology(nodes, gpn, S), groups


@given(fallback_problems())
def test_fallback_equals_the_loop_oracle(problem):
    load, topo, groups = problem
    p = solvers.solve("deepseek", load, topo, num_groups=groups)
    assert p.meta["solver"]["policy"] == "global"
    want = reference(load, topo.num_slots, groups, topo.num_nodes, topo.num_gpus)
    np.testing.assert_array_equal(p.phy2log, want)


@given(
    st.integers(1, 10),
    st.integers(1, 6),
    st.integers(2, 5),
    st.integers(1, 16),
    st.integers(0, 2),
    st.randoms(use_true_random=False),
)
def test_api_fallback_accepts_what_deepseek_accepts(E, gpus, nodes, groups, extra, rnd):
    """`rebalance_experts` in the global fallback: any node count (it need not divide the
    GPUs) and any group count that is not a multiple of it, as DeepSeek's."""
    assume(groups % nodes)
    P = (-(-E // gpus) + extra) * gpus
    load = np.array([[float(rnd.randint(0, 5)) for _ in range(E)] for _ in range(2)])
    phy2log, log2phy, logcnt = rebalance_experts(load, P, groups, nodes, gpus)
    np.testing.assert_array_equal(phy2log, reference(load, P, groups, nodes, gpus))
    assert logcnt.sum(1).tolist() == [P, P]


def test_unknown_solver_lists_available():
    with pytest.raises(InputError, match="unknown solver 'nope'; available: .*deepseek"):
        solvers.solve("nope", np.ones((1, 4)), Topology(1, 2, 2))


@pytest.mark.parametrize(
    ("topo", "groups", "policy"),
    [
        (Topology(4, 8, 9), 8, "hierarchical"),  # prefill setting
        (Topology(18, 8, 2), 8, "global"),  # decode setting
    ],
)
def test_real_deepseek_v3_counts(deepseek_jsons, topo, groups, policy):
    for path in deepseek_jsons:
        trace = traces.read(path)
        load = trace.load()
        assert load.shape == (58, 256)
        p = solvers.solve("deepseek", load, topo, num_groups=groups)
        assert p.meta["solver"]["policy"] == policy
        gpu = p.gpu_load(load)
        np.testing.assert_allclose(gpu.sum(-1), load.sum(-1))
        # the oracle agrees on a couple of real layers too
        want = reference(load[:2], topo.num_slots, groups, topo.num_nodes, topo.num_gpus)
        np.testing.assert_array_equal(p.phy2log[:2], want)
