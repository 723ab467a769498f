"""One `Dispatch` per policy (`eplb.dispatch`): the registry, one policy object serving the
executor, the traffic model and the step-time model alike, its expected shares agreeing with
its token split, and its critical-path cost and memory."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from eplb import InputError, Topology
from eplb.dispatch import (
    DISPATCH,
    POLICIES,
    SHARED_EXPERT,
    Even,
    check_policy,
    get,
    route,
)
from eplb.dispatch.expect import group_probs
from eplb.evaluation import traffic
from eplb.evaluation.serving import RankBatch, StepModel
from eplb.evaluation.serving.config import DuplicateConfig
from eplb.evaluation.serving.config.dispatch import unit_dispatch
from eplb.evaluation.serving.config.model import deepseek_v3
from eplb.executor import MoELayer, ReferenceExecutor
from tests.test_executor import random_placement


def test_the_registries_hold_one_policy_each_in_the_docs_order():
    assert DISPATCH.names() == ["even", "random", "local_first", "weighted", "lp", "duplicate"]
    assert POLICIES == ("even", "random", "local_first", "weighted", "lp")
    assert SHARED_EXPERT.names() == ["local", "waterfill"]
    assert all(DISPATCH[n].name == n for n in DISPATCH)
    assert [n for n in DISPATCH if not DISPATCH[n].alike] == ["local_first"]
    assert [n for n in DISPATCH if DISPATCH[n].per_batch] == ["lp"]
    assert [n for n in DISPATCH if DISPATCH[n].copies] == ["duplicate"]
    assert [n for n in SHARED_EXPERT if SHARED_EXPERT[n].pooled] == ["waterfill"]
    # the executor and the traffic model run per-pick rules only
    assert check_policy("lp") is DISPATCH["lp"]
    with pytest.raises(InputError, match="splits each micro-batch.*even, local_first, lp"):
        check_policy("duplicate")
    with pytest.raises(InputError, match="unknown dispatch policy 'nope'; available: even,"):
        check_policy("nope")
    with pytest.raises(InputError, match="unknown dispatch policy"):
        get("nope")


@dataclass(frozen=True)
class _Spy(Even):
    """``even`` under another name, counting what each consumer asks of it."""

    name = "spy"
    calls: dict = field(default_factory=lambda: {"route": 0, "expected_visits": 0, "routing": 0},
                        compare=False)

    def route(self, ids, placement, layer, rank, seed):
        self.calls["route"] += 1
        return super().route(ids, placement, layer, rank, seed)

    def expected_visits(self, placement, src, r, q, gid, tick=None):
        self.calls["expected_visits"] += 1
        return super().expected_visits(placement, src, r, q, gid, tick)

    def routing(self, placement, num_groups, topk_groups, load=None):
        self.calls["routing"] += 1
        return super().routing(placement, num_groups, topk_groups, load)


@pytest.fixture
def spy():
    """A spy policy registered for one test, then removed (the registries' leak guard in
    conftest checks that)."""
    policy = _Spy()
    DISPATCH.add(policy.name, policy)
    yield policy
    DISPATCH.remove(policy.name)


def test_one_registered_policy_serves_executor_traffic_and_step_time(spy):
    rng = np.random.default_rng(0)
    topo = Topology(2, 2, 3)
    E, L, K, N = 8, 2, 2, 64
    p = random_placement(rng, topo, E, layers=L)
    ids = np.argsort(rng.random((N, L, E)), axis=2)[..., :K]
    rank = rng.integers(0, topo.num_gpus, N)
    # the executor: the spy's token split, the same slots as even's
    layer = MoELayer(E, 8, 4, K, seed=0, dtype=np.float64)
    ex = ReferenceExecutor(layer, p, policy="spy")
    x = rng.standard_normal((N, 8))
    out, stats = ex.forward(x, ids[:, 0], np.full((N, K), 0.5), token_rank=rank)
    even = ReferenceExecutor(layer, p, policy="even").forward(
        x, ids[:, 0], np.full((N, K), 0.5), token_rank=rank)
    assert spy.calls["route"] == 1
    assert np.array_equal(out, even[0]) and np.array_equal(stats.gpu_tokens, even[1].gpu_tokens)
    # the traffic model: token mode routes by it, counts mode takes its expected split
    tok = traffic.simulate(p, topk_ids=ids, token_rank=rank, policy="spy")
    assert spy.calls["route"] == 1 + L
    load = rng.random((L, E)) + 0.1
    counts = traffic.simulate(p, load=load, policy="spy", top_k=K)
    assert spy.calls["expected_visits"] == 1
    for rep, ref in ((tok, traffic.simulate(p, topk_ids=ids, token_rank=rank)),
                     (counts, traffic.simulate(p, load=load, top_k=K))):
        assert np.array_equal(rep.gpu_tokens, ref.gpu_tokens)
        assert np.array_equal(rep.rdma_bytes, ref.rdma_bytes)
    # the step-time model: its fast path asks the same object for its routing tables
    model = deepseek_v3
    t8 = Topology(1, 8, 32)
    trivial = random_placement(rng, t8, model.num_experts, layers=model.moe_layers)
    batch = RankBatch.uniform("decode", 8, tokens=16, context=512)
    step_load = rng.random((model.moe_layers, model.num_experts))
    step = StepModel("decode", t8, dispatch="spy").time(batch, trivial, step_load)
    assert spy.calls["routing"] >= 1
    even_step = StepModel("decode", t8, dispatch="even").time(batch, trivial, step_load)
    assert step.total_s == even_step.total_s


@pytest.mark.parametrize("name", ["even", "random", "weighted", "local_first", "lp"])
def test_expected_shares_agree_with_the_expected_visits_and_conserve_picks(name):
    rng = np.random.default_rng(1)
    topo = Topology(2, 3, 2)
    E, L, K = 9, 3, 3
    p = random_placement(rng, topo, E, layers=L, weighted=True)
    policy = get(name)
    src = rng.random((L, topo.num_gpus, E)) * 10  # picks per (layer, source GPU, expert)
    slot = policy.slot_picks(p, src, num_groups=1, topk_groups=1)  # [L, P]
    assert np.allclose(slot.sum(1), src.sum((1, 2)))  # every pick lands on a slot
    assert (slot[p.phy2log < 0] == 0).all()
    p_incl = np.minimum(src / (src.sum(-1, keepdims=True) / K), 1.0)
    gid, q, r = group_probs(p_incl, K, None)
    gpu_tokens, miss_g, miss_n = policy.expected_visits(p, src, r, q, gid)
    assert miss_g.shape == (L, topo.num_gpus, topo.num_gpus)
    assert miss_n.shape == (L, topo.num_gpus, topo.num_nodes)
    assert (miss_g <= 0).all() and (miss_n <= 0).all()  # log probabilities
    per_gpu = slot.reshape(L, topo.num_gpus, -1).sum(-1)
    if name == "lp":  # split as one batch per source or alike: the same busiest GPU
        assert np.allclose(per_gpu.max(1), gpu_tokens.max(1))
    else:
        assert np.allclose(per_gpu, gpu_tokens)
    if policy.alike:  # sources alike: slot picks = each expert's picks x the slot's share
        alike = np.broadcast_to(src.sum(1, keepdims=True) / topo.num_gpus, src.shape)
        want = (np.take_along_axis(alike.sum(1), np.maximum(p.phy2log, 0), 1)
                * policy.shares(p, alike.sum(1)))
        got = policy.slot_picks(p, alike, num_groups=1, topk_groups=1)
        assert np.allclose(got, want)


@pytest.mark.parametrize("name", ["random", "weighted", "local_first"])
def test_token_split_follows_the_expected_shares(name):
    """The picks `route` sends to each slot average to `slot_picks` (exactly for the fixed
    ``local_first`` table; within sampling noise for the random draws)."""
    rng = np.random.default_rng(2)
    topo = Topology(2, 2, 3)
    E, N, K = 7, 40_000, 2
    p = random_placement(rng, topo, E, layers=1, weighted=True)
    ids = np.argsort(rng.random((N, E)), axis=1)[:, :K]
    rank = rng.integers(0, topo.num_gpus, N)
    slots = route(ids, p, policy=name, token_rank=rank, seed=3)
    seen = np.bincount(slots.ravel(), minlength=topo.num_slots)
    src = np.zeros((1, topo.num_gpus, E))
    np.add.at(src[0], (np.repeat(rank, K), ids.ravel()), 1.0)
    want = get(name).slot_picks(p, src, num_groups=1, topk_groups=1)[0]
    if name == "local_first":
        assert np.array_equal(seen, want)
    else:
        assert np.abs(seen - want).max() <= 5 * np.sqrt(want.max()) + 1


def test_critical_path_cost_and_memory():
    L, mb, layer_s = 58, 2, np.full(58, 1e-3)
    for name in ("even", "random", "local_first", "weighted"):
        policy = get(name).configure(solve_s=1e-4, hbm_gb=0.5)  # not theirs: ignored
        assert policy is get(name)
        assert policy.exposed(L, mb, layer_s) is None and policy.reserved_bytes() == 0.0
    lp = get("lp").configure(solve_s=1e-4, experts=3)
    assert lp == type(lp)(solve_s=1e-4) and lp is not get("lp")
    extra, meta = lp.exposed(L, mb, layer_s)
    assert extra == 1e-4 * L * mb and meta == {"lp_s": extra}
    assert get("lp").exposed(L, mb, layer_s) is None  # no solve time: nothing added
    dup = get("duplicate").configure(planner_s=2e-5, hbm_gb=0.5, prefetch=False)
    copy_s = np.full(L, 3e-5)
    extra, meta = dup.exposed(L, mb, layer_s, copy_s)
    assert extra == pytest.approx(mb * L * 5e-5) and meta["duplicate_copy_s"] == pytest.approx(
        mb * L * 3e-5)
    hidden = dup.configure(prefetch=True).exposed(L, mb, layer_s, copy_s)
    assert hidden[0] == 0.0  # prefetched under a 1 ms layer: nothing exposed
    assert dup.reserved_bytes() == 0.5e9
    with pytest.raises(InputError, match="unknown dispatch setting"):
        get("lp").configure(solve_seconds=1.0)
    # a unit's configured policy carries the config's settings
    t8 = Topology(1, 8, 32)
    unit = unit_dispatch("duplicate", t8, deepseek_v3, duplicate=DuplicateConfig(experts=4))
    assert (unit.experts, unit.hbm_gb, unit.prefetch) == (4, 0.5, False)
    assert unit.cap == DuplicateConfig().copies_per_gpu(float(deepseek_v3.expert_params))
    assert unit_dispatch("lp", t8, deepseek_v3, lp_overhead_s=3e-5).solve_s == 3e-5
