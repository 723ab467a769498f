"""Reference executor: MoE layer, kernels, distributed forward == dense forward, rebalance."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eplb import InputError, Placement, PlacementError, Topology
from eplb.executor import (
    POLICIES,
    Buffer,
    MoELayer,
    ReferenceExecutor,
    combine,
    dispatch,
    dispatch_layout,
    even_token_rank,
    expert_compute,
    kernels,
    route,
    weight_moves,
)
from eplb.executor.executor import LINK_LOCAL, LINK_NVLINK, LINK_RDMA
from eplb.executor.kernels import (
    HOP_LOCAL,
    HOP_NVLINK,
    HOP_RDMA,
    HOP_RDMA_NVLINK,
)

TOL = {np.float64: 1e-9, np.float32: 1e-5}


# ------------------------------------------------------------------ strategies (shared)
def random_placement(rng: np.random.Generator, topo: Topology, num_experts: int, layers: int = 1,
                     weighted: bool = False) -> Placement:
    """Every expert once, the remaining slots random experts, all shuffled; random shares."""
    E, P = num_experts, topo.num_slots
    rows = np.stack([
        rng.permutation(np.concatenate([np.arange(E), rng.integers(0, E, P - E)]))
        for _ in range(layers)
    ])
    share = None
    if weighted:
        raw = rng.random((layers, P)) + 0.05
        flat = (rows + (np.arange(layers) * E)[:, None]).ravel()
        sums = np.bincount(flat, weights=raw.ravel(), minlength=layers * E)
        share = raw / sums[flat].reshape(layers, P)
    return Placement(rows, E, topo, share).validate()


def random_batch(rng: np.random.Generator, n: int, num_experts: int, k: int, num_gpus: int,
                 hidden: int, dtype=np.float64):
    """``(x [n, H], topk_ids [n, k] distinct per token, weights [n, k], token_rank [n])``."""
    ids = np.argsort(rng.random((n, num_experts)), axis=1)[:, :k]
    x = rng.standard_normal((n, hidden)).astype(dtype)
    w = rng.random((n, k)).astype(dtype)
    rank = rng.integers(0, num_gpus, n)
    return x, ids, w, rank


@st.composite
def cases(draw, max_layers: int = 1, max_tokens: int = 40):
    """``(placement, policy, seed, tokens, top_k)`` on a random topology of <= 3x3x3."""
    topo = Topology(draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    E = draw(st.integers(1, topo.num_slots))
    layers = draw(st.integers(1, max_layers))
    seed = draw(st.integers(0, 2**32 - 1))
    policy = draw(st.sampled_from(POLICIES))
    rng = np.random.default_rng(seed)
    placement = random_placement(rng, topo, E, layers, weighted=draw(st.booleans()))
    n = draw(st.integers(0, max_tokens))
    k = draw(st.integers(1, min(E, 4)))
    return placement, policy, seed, n, k


def silu_ref(z):
    return z / (1.0 + np.exp(-z))


# --------------------------------------------------------------------------- MoELayer
def test_layer_shapes_and_determinism():
    a = MoELayer(8, 16, 12, 2, seed=3)
    b = MoELayer(8, 16, 12, 2, seed=3)
    assert a.w1.shape == a.w3.shape == (8, 16, 12) and a.w2.shape == (8, 12, 16)
    assert a.gate.shape == (16, 8) and a.w1.dtype == np.float32
    assert np.array_equal(a.w2, b.w2) and not np.array_equal(a.w2, MoELayer(8, 16, 12, 2).w2)
    assert a.expert_bytes == 3 * 16 * 12 * 4 and a.flops_per_pick == 6 * 16 * 12


def test_route_softmax_picks_top_scores():
    layer = MoELayer(10, 8, 4, 3, dtype=np.float64, seed=1)
    x = np.random.default_rng(0).standard_normal((50, 8))
    ids, w = layer.route(x)
    s = layer.scores(x)
    assert np.allclose(s.sum(1), 1)
    assert ids.shape == w.shape == (50, 3)
    assert (np.sort(ids, 1)[:, 1:] != np.sort(ids, 1)[:, :-1]).all()
    assert np.array_equal(w, np.take_along_axis(s, ids, 1))
    # the picks are the K largest scores, in descending order
    assert np.allclose(np.sort(s, 1)[:, ::-1][:, :3], w)


def test_route_sigmoid_group_limited_matches_brute_force():
    E, ng, tg, K = 16, 4, 2, 3
    layer = MoELayer(E, 8, 4, K, num_groups=ng, topk_groups=tg, dtype=np.float64,
                     scoring="sigmoid", seed=2)
    x = np.random.default_rng(1).standard_normal((40, 8))
    ids, w = layer.route(x)
    s = layer.scores(x)
    assert np.allclose(w.sum(1), 1)
    for n in range(40):
        groups = s[n].reshape(ng, E // ng)
        gscore = np.sort(groups, 1)[:, -2:].sum(1)  # DeepSeek-V3: sum of the best two
        best = sorted(range(ng), key=lambda g: (-gscore[g], g))[:tg]
        allowed = [e for e in range(E) if e // (E // ng) in best]
        want = sorted(allowed, key=lambda e: (-s[n, e], e))[:K]
        assert ids[n].tolist() == want
        assert np.allclose(w[n], s[n, want] / s[n, want].sum())


def test_route_groups_restrict_choice():
    layer = MoELayer(32, 8, 4, 4, num_groups=8, topk_groups=1, seed=4)
    ids, _ = layer.route(np.random.default_rng(2).standard_normal((100, 8)))
    assert (np.ptp(ids // 4, axis=1) == 0).all()  # one group of 4 experts per token


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_groups": 3}, "does not divide"),
        ({"num_groups": 4, "topk_groups": 5}, "exceeds num_groups"),
        ({"num_groups": 8, "topk_groups": 1}, "fewer than top_k"),
        ({"topk_groups": 2}, "needs num_groups"),
        ({"dtype": np.int32}, "float32 or float64"),
        ({"scoring": "relu"}, "scoring"),
        ({"top_k": 9}, "exceeds num_experts"),
        ({"hidden": 0}, "hidden must be a positive integer"),
    ],
)
def test_layer_rejects_bad_config(kwargs, match):
    args = {"num_experts": 8, "hidden": 4, "ffn": 4, "top_k": 2, **kwargs}
    with pytest.raises(InputError, match=match):
        MoELayer(**args)


def test_dense_forward_equals_per_token_formula():
    layer = MoELayer(6, 5, 7, 2, dtype=np.float64, seed=5)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((9, 5))
    ids, w = layer.route(x)
    out = layer.dense_forward(x, ids, w)
    for n in range(9):
        want = np.zeros(5)
        for k in range(2):
            e = ids[n, k]
            h = silu_ref(x[n] @ layer.w1[e]) * (x[n] @ layer.w3[e])
            want += w[n, k] * (h @ layer.w2[e])
        assert np.allclose(out[n], want, rtol=0, atol=1e-12)


def test_duplicate_experts_refused():
    topo = Topology(1, 2, 2)
    layer = MoELayer(4, 4, 4, 2, dtype=np.float64)
    ex = ReferenceExecutor(layer, Placement([[0, 1, 2, 3]], 4, topo))
    x = np.ones((3, 4))
    ids = np.array([[0, 1], [2, 2], [3, 0]])
    w = np.ones((3, 2))
    with pytest.raises(InputError, match="token 1 picks expert 2 more than once"):
        ex.forward(x, ids, w, [0, 0, 1])
    with pytest.raises(InputError, match="more than once"):
        layer.dense_forward(x, ids, w)


@pytest.mark.parametrize(
    ("x", "ids", "w", "rank", "match"),
    [
        (np.ones((2, 3)), [[0, 1], [1, 2]], np.ones((2, 2)), [0, 0], "hidden=4"),
        (np.ones((2, 4)), [[0, 1]], np.ones((1, 2)), [0, 0], "one row per token"),
        (np.ones((2, 4)), [[0, 4], [1, 2]], np.ones((2, 2)), [0, 0], "outside experts 0..3"),
        (np.ones((2, 4)), [[0.5, 1], [1, 2]], np.ones((2, 2)), [0, 0], "topk_ids must be integers"),
        (np.ones((2, 4)), [[0, 1], [1, 2]], [[1, np.nan], [1, 1]], [0, 0], "must be finite"),
        (np.ones((2, 4)), [[0, 1], [1, 2]], np.ones((2, 3)), [0, 0], "like topk_ids"),
        (np.ones((2, 4)), [[0, 1], [1, 2]], np.ones((2, 2)), [0, 2], "GPU ids in 0..1"),
    ],
)
def test_forward_rejects_bad_input(x, ids, w, rank, match):
    topo = Topology(1, 2, 2)
    ex = ReferenceExecutor(MoELayer(4, 4, 4, 2), Placement([[0, 1, 2, 3]], 4, topo))
    with pytest.raises(InputError, match=match):
        ex.forward(x, ids, w, rank)


def test_executor_rejects_bad_setup():
    topo = Topology(1, 2, 2)
    good = Placement([[0, 1, 2, 3]], 4, topo)
    with pytest.raises(InputError, match="placement has 4 experts but the layer has 5"):
        ReferenceExecutor(MoELayer(5, 4, 4, 2), good)
    with pytest.raises(PlacementError, match="expert 3 has no replica"):
        ReferenceExecutor(MoELayer(4, 4, 4, 2), Placement([[0, 1, 2, 2]], 4, topo))
    with pytest.raises(InputError, match="unknown dispatch policy"):
        ReferenceExecutor(MoELayer(4, 4, 4, 2), good, policy="nearest")
    ex = ReferenceExecutor(MoELayer(4, 4, 4, 2), good)
    with pytest.raises(InputError, match="outside the placement's 1 layers"):
        ex.forward(np.ones((1, 4)), [[0, 1]], [[1, 1]], [0], layer_index=1)


# ------------------------------------------------------- distributed == dense (property)
@settings(max_examples=120, deadline=None)
@given(cases(max_layers=2), st.sampled_from([np.float64, np.float32]))
def test_executor_equals_dense_forward(case, dtype):
    placement, policy, seed, n, k = case
    topo = placement.topology
    rng = np.random.default_rng(seed + 1)
    layer = MoELayer(placement.num_experts, 8, 6, k, seed=seed % 1000, dtype=dtype)
    x, ids, w, rank = random_batch(rng, n, placement.num_experts, k, topo.num_gpus, 8, dtype)
    ex = ReferenceExecutor(layer, placement, policy, seed=seed)
    ref = layer.dense_forward(x, ids, w)
    for li in range(placement.num_layers):
        out, stats = ex.forward(x, ids, w, rank, layer_index=li)
        assert out.shape == (n, 8) and out.dtype == dtype
        np.testing.assert_allclose(out, ref, rtol=TOL[dtype], atol=TOL[dtype])
        # the stats describe the routed picks
        slots = route(ids, placement, layer_index=li, policy=policy, token_rank=rank, seed=seed)
        dest = slots // topo.slots_per_gpu
        P, G = topo.num_slots, topo.num_gpus
        assert np.array_equal(stats.slot_tokens, np.bincount(slots.ravel(), minlength=P))
        assert np.array_equal(stats.gpu_tokens, np.bincount(dest.ravel(), minlength=G))
        per_gpu = [sum(g in dest[t] for t in range(n)) for g in range(topo.num_gpus)]
        assert stats.recv_tokens.tolist() == per_gpu
        assert stats.gpu_tokens.sum() == n * k
        assert np.array_equal(stats.flops, stats.gpu_tokens * layer.flops_per_pick)


@settings(max_examples=40, deadline=None)
@given(cases())
def test_kernels_layout_invariants(case):
    placement, policy, seed, n, k = case
    topo = placement.topology
    G, gpn, S = topo.num_gpus, topo.gpus_per_node, topo.slots_per_gpu
    rng = np.random.default_rng(seed)
    x, ids, w, rank = random_batch(rng, n, placement.num_experts, k, G, 5)
    slots = route(ids, placement, policy=policy, token_rank=rank, seed=seed)
    lo = dispatch_layout(slots, rank, topo)
    dest = slots // S
    # receive rows: the distinct (token, gpu) pairs, destination-major, tokens ascending
    pairs = sorted({(int(g), t) for t in range(n) for g in dest[t]})
    assert list(zip(lo.recv_gpu.tolist(), lo.recv_token.tolist(), strict=True)) == pairs
    assert np.array_equal(lo.rank_offsets, np.searchsorted(lo.recv_gpu, np.arange(G + 1)))
    assert np.array_equal(lo.num_tokens_per_rank, lo.is_token_in_rank.sum(0))
    assert lo.is_token_in_rank.sum() == len(pairs)
    # RDMA rows: one per (token, remote node), at the rail peer
    remote = sorted({(int(g) // gpn, t) for t in range(n) for g in dest[t]
                     if g // gpn != rank[t] // gpn})
    assert list(zip(lo.rdma_node.tolist(), lo.rdma_token.tolist(), strict=True)) == remote
    assert np.array_equal(lo.rdma_gpu, lo.rdma_node * gpn + rank[lo.rdma_token] % gpn)
    # hops
    src = rank[lo.recv_token]
    hop = lo.recv_hop
    assert np.array_equal(hop == HOP_LOCAL, lo.recv_gpu == src)
    same_node = lo.recv_gpu // gpn == src // gpn
    assert np.array_equal(hop == HOP_NVLINK, (lo.recv_gpu != src) & same_node)
    far = hop >= HOP_RDMA
    assert np.array_equal(far, lo.recv_gpu // gpn != src // gpn)
    assert np.array_equal(lo.rdma_token[lo.recv_rdma_row[far]], lo.recv_token[far])
    assert np.array_equal(lo.rdma_node[lo.recv_rdma_row[far]], lo.recv_gpu[far] // gpn)
    rail = lo.rdma_gpu[lo.recv_rdma_row[far]]
    assert np.array_equal(hop[far] == HOP_RDMA, rail == lo.recv_gpu[far])
    assert np.array_equal(hop[far] == HOP_RDMA_NVLINK, rail != lo.recv_gpu[far])
    # picks
    token_of_pick = np.broadcast_to(np.arange(n)[:, None], (n, k))
    assert np.array_equal(lo.recv_token[lo.pick_row], token_of_pick)
    assert np.array_equal(lo.recv_gpu[lo.pick_row], dest)
    flat = slots.ravel()[lo.pick_order]
    assert (np.diff(flat) >= 0).all()
    assert np.array_equal(lo.slot_offsets, np.searchsorted(flat, np.arange(topo.num_slots + 1)))
    # dispatch buffers hold the right rows; combine of identity experts is sum_k w * x
    recv, rdma = dispatch(x, lo)
    assert np.array_equal(recv, x[lo.recv_token]) and np.array_equal(rdma, x[lo.rdma_token])
    y = recv[lo.pick_row.ravel()[lo.pick_order]]
    np.testing.assert_allclose(combine(y, w, lo), w.sum(1, keepdims=True) * x, atol=1e-12)


def test_expert_compute_runs_each_slot_on_its_rows():
    topo = Topology(1, 2, 2)
    placement = Placement([[3, 0, 1, 2]], 4, topo)
    layer = MoELayer(4, 4, 3, 2, dtype=np.float64)
    ex = ReferenceExecutor(layer, placement)
    rng = np.random.default_rng(0)
    x, ids, w, rank = random_batch(rng, 7, 4, 2, 2, 4)
    lo = dispatch_layout(route(ids, placement), rank, topo)
    recv, _ = dispatch(x, lo)
    y = expert_compute(recv, lo, *ex.rank_weights())
    for p in range(4):
        a, b = lo.slot_offsets[p], lo.slot_offsets[p + 1]
        toks = lo.pick_order[a:b] // 2
        want = layer.expert(int(placement.phy2log[0, p]), x[toks])
        np.testing.assert_allclose(y[a:b], want, atol=1e-12)
    with pytest.raises(InputError, match="w2 must be"):
        expert_compute(recv, lo, *ex.rank_weights()[:2], ex.rank_weights()[0])


def test_dispatch_layout_rejects_bad_input():
    topo = Topology(1, 2, 1)
    with pytest.raises(InputError, match="slot ids in 0..1"):
        dispatch_layout([[0, 2]], [0], topo)
    with pytest.raises(InputError, match="token_rank must be int"):
        dispatch_layout([[0, 1]], [0, 1], topo)
    with pytest.raises(InputError, match="slots must be int"):
        dispatch_layout([[0.0, 1.0]], [0], topo)


def test_empty_batch():
    topo = Topology(2, 2, 2)
    placement = random_placement(np.random.default_rng(0), topo, 6)
    layer = MoELayer(6, 4, 4, 2, dtype=np.float64)
    for policy in POLICIES:
        ex = ReferenceExecutor(layer, placement, policy)
        out, stats = ex.forward(np.zeros((0, 4)), np.zeros((0, 2), dtype=int), np.zeros((0, 2)),
                                np.zeros(0, dtype=int))
        assert out.shape == (0, 4)
        assert stats.gpu_tokens.tolist() == [0] * 4 and stats.recv_tokens.sum() == 0
        assert stats.nvlink_bytes == stats.rdma_bytes == 0
        assert np.isnan(stats.max_over_mean)


def test_ranks_receiving_nothing():
    # 2 nodes x 2 GPUs x 1 slot; every token picks experts 0 and 1, both on node 0
    topo = Topology(2, 2, 1)
    placement = Placement([[0, 1, 2, 3]], 4, topo)
    layer = MoELayer(4, 6, 5, 2, dtype=np.float64)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((10, 6))
    ids = np.tile([1, 0], (10, 1))
    w = rng.random((10, 2))
    rank = np.zeros(10, dtype=int)  # all from GPU 0
    out, stats = ReferenceExecutor(layer, placement).forward(x, ids, w, rank)
    np.testing.assert_allclose(out, layer.dense_forward(x, ids, w), atol=1e-12)
    assert stats.gpu_tokens.tolist() == [10, 10, 0, 0]
    assert stats.recv_tokens.tolist() == [10, 10, 0, 0]
    assert stats.rdma_bytes == 0 and stats.rdma_transfers == 0
    assert stats.nvlink_transfers == 10  # GPU 0 -> GPU 1, once per token


def test_forward_is_deterministic_and_default_ranks_even():
    topo = Topology(2, 2, 2)
    placement = random_placement(np.random.default_rng(2), topo, 5, weighted=True)
    layer = MoELayer(5, 4, 4, 2)
    x = np.random.default_rng(3).standard_normal((16, 4))
    ids, w = layer.route(x)
    a = ReferenceExecutor(layer, placement, "random", seed=7).forward(x, ids, w)
    b = ReferenceExecutor(layer, placement, "random", seed=7).forward(x, ids, w)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1].gpu_tokens, b[1].gpu_tokens)
    assert even_token_rank(16, 4).tolist() == [g for g in range(4) for _ in range(4)]
    assert np.bincount(even_token_rank(10, 4)).tolist() == [3, 2, 3, 2]


# ------------------------------------------------------------------ reusable buffers
@pytest.mark.parametrize("scipy_fast_path", [True, False])
@settings(max_examples=20, deadline=None)
@given(case=cases())
def test_combine_into_buffer_equals_plain_sparse_product(case, scipy_fast_path):
    """combine with a reused Buffer (scipy's kernel accumulating in place, or the public
    ``csr @ dense`` fallback) equals combine with fresh arrays, call after call."""
    placement, policy, seed, n, k = case
    topo = placement.topology
    rng = np.random.default_rng(seed)
    x, ids, w, rank = random_batch(rng, n, placement.num_experts, k, topo.num_gpus, 5)
    lo = dispatch_layout(route(ids, placement, policy=policy, token_rank=rank, seed=seed),
                         rank, topo)
    y = rng.standard_normal((n * k, 5))
    want = combine(y, w, lo)
    saved = kernels._csr_matvecs
    buf = Buffer()
    try:
        if not scipy_fast_path:
            kernels._csr_matvecs = None
        else:
            assert saved is not None, "scipy's csr_matvecs failed its self-check"
        for _ in range(2):  # the second call reuses (and must fully overwrite) the buffer
            np.testing.assert_allclose(combine(y, w, lo, buffer=buf), want, atol=1e-12)
    finally:
        kernels._csr_matvecs = saved
    ref = np.zeros((n, 5))
    np.add.at(ref, np.repeat(np.arange(n), k), w.reshape(-1, 1) * y[np.argsort(lo.pick_order)])
    np.testing.assert_allclose(want, ref, atol=1e-12)


def test_buffer_reuse_keeps_results_and_grows():
    topo = Topology(2, 2, 2)
    placement = random_placement(np.random.default_rng(5), topo, 6, layers=2)
    layer = MoELayer(6, 4, 5, 3, dtype=np.float64)
    ex = ReferenceExecutor(layer, placement, "even")
    rng = np.random.default_rng(6)
    batches = [random_batch(rng, n, 6, 3, topo.num_gpus, 4) for n in (50, 7, 0, 90)]
    outs = [ex.forward(*b, layer_index=i % 2)[0] for i, b in enumerate(batches)]
    held = ex._buffer.nbytes
    for i, (b, out) in enumerate(zip(batches, outs, strict=True)):
        # earlier outputs are not overwritten by later calls, and equal a fresh executor's
        fresh = ReferenceExecutor(layer, placement, "even").forward(*b, layer_index=i % 2)[0]
        assert np.array_equal(out, fresh)
        np.testing.assert_allclose(out, layer.dense_forward(*b[:3]), atol=1e-9)
    assert held >= 90 * 3 * 4 * 8  # grown to the largest batch's receive rows, kept
    buf = Buffer()
    lo = dispatch_layout(route(batches[0][1], placement), batches[0][3], topo)
    recv, rdma = dispatch(batches[0][0], lo, buffer=buf)
    recv2, rdma2 = dispatch(batches[0][0], lo)
    assert np.array_equal(recv, recv2) and np.array_equal(rdma, rdma2)
    assert np.shares_memory(recv, buf.get("dispatch_recv", recv.shape, recv.dtype))


# --------------------------------------------------------------------------- rebalance
@settings(max_examples=40, deadline=None)
@given(cases(max_layers=2), st.integers(0, 2**32 - 1))
def test_rebalance_changes_no_output(case, seed2):
    placement, policy, seed, n, k = case
    topo = placement.topology
    rng = np.random.default_rng(seed2)
    new = random_placement(rng, topo, placement.num_experts, placement.num_layers,
                           weighted=bool(seed2 % 2))
    layer = MoELayer(placement.num_experts, 6, 5, k, dtype=np.float64, seed=seed % 100)
    x, ids, w, rank = random_batch(rng, n, placement.num_experts, k, topo.num_gpus, 6)
    ex = ReferenceExecutor(layer, placement, policy, seed=seed)
    ref = layer.dense_forward(x, ids, w)
    before, _ = ex.forward(x, ids, w, rank, layer_index=0)  # loads layer 0's weights only
    moved = ex.rebalance(new)
    report = ex.last_rebalance
    for li in range(new.num_layers):
        after, _ = ex.forward(x, ids, w, rank, layer_index=li)
        np.testing.assert_allclose(after, ref, rtol=1e-9, atol=1e-9)
        w1, w3, w2 = ex.rank_weights(li)
        # every rank now holds exact copies of the experts of its new slots
        assert np.array_equal(w1.reshape(-1, 6, 5), layer.w1[new.phy2log[li]])
        assert np.array_equal(w2.reshape(-1, 5, 6), layer.w2[new.phy2log[li]])
    np.testing.assert_allclose(before, ref, rtol=1e-9, atol=1e-9)
    # byte account: every changed slot once, at the tier of its nearest old holder
    eb = layer.expert_bytes
    changed = (placement.phy2log != new.phy2log).sum(1)
    assert report.slots_changed.tolist() == changed.tolist()
    total = report.local_bytes + report.nvlink_bytes + report.rdma_bytes
    assert np.array_equal(total, changed * eb)
    assert moved == report.bytes_moved == int((report.nvlink_bytes + report.rdma_bytes).sum())


@settings(max_examples=40, deadline=None)
@given(cases(), st.integers(0, 2**32 - 1))
def test_weight_moves_pick_nearest_holder(case, seed2):
    placement, *_ = case
    topo = placement.topology
    S, gpn = topo.slots_per_gpu, topo.gpus_per_node
    old = placement.phy2log[0]
    new = random_placement(np.random.default_rng(seed2), topo, placement.num_experts).phy2log[0]
    moves = weight_moves(old, new, topo)
    assert moves[:, 0].tolist() == np.flatnonzero(old != new).tolist()
    for dst, src, link in moves:
        holders = np.flatnonzero(old == new[dst])
        assert old[src] == new[dst]
        same_gpu = holders[holders // S == dst // S]
        same_node = holders[holders // S // gpn == dst // S // gpn]
        if same_gpu.size:
            assert link == LINK_LOCAL and src == same_gpu.min()
        elif same_node.size:
            assert link == LINK_NVLINK and src == same_node.min()
        else:
            assert link == LINK_RDMA and src == holders.min()


def test_rebalance_hand_checked():
    topo = Topology(2, 2, 2)  # GPU g holds slots 2g, 2g+1; node 0 = GPUs 0, 1
    layer = MoELayer(8, 4, 4, 2)
    eb = layer.expert_bytes
    old = Placement([np.arange(8)], 8, topo)
    ex = ReferenceExecutor(layer, old)
    ex.rank_weights()  # load
    # swap inside GPU 0: local copies only, nothing crosses ranks
    assert ex.rebalance(Placement([[1, 0, 2, 3, 4, 5, 6, 7]], 8, topo)) == 0
    assert ex.last_rebalance.local_bytes.tolist() == [2 * eb]
    # swap GPU 0 slot 0 with GPU 1 slot 2 (same node): 2 NVLink copies
    assert ex.rebalance(Placement([[2, 0, 1, 3, 4, 5, 6, 7]], 8, topo)) == 2 * eb
    assert ex.last_rebalance.nvlink_bytes.tolist() == [2 * eb]
    # swap expert 2 (slot 0, node 0) with expert 4 (slot 4, node 1): 2 RDMA copies
    assert ex.rebalance(Placement([[4, 0, 1, 3, 2, 5, 6, 7]], 8, topo)) == 2 * eb
    assert ex.last_rebalance.rdma_bytes.tolist() == [2 * eb]
    assert np.array_equal(ex.rank_weights()[0].reshape(8, 4, 4), layer.w1[[4, 0, 1, 3, 2, 5, 6, 7]])
    with pytest.raises(InputError, match="topology"):
        ex.rebalance(Placement([np.arange(16) % 8], 8, Topology(2, 2, 4)))
    with pytest.raises(InputError, match="2 layers"):
        ex.rebalance(Placement([np.arange(8)] * 2, 8, topo))


@pytest.mark.parametrize("scipy_fast_path", [True, False])
@pytest.mark.parametrize("weighted", [True, False])
def test_reduction_plan_equals_the_sparse_product(scipy_fast_path, weighted):
    """combine's row reductions (first nonzero gathered, the rest accumulated) equal ``A @ x``
    with and without empty rows: bit-equal with scipy's kernel (same summation order), within
    float32 rounding on the public fallback (which sums a row's tail before adding it)."""
    import scipy.sparse as sp

    rng = np.random.default_rng(3)
    for empty_rows in (False, True):
        m, n = 40, 30
        nnz_per_row = rng.integers(0 if empty_rows else 1, 4, m)
        rows = np.repeat(np.arange(m), nnz_per_row)
        cols = np.concatenate([rng.choice(n, k, replace=False) for k in nnz_per_row])
        vals = rng.random(rows.size).astype(np.float32) if weighted else \
            np.ones(rows.size, np.float32)
        a = sp.csr_matrix((vals, (rows, cols)), shape=(m, n))
        a.sort_indices()
        x = rng.standard_normal((n, 7)).astype(np.float32)
        plan = kernels._Plan.of(a.indptr.astype(np.int64), a.indices.astype(np.int64), a.shape)
        assert plan.dense == (not empty_rows or bool((nnz_per_row > 0).all()))
        saved = kernels._csr_matvecs
        try:
            if not scipy_fast_path:
                kernels._csr_matvecs = None
            out = np.full((m, 7), np.nan, np.float32)
            plan.into(x, out, a.data if weighted else None)
        finally:
            kernels._csr_matvecs = saved
        if scipy_fast_path:
            np.testing.assert_array_equal(out, a @ x)
        else:
            np.testing.assert_allclose(out, a @ x, rtol=1e-5, atol=1e-6)
