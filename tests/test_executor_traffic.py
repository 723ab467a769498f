"""Executor traffic stats: hand-checked tiny cases, the brief's contract written out token by
token, and the cross-check against `evaluation.traffic.simulate` (same tokens, layer, policy)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

from eplb import Placement, Topology
from eplb.executor import POLICIES, MoELayer, ReferenceExecutor, dispatch_layout, route
from eplb.executor.kernels import HOP_LOCAL, HOP_NVLINK, HOP_RDMA, HOP_RDMA_NVLINK
from tests.test_executor import cases, random_batch, random_placement

# 2 nodes x 2 GPUs x 2 slots, expert e on slot e (GPU e // 2); node 0 = GPUs 0, 1.
TOPO = Topology(2, 2, 2)
PLACEMENT = Placement([np.arange(8)], 8, TOPO)
# token: (source GPU, experts)             transfers (dispatch; combine reverses them)
HAND = [
    (0, [4, 6]),  # A: RDMA 0->2 (rail peer), NVLink 2->3 forward: one RDMA for two GPUs
    (1, [4, 6]),  # B: RDMA 1->3 (rail peer), NVLink 3->2 forward
    (0, [0, 2]),  # C: GPU 0 local, NVLink 0->1
    (3, [0, 2]),  # D: RDMA 3->1 (rail peer), NVLink 1->0 forward
    (2, [4, 0]),  # E: GPU 2 local, RDMA 2->0 (rail peer is the destination)
    (0, [4, 5]),  # F: two picks on GPU 2: one RDMA 0->2
]


def _hand():
    rank = np.array([s for s, _ in HAND])
    ids = np.array([e for _, e in HAND])
    return ids, rank


@pytest.mark.parametrize("policy", POLICIES)
def test_hand_checked_traffic(policy):
    ids, rank = _hand()
    layer = MoELayer(8, 10, 4, 2, dtype=np.float64)
    ex = ReferenceExecutor(layer, PLACEMENT, policy, dispatch_bytes=1, combine_bytes=2)
    x = np.random.default_rng(0).standard_normal((6, 10))
    w = np.random.default_rng(1).random((6, 2))
    out, st = ex.forward(x, ids, w, rank)
    np.testing.assert_allclose(out, layer.dense_forward(x, ids, w), atol=1e-12)
    assert st.gpu_tokens.tolist() == [3, 2, 5, 2]  # picks: C D E | C D | A B E F F | A B
    assert st.recv_tokens.tolist() == [3, 2, 4, 2]  # distinct tokens: F counts once on GPU 2
    assert (st.nvlink_transfers, st.rdma_transfers) == (4, 5)
    # 10 elements x (1 byte dispatch + 2 bytes combine) per transfer
    assert (st.nvlink_bytes, st.rdma_bytes) == (4 * 30, 5 * 30)
    assert (st.dispatch_nvlink_bytes, st.combine_nvlink_bytes) == (40, 80)
    assert (st.dispatch_rdma_bytes, st.combine_rdma_bytes) == (50, 100)
    assert st.nvlink_out.tolist() == [10, 10, 10, 10]  # C: 0; D: 1 fwd; A: 2 fwd; B: 3 fwd
    assert st.nvlink_in.tolist() == [10, 10, 10, 10]  # D->0, C->1, B->2, A->3
    assert st.rdma_out.tolist() == [20, 10, 10, 10]  # A, F from 0; B from 1; E from 2; D from 3
    assert st.rdma_in.tolist() == [10, 10, 20, 10]  # E at 0; D at 1; A, F at 2; B at 3


def test_hand_checked_layout():
    ids, rank = _hand()
    lo = dispatch_layout(route(ids, PLACEMENT), rank, TOPO)
    # receive buffers, destination-major: GPU 0 <- C D E, GPU 1 <- C D, GPU 2 <- A B E F, 3 <- A B
    assert lo.recv_token.tolist() == [2, 3, 4, 2, 3, 0, 1, 4, 5, 0, 1]
    assert lo.rank_offsets.tolist() == [0, 3, 5, 9, 11]
    L, N, R, F = HOP_LOCAL, HOP_NVLINK, HOP_RDMA, HOP_RDMA_NVLINK
    assert lo.recv_hop.tolist() == [L, F, R, N, R, R, F, L, R, F, R]
    # RDMA rows, node-major: node 0 <- D (at GPU 1), E (at GPU 0); node 1 <- A (2), B (3), F (2)
    assert lo.rdma_token.tolist() == [3, 4, 0, 1, 5]
    assert lo.rdma_gpu.tolist() == [1, 0, 2, 3, 2]
    assert lo.node_offsets.tolist() == [0, 2, 5]
    assert lo.num_tokens_per_node.tolist() == [3, 4]  # C D E on node 0; A B E F on node 1
    assert lo.is_token_in_rank[5].tolist() == [False, False, True, False]
    assert lo.pick_row[5].tolist() == [8, 8]  # both of F's picks read the same receive row


def contract_traffic(slots, rank, topo: Topology, hidden, dispatch_bytes, combine_bytes):
    """The brief's "Traffic accounting" contract, token by token with Python sets."""
    S, gpn = topo.slots_per_gpu, topo.gpus_per_node
    gpu_tokens = [0] * topo.num_gpus
    nvlink = rdma = 0
    for n in range(slots.shape[0]):
        s = int(rank[n])
        dests = {int(p) // S for p in slots[n]}
        for p in slots[n]:
            gpu_tokens[int(p) // S] += 1
        for g in dests - {s}:
            if g // gpn == s // gpn:
                nvlink += 1
        for b in {g // gpn for g in dests} - {s // gpn}:
            rdma += 1
            peer = b * gpn + s % gpn
            nvlink += len({g for g in dests if g // gpn == b} - {peer})
    per = hidden * (dispatch_bytes + combine_bytes)
    return gpu_tokens, nvlink * per, rdma * per


@settings(max_examples=100, deadline=None)
@given(cases(max_tokens=30))
def test_stats_follow_the_contract(case):
    placement, policy, seed, n, k = case
    topo = placement.topology
    rng = np.random.default_rng(seed)
    x, ids, w, rank = random_batch(rng, n, placement.num_experts, k, topo.num_gpus, 3)
    layer = MoELayer(placement.num_experts, 3, 2, k, dtype=np.float64)
    ex = ReferenceExecutor(layer, placement, policy, seed=seed, dispatch_bytes=1.5,
                           combine_bytes=2)
    _, st = ex.forward(x, ids, w, rank)
    slots = route(ids, placement, policy=policy, token_rank=rank, seed=seed)
    gpu_tokens, nv, rd = contract_traffic(slots, rank, topo, 3, 1.5, 2)
    assert st.gpu_tokens.tolist() == gpu_tokens
    assert (st.nvlink_bytes, st.rdma_bytes) == (nv, rd)
    assert st.nvlink_out.sum() == st.nvlink_in.sum() == st.dispatch_nvlink_bytes
    assert st.rdma_out.sum() == st.rdma_in.sum() == st.dispatch_rdma_bytes


@settings(max_examples=100, deadline=None)
@given(cases(max_layers=3))
def test_stats_equal_evaluation_traffic(case):
    """Cross-check: executor stats == `evaluation.traffic.simulate` for every layer."""
    from eplb.evaluation.traffic import simulate  # the evaluation package, built independently

    placement, policy, seed, n, k = case
    topo = placement.topology
    L, E = placement.num_layers, placement.num_experts
    rng = np.random.default_rng(seed)
    topk = np.stack([np.argsort(rng.random((n, E)), axis=1)[:, :k] for _ in range(L)], axis=1)
    rank = rng.integers(0, topo.num_gpus, n)
    hidden = 16
    report = simulate(placement, topk_ids=topk, token_rank=rank, policy=policy, hidden=hidden,
                      dispatch_bytes=1, combine_bytes=2, seed=seed)
    layer = MoELayer(E, hidden, 4, k, dtype=np.float64, seed=seed % 97)
    ex = ReferenceExecutor(layer, placement, policy, seed=seed, dispatch_bytes=1, combine_bytes=2)
    x = rng.standard_normal((n, hidden))
    w = rng.random((n, k))
    for li in range(L):
        out, st = ex.forward(x, topk[:, li], w, rank, layer_index=li)
        np.testing.assert_allclose(out, layer.dense_forward(x, topk[:, li], w), atol=1e-9)
        assert np.array_equal(st.gpu_tokens, report.gpu_tokens[li])
        assert st.nvlink_bytes == report.nvlink_bytes[li]
        assert st.rdma_bytes == report.rdma_bytes[li]
        assert (st.nvlink_transfers, st.rdma_transfers) == (
            report.nvlink_transfers[li], report.rdma_transfers[li])
        for name in ("nvlink_out", "nvlink_in", "rdma_out", "rdma_in"):
            assert np.array_equal(getattr(st, name), getattr(report, name)[li]), name


def test_cross_check_realistic_size():
    """One larger case: 4 x 8 GPUs, 288 slots, 256 experts, top-8, 2,000 tokens, two layers."""
    from eplb.evaluation.traffic import simulate

    topo = Topology(4, 8, 9)
    rng = np.random.default_rng(11)
    placement = random_placement(rng, topo, 256, layers=2)
    n, k = 2000, 8
    topk = np.stack([np.argsort(rng.random((n, 256)), axis=1)[:, :k] for _ in range(2)], axis=1)
    rank = rng.integers(0, 32, n)
    layer = MoELayer(256, 8, 2, k, dtype=np.float64)
    x, w = rng.standard_normal((n, 8)), rng.random((n, k))
    for policy in POLICIES:
        report = simulate(placement, topk_ids=topk, token_rank=rank, policy=policy, hidden=8,
                          seed=3)
        ex = ReferenceExecutor(layer, placement, policy, seed=3)  # defaults 1 and 2 bytes too
        for li in range(2):
            _, st = ex.forward(x, topk[:, li], w, rank, layer_index=li)
            assert np.array_equal(st.gpu_tokens, report.gpu_tokens[li])
            assert (st.nvlink_bytes, st.rdma_bytes) == (
                report.nvlink_bytes[li], report.rdma_bytes[li])
            assert st.rdma_bytes > 0 and st.nvlink_bytes > 0
