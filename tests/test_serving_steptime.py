"""Step-time model: breakdown sums to the total, determinism, monotonicity, DP/EP attribution,
agreement with the traffic model and with the DeepEP tables it was built from, bad input."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from eplb.errors import InputError
from eplb.evaluation.serving import RankBatch, StepModel, step_time
from eplb.evaluation.serving.config import hardware as hw
from eplb.evaluation.serving.config.hardware import COMBINE_BYTES, DISPATCH_BYTES
from eplb.evaluation.serving.config.model import deepseek_v3
from eplb.evaluation.serving.steptime import BREAKDOWN
from eplb.evaluation.traffic import expected_copies, simulate
from eplb.placement import Placement
from eplb.topology import Topology

L, E = deepseek_v3.moe_layers, deepseek_v3.num_experts
REL = 1e-9  # relative tolerance of float identities (sums, equal paths)


def random_placement(topo: Topology, rng: np.random.Generator) -> Placement:
    """Every expert once plus random redundant replicas, shuffled per layer."""
    extra = topo.num_slots - E
    rows = [
        rng.permutation(np.concatenate([np.arange(E), rng.integers(0, E, extra)])) for _ in range(L)
    ]
    return Placement(np.array(rows), E, topo).validate()


def skewed_load(rng: np.random.Generator, shape=(L, E)) -> np.ndarray:
    return rng.gamma(0.3, 1.0, shape) + 1e-3


def random_batch(phase: str, G: int, rng: np.random.Generator, skew: float) -> RankBatch:
    if phase == "prefill":
        n = rng.integers(1, 6, G * 2)
        new = rng.integers(1, 8192, n.size).astype(float)
        cached = rng.integers(0, 4096, n.size).astype(float) * (rng.random(n.size) < 0.5)
        rank = np.arange(n.size) % G
        new *= 1 + skew * (rank == 0)
        return RankBatch.prefill(new, cached, rank, num_ranks=G)
    reqs = rng.integers(1, 96, G)
    rank = np.repeat(np.arange(G), reqs * (1 + int(skew) * (np.arange(G) == 0)))
    kv = rng.integers(1, 8192, rank.size).astype(float)
    return RankBatch.decode(kv, rank, num_ranks=G, query_tokens=int(rng.integers(1, 3)))


SMALL = Topology(2, 4, 33)  # 8 GPUs, 264 slots


def check_breakdown(res, total=None) -> None:
    parts = res.breakdown
    assert tuple(parts) == BREAKDOWN
    assert sum(parts.values()) == pytest.approx(res.total_s, rel=REL)
    for key, value in parts.items():
        assert value >= -REL * res.total_s, (key, value)
    assert np.isfinite(res.total_s) and res.total_s > 0


# ------------------------------------------------------------------------ properties
@given(
    phase=st.sampled_from(["prefill", "decode"]),
    mb=st.sampled_from([1, 2]),
    policy=st.sampled_from(["even", "random", "weighted"]),
    placed=st.booleans(),
    skew=st.sampled_from([0.0, 3.0]),
    seed=st.integers(0, 2**16),
)
def test_breakdown_sums_to_total(phase, mb, policy, placed, skew, seed):
    rng = np.random.default_rng(seed)
    topo = SMALL if rng.random() < 0.5 else Topology(4, 8, 9)
    placement = random_placement(topo, rng) if placed else None
    load = skewed_load(rng) if placed else None
    sm = StepModel(phase, topo, dispatch=policy, micro_batches=mb)
    res = sm.time(random_batch(phase, topo.num_gpus, rng, skew), placement, load)
    check_breakdown(res)
    assert res.layer_s.shape == (L,)
    if not placed:
        assert res.breakdown["ep_wait"] == pytest.approx(0.0, abs=REL * res.total_s)
    if skew == 0.0 and phase == "decode":
        pass  # decode batches still differ per rank by construction


@given(
    phase=st.sampled_from(["prefill", "decode"]),
    seed=st.integers(0, 2**16),
    grow=st.sampled_from(["tokens", "context"]),
    factor=st.floats(1.0, 4.0),
)
def test_monotone_in_batch_and_context(phase, seed, grow, factor):
    rng = np.random.default_rng(seed)
    topo = Topology(4, 8, 9)
    placement = random_placement(topo, rng) if rng.random() < 0.5 else None
    load = skewed_load(rng) if placement is not None else None
    tokens = float(rng.integers(1, 20000 if phase == "prefill" else 300))
    context = float(rng.integers(1, 8192))
    base = RankBatch.uniform(phase, 32, tokens=tokens, context=context)
    bigger = RankBatch.uniform(
        phase,
        32,
        tokens=tokens * (factor if grow == "tokens" else 1),
        context=context * (factor if grow == "context" else 1),
    )
    sm = StepModel(phase, topo)
    t0 = sm.time(base, placement, load).total_s
    t1 = sm.time(bigger, placement, load).total_s
    assert t1 >= t0 * (1 - REL)


def test_deterministic_and_cached_paths_agree():
    rng = np.random.default_rng(7)
    topo = Topology(4, 8, 9)
    placement, load = random_placement(topo, rng), skewed_load(rng)
    batch = random_batch("prefill", 32, rng, 2.0)
    a = StepModel("prefill", topo).time(batch, placement, load)
    b = StepModel("prefill", topo).time(batch, placement, load)
    c = step_time("prefill", batch, placement, load)
    for x in (b, c):
        assert x.total_s == a.total_s and x.breakdown == a.breakdown
        assert np.array_equal(x.layer_s, a.layer_s)


# -------------------------------------------------------------- attribution DP vs EP
def test_dp_imbalance_is_dp_wait_and_ep_imbalance_is_ep_wait():
    rng = np.random.default_rng(3)
    topo = Topology(4, 8, 9)
    for phase in ("prefill", "decode"):
        sm = StepModel(phase, topo)
        uniform = RankBatch.uniform(
            phase, 32, tokens=16384 if phase == "prefill" else 128, context=4096
        )
        skewed = RankBatch(
            uniform.tokens * np.r_[3.0, np.ones(31)],
            uniform.attention * np.r_[3.0, np.ones(31)],
            uniform.kv_tokens * np.r_[3.0, np.ones(31)],
            uniform.logits,
        )
        dp = sm.time(skewed)  # balanced routing, uneven ranks
        assert dp.breakdown["dp_wait"] > 0.05 * dp.total_s
        assert dp.breakdown["ep_wait"] == pytest.approx(0.0, abs=REL * dp.total_s)
        ep = sm.time(uniform, random_placement(topo, rng), skewed_load(rng))
        assert ep.breakdown["ep_wait"] > 0.01 * ep.total_s
        assert ep.breakdown["dp_wait"] == pytest.approx(0.0, abs=REL * ep.total_s)
        check_breakdown(dp)
        check_breakdown(ep)


def test_balanced_routing_equals_an_ideal_placement():
    """placement=None is the analytic twin of a contiguous one-replica placement under a
    uniform load (8 experts per GPU inside one expert group, 2 groups per node)."""
    topo = Topology(4, 8, 8)
    ideal = Placement(np.tile(np.arange(E), (L, 1)), E, topo).validate()
    uniform = np.ones((L, E))
    for phase in ("prefill", "decode"):
        batch = RankBatch.uniform(
            phase, 32, tokens=8192 if phase == "prefill" else 64, context=2048
        )
        sm = StepModel(phase, topo)
        a, b = sm.time(batch), sm.time(batch, ideal, uniform)
        assert b.total_s == pytest.approx(a.total_s, rel=REL)
        for key in BREAKDOWN:
            assert b.breakdown[key] == pytest.approx(a.breakdown[key], rel=REL, abs=1e-15)


# ------------------------------------------------------- agreement with evaluation.traffic
@pytest.mark.parametrize("policy", ["even", "weighted"])
def test_counts_mode_bytes_match_traffic_model(policy):
    rng = np.random.default_rng(11)
    topo = Topology(4, 8, 9)
    placement, load = random_placement(topo, rng), skewed_load(rng)
    if policy == "weighted":
        share = rng.random(placement.phy2log.shape) + 0.1
        sums = np.zeros((L, E))
        np.add.at(sums, (np.arange(L)[:, None], placement.phy2log), share)
        share /= np.take_along_axis(sums, placement.phy2log, 1)
        placement = Placement(placement.phy2log, E, topo, replica_share=share).validate()
    sm = StepModel("prefill", topo, dispatch=policy)
    src = rng.integers(100, 9000, 32).astype(float)
    slot, recv, v, vn, _ = sm.routing.routed(placement, load, src)
    mine = dict(
        zip(
            ("nvlink_out", "nvlink_in", "rdma_out", "rdma_in"),
            expected_copies(src, v, vn, topo),
            strict=True,
        )
    )
    dist = load / load.sum(1, keepdims=True)
    ref = simulate(
        placement,
        source_counts=dist[:, None, :] * (8 * src)[None, :, None],
        policy=policy,
        hidden=7168,
        dispatch_bytes=DISPATCH_BYTES,
        combine_bytes=COMBINE_BYTES,
        top_k=8,
        num_groups=8,
        topk_groups=4,
        keep_slots=False,
    )
    np.testing.assert_allclose(recv, ref.gpu_tokens, rtol=1e-9)
    np.testing.assert_allclose(slot.reshape(L, 32, 9).sum(-1), ref.gpu_tokens, rtol=1e-9)
    per = 7168 * DISPATCH_BYTES
    for key, arr in mine.items():
        np.testing.assert_allclose(arr * per, getattr(ref, key), rtol=1e-9, atol=1e-6)


def test_per_source_load_path_equals_fast_path():
    """A per-source load whose rows are all alike goes through `evaluation.traffic` (slow
    path) and must give the same step as the counts-mode fast path."""
    rng = np.random.default_rng(5)
    placement, load = random_placement(SMALL, rng), skewed_load(rng)
    batch = random_batch("prefill", 8, rng, 1.0)
    sm = StepModel("prefill", SMALL)
    fast = sm.time(batch, placement, load)
    slow = sm.time(batch, placement, np.repeat(load[:, None, :], 8, axis=1))
    assert slow.total_s == pytest.approx(fast.total_s, rel=1e-9)
    for key in BREAKDOWN:
        assert slow.breakdown[key] == pytest.approx(fast.breakdown[key], rel=1e-9, abs=1e-15)
    lf = StepModel("prefill", SMALL, dispatch="local_first").time(batch, placement, load)
    check_breakdown(lf)


# --------------------------------------------------- the DeepEP tables it was built from
def _bench_model(nodes: int) -> object:
    """DeepSeek-V3 with DeepEP's benchmark routing: groups = nodes, top min(nodes, 4)."""
    groups = max(nodes, 1)
    return replace(deepseek_v3, num_groups=groups, topk_groups=min(groups, 4))


