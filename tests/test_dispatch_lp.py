"""The ``lp`` dispatch policy: exact min-max integer splits per batch (`eplb.dispatch.minmax`)
and the routing built on it (`eplb.dispatch`), checked against brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eplb import Placement, Topology
from eplb.dispatch import lp_plan, minmax, route
from eplb.errors import InputError


# ------------------------------------------------------------------- the split
@st.composite
def split_problems(draw):
    """``(demand [J], fixed [G], arc_j [A], arc_g [A])``: tiny, every expert with an arc."""
    G = draw(st.integers(1, 4))
    J = draw(st.integers(0, 3))
    fixed = np.array(draw(st.lists(st.integers(0, 7), min_size=G, max_size=G)))
    demand = np.array(draw(st.lists(st.integers(0, 6), min_size=J, max_size=J)), dtype=np.int64)
    arcs = set()
    for j in range(J):
        gs = draw(st.lists(st.integers(0, G - 1), min_size=1, max_size=G, unique=True))
        arcs |= {(j, g) for g in gs}
    arcs = sorted(arcs)
    arc_j = np.array([a for a, _ in arcs], dtype=np.int64)
    arc_g = np.array([b for _, b in arcs], dtype=np.int64)
    return demand, fixed, arc_j, arc_g


def brute_split(demand, fixed, arc_j, arc_g) -> int:
    """Smallest largest GPU load over every integer split (enumerated)."""
    per = []
    for j in range(demand.size):
        gs = arc_g[arc_j == j]
        per.append(
            [
                (gs, c)
                for c in itertools.product(range(demand[j] + 1), repeat=gs.size)
                if sum(c) == demand[j]
            ]
        )
    best = None
    for combo in itertools.product(*per):
        load = fixed.copy()
        for gs, c in combo:
            load[gs] += c
        best = load.max() if best is None else min(best, load.max())
    return int(fixed.max()) if best is None else int(best)


@settings(max_examples=150)
@given(split_problems())
def test_split_is_optimal_against_brute_force_and_the_lp(problem):
    demand, fixed, arc_j, arc_g = problem
    T, flow = minmax.split(demand, fixed, arc_j, arc_g)
    assert flow.dtype == np.int64 and (flow >= 0).all()
    np.testing.assert_array_equal(np.bincount(arc_j, flow, minlength=demand.size), demand)
    assert (fixed + np.bincount(arc_g, flow, minlength=fixed.size)).max() == T
    assert T == brute_split(demand, fixed, arc_j, arc_g)
    if demand.size:
        t_lp, _ = minmax.split_lp(demand, fixed, arc_j, arc_g)
        assert int(np.ceil(t_lp - 1e-9)) == T


@settings(max_examples=60)
@given(split_problems(), st.integers(0, 2**16))
def test_split_by_source_node_keeps_the_optimum_and_locality(problem, seed):
    demand, fixed, arc_j, arc_g = problem
    G = fixed.size
    rng = np.random.default_rng(seed)
    nodes = int(rng.choice([n for n in range(1, G + 1) if G % n == 0]))
    gpu_node = np.arange(G) // (G // nodes)
    per_node = np.array(
        [rng.multinomial(d, np.ones(nodes) / nodes) for d in demand], dtype=np.int64
    ).reshape(demand.size, nodes)
    T, flow = minmax.split(demand, fixed, arc_j, arc_g, source_nodes=per_node, gpu_node=gpu_node)
    assert flow.shape == (arc_j.size, nodes) and (flow >= 0).all()
    for j in range(demand.size):
        np.testing.assert_array_equal(flow[arc_j == j].sum(0), per_node[j])
    load = fixed + np.bincount(arc_g, flow.sum(1), minlength=G)
    assert load.max() == T == minmax.split(demand, fixed, arc_j, arc_g)[0]
    for j in range(demand.size):  # each node's picks use the arcs on their node first
        on = flow[arc_j == j]  # [arcs of j, nodes]
        node_of_arc = gpu_node[arc_g[arc_j == j]]
        for a in range(nodes):
            local = on[node_of_arc == a].sum()
            assert on[node_of_arc == a, a].sum() == min(per_node[j, a], local)


def test_split_refuses_bad_input():
    with pytest.raises(InputError, match="needs at least one arc"):
        minmax.split([3], [0, 0], [], [])
    with pytest.raises(InputError, match=">= 0"):
        minmax.split([-1], [0], [0], [0])
    with pytest.raises(InputError, match="join experts"):
        minmax.split([1], [0], [0], [5])


# ------------------------------------------------------------------- routing
@st.composite
def batches(draw):
    """``(placement, ids [N, K], rank [N])``: <= 2 nodes x 3 GPUs x 3 slots, tiny batches."""
    topo = Topology(draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    E = draw(st.integers(1, topo.num_slots))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    table = np.concatenate([rng.permutation(E), rng.integers(0, E, topo.num_slots - E)])
    rng.shuffle(table)
    placement = Placement(table[None], E, topo).validate()
    K = draw(st.integers(1, min(E, 3)))
    N = draw(st.integers(0, 8))
    ids = (
        np.stack([rng.choice(E, K, replace=False) for _ in range(N)])
        if N
        else np.zeros((0, K), dtype=np.int64)
    )
    rank = rng.integers(0, topo.num_gpus, N)
    return placement, ids, rank


def brute_batch(placement: Placement, ids: np.ndarray) -> int:
    """Smallest busiest-GPU picks over every way of sending each pick to a replica GPU."""
    topo = placement.topology
    S, G = topo.slots_per_gpu, topo.num_gpus
    gpus = {
        e: sorted({int(s) // S for s in placement.log2phy[0, e] if s >= 0})
        for e in range(placement.num_experts)
    }
    n = np.bincount(ids.ravel(), minlength=placement.num_experts)
    fixed = np.zeros(G, dtype=np.int64)
    demand, arc_j, arc_g = [], [], []
    for e in np.nonzero(n)[0]:
        if len(gpus[e]) == 1:
            fixed[gpus[e][0]] += n[e]
        else:
            arc_j += [len(demand)] * len(gpus[e])
            arc_g += gpus[e]
            demand.append(n[e])
    return brute_split(
        np.array(demand, dtype=np.int64),
        fixed,
        np.array(arc_j, dtype=np.int64),
        np.array(arc_g, dtype=np.int64),
    )


def gpu_picks(slots: np.ndarray, topo: Topology) -> np.ndarray:
    return np.bincount(slots.ravel() // topo.slots_per_gpu, minlength=topo.num_gpus)


@settings(max_examples=120)
@given(batches())
def test_lp_routes_whole_picks_to_replicas_optimally(case):
    placement, ids, rank = case
    topo = placement.topology
    slots = route(ids, placement, policy="lp", token_rank=rank)
    assert slots.shape == ids.shape and slots.dtype == np.int64
    # every pick goes to one slot holding its expert (whole picks, conserved)
    np.testing.assert_array_equal(placement.phy2log[0][slots], ids)
    got = gpu_picks(slots, topo)
    assert got.sum() == ids.size
    # never worse than even (or any other policy) on the busiest GPU; optimal by brute force
    for policy in ("even", "local_first", "random"):
        other = route(ids, placement, policy=policy, token_rank=rank, seed=3)
        assert got.max(initial=0) <= gpu_picks(other, topo).max(initial=0)
    if ids.size:
        assert got.max() == brute_batch(placement, ids)
    # deterministic
    np.testing.assert_array_equal(route(ids.copy(), placement, policy="lp", token_rank=rank), slots)


@settings(max_examples=60)
@given(batches())
def test_lp_plan_conserves_picks_and_floats_follow_integers(case):
    placement, ids, rank = case
    topo = placement.topology
    G, E = topo.num_gpus, placement.num_experts
    amounts = np.zeros((G, E), dtype=np.int64)
    np.add.at(amounts, (np.repeat(rank, ids.shape[1]), ids.ravel()), 1)
    plan = lp_plan(amounts, placement)
    np.testing.assert_array_equal(plan.sum(2), amounts)
    held = np.zeros((E, G), dtype=bool)
    held[placement.phy2log[0], np.arange(topo.num_slots) // topo.slots_per_gpu] = True
    assert (plan[:, ~held] == 0).all()  # only to GPUs holding the expert
    fl = lp_plan(amounts.astype(float), placement)
    np.testing.assert_allclose(fl.sum(2), amounts, atol=1e-9)
    assert fl.sum((0, 1)).max() <= plan.sum((0, 1)).max() + 1e-6


def test_lp_prefers_local_replicas():
    # expert 0 on GPU 0 (node 0) and GPU 2 (node 1); its picks come half from each node
    topo = Topology(2, 2, 2)
    placement = Placement(np.array([[0, 1, 2, 3, 0, 4, 5, 6]]), 7, topo).validate()
    ids = np.array([[0], [0], [0], [0]])
    rank = np.array([0, 1, 2, 3])
    slots = route(ids, placement, policy="lp", token_rank=rank)
    assert slots.ravel().tolist() == [0, 0, 4, 4]  # node 0's tokens stay on node 0
    with pytest.raises(InputError, match="needs token_rank"):
        route(ids, placement, policy="lp")


def test_executor_with_lp_equals_the_dense_forward_and_the_traffic_model():
    from eplb.evaluation.traffic import simulate
    from eplb.executor import MoELayer, ReferenceExecutor

    rng = np.random.default_rng(7)
    topo = Topology(2, 2, 3)
    E, N, K = 9, 64, 3
    table = np.concatenate([np.arange(E), [0, 0, 1]])  # expert 0 on three GPUs, 1 on two
    placement = Placement(rng.permutation(table)[None], E, topo).validate()
    layer = MoELayer(E, 8, 6, K, seed=2, dtype=np.float64)
    ids = np.stack(
        [rng.choice(E, K, replace=False, p=np.r_[0.4, 0.2, [0.4 / 7] * 7]) for _ in range(N)]
    )
    w = rng.random((N, K))
    x = rng.standard_normal((N, 8))
    rank = rng.integers(0, topo.num_gpus, N)
    out, stats = ReferenceExecutor(layer, placement, "lp").forward(x, ids, w, rank)
    np.testing.assert_allclose(out, layer.dense_forward(x, ids, w), atol=1e-12)
    rep = simulate(placement, topk_ids=ids[:, None, :], token_rank=rank, policy="lp", hidden=8)
    np.testing.assert_array_equal(rep.gpu_tokens[0], stats.gpu_tokens)
    assert rep.rdma_bytes[0] == stats.rdma_bytes and rep.nvlink_bytes[0] == stats.nvlink_bytes
    even = gpu_picks(route(ids, placement, policy="even"), topo)
    assert stats.gpu_tokens.max() <= even.max()


def test_lp_sends_nothing_to_a_failed_gpu():
    """Issue 18 (2): empty slots (-1) are no replica of the last expert (NumPy's -1 index)."""
    from eplb.evaluation.traffic import simulate

    p = Placement(np.array([[0, -1]]), 1, Topology(1, 2, 1, failed_gpus=[1]))
    tok = simulate(p, topk_ids=np.zeros((4, 1, 1), int), token_rank=np.array([0, 1, 0, 1]),
                   policy="lp")
    assert tok.gpu_tokens.tolist() == [[4, 0]]
    counts = simulate(p, load=np.array([[31.0]]), policy="lp")
    assert counts.gpu_tokens.tolist() == [[31.0, 0.0]]