@pytest.mark.parametrize("nodes", [1, 2, 4, 8])
def test_normal_kernels_reproduce_aiconfigurator_h100_times(nodes):
    topo = Topology(nodes, 8, 256 // (8 * nodes) if nodes < 8 else 4)
    sm = StepModel("prefill", topo, model=_bench_model(nodes), hardware=hw.h100, micro_batches=1)
    links = sm.comm.links(
        np.full(topo.num_gpus, 4096.0),
        None,
        np.full((L, topo.num_gpus), sm.comm.v_bal),
        np.full((L, nodes), sm.comm.vn_bal),
    )
    d, c = sm.comm.seconds(links, np.max, np.max)
    want = hw.AIC_NORMAL_H100[nodes]
    np.testing.assert_allclose(d, want[0], rtol=1e-9)
    np.testing.assert_allclose(c, want[1], rtol=1e-9)


@pytest.mark.parametrize("ep", [16, 32, 64])
def test_normal_kernels_reproduce_deepep_h800_bandwidths(ep):
    """DeepEP's own accounting (every node a token touches, own node included) over the
    model's time gives back the published GB/s."""
    nodes = ep // 8
    topo = Topology(nodes, 8, 256 // ep)
    model = _bench_model(nodes)
    sm = StepModel("prefill", topo, model=model, hardware=hw.h800, micro_batches=1)
    links = sm.comm.links(
        np.full(ep, 4096.0),
        None,
        np.full((L, ep), sm.comm.v_bal),
        np.full((L, nodes), sm.comm.vn_bal),
    )
    d, c = sm.comm.seconds(links, np.max, np.max)
    touched = 4096 * nodes * sm.comm.vn_bal  # DeepEP's num_rdma_token_sent
    gbps = hw.DEEPEP_NORMAL_H800[ep]
    np.testing.assert_allclose(touched * 7168 * DISPATCH_BYTES / d / 1e9, gbps[0], rtol=1e-9)
    np.testing.assert_allclose(touched * 7168 * COMBINE_BYTES / c / 1e9, gbps[1], rtol=1e-9)


@pytest.mark.parametrize(
    "hardware,table,by_nodes",
    [(hw.h800, hw.DEEPEP_LL_H800, False), (hw.h100, hw.AIC_LL_H100, True)],
)
def test_low_latency_kernels_reproduce_their_tables(hardware, table, by_nodes):
    for key, (d_s, c_s) in table.items():
        ep = 8 * key if by_nodes else key
        topo = Topology(ep // 8, 8, max(1, -(-256 // ep)))
        sm = StepModel("decode", topo, hardware=hardware, micro_batches=1)
        recv = np.full((L, ep), 128.0 * 8)
        d, c = sm.comm.seconds(sm.comm.links(np.full(ep, 128.0), recv, None, None), np.max, np.max)
        np.testing.assert_allclose(d, d_s, rtol=1e-9)
        np.testing.assert_allclose(c, c_s, rtol=1e-9)


# --------------------------------------------------------------------------- bad input
def test_bad_input_gives_one_clear_error():
    topo = Topology(4, 8, 9)
    sm = StepModel("prefill", topo)
    batch = RankBatch.uniform("prefill", 32, tokens=1024, context=1024)
    rng = np.random.default_rng(0)
    cases = [
        (lambda: StepModel("train", topo), "phase"),
        (lambda: StepModel("prefill", topo, micro_batches=3), "micro_batches"),
        (lambda: StepModel("prefill", topo, dispatch="nearest"), "dispatch policy"),
        (lambda: sm.time(RankBatch.uniform("prefill", 16, tokens=1, context=1)), "32 GPUs"),
        (lambda: sm.time(batch, None, np.ones((L, E))), "load needs a placement"),
        (lambda: sm.time(batch, random_placement(SMALL, rng), np.ones((L, E))), "unit is"),
        (lambda: sm.time(batch, random_placement(topo, rng), np.ones((3, E))), "load must be"),
        (lambda: sm.time(batch, random_placement(topo, rng), -np.ones((L, E))), ">= 0"),
        (lambda: RankBatch.prefill([1, -2], num_ranks=2), "finite and >= 0"),
        (lambda: RankBatch.decode([5, 6], [0, 9], num_ranks=4), "DP ranks in 0..3"),
        (lambda: RankBatch.decode([5], num_ranks=1, query_tokens=0), "query_tokens"),
        (lambda: step_time("prefill", batch), "give config="),
    ]
    for call, msg in cases:
        with pytest.raises(InputError, match=msg):
            call()


def test_rank_batch_constructors_count_work():
    b = RankBatch.prefill([4, 2, 3], [0, 10, 0], [0, 0, 1], num_ranks=2)
    np.testing.assert_array_equal(b.tokens, [6, 3])
    # pairs: 4*5/2 = 10; 2*10 + 2*3/2 = 23; 3*4/2 = 6
    np.testing.assert_array_equal(b.attention, [33, 6])
    np.testing.assert_array_equal(b.logits, [2, 1])
    d = RankBatch.decode([100, 50, 10], [1, 1, 0], num_ranks=3, query_tokens=2)
    np.testing.assert_array_equal(d.tokens, [2, 4, 0])
    np.testing.assert_array_equal(d.kv_tokens, [10, 150, 0])
    np.testing.assert_array_equal(d.attention, [20, 300, 0])
    u = RankBatch.uniform("prefill", 4, tokens=4096, context=1024)
    # 4 prompts of 1024: 4 * 1024 * 1025 / 2 pairs
    assert u.attention[0] == 4 * 1024 * 1025 / 2 and u.logits[0] == 4
