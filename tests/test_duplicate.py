"""Per-micro-batch expert duplication (``dispatch="duplicate"``, `eplb.dispatch.duplicate`, after
UltraEP): the plan never puts two copies of an expert on one GPU, never exceeds the HBM budget,
conserves picks (per layer and per expert), keeps copies inside the node and never raises a
GPU's load above even split's; the step-time model with zero overheads never has a busier GPU
than even split; steady_state, the simulator, advise and TOML accept it; every bad option and
topology is refused with one clear error."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eplb.dispatch.duplicate import plan
from eplb.errors import InputError
from eplb.evaluation import serving
from eplb.evaluation.serving import RankBatch, StepModel
from eplb.evaluation.serving.advise import advise
from eplb.evaluation.serving.config import DuplicateConfig
from eplb.evaluation.serving.config.budget import with_duplicate_memory
from eplb.evaluation.serving.config.model import deepseek_v3
from eplb.evaluation.serving.simulator.planner import trivial_placement
from eplb.evaluation.serving.steptime.routing import per_gpu
from eplb.topology import Topology

FREE = DuplicateConfig(planner_s=0.0, overlap="previous_layer", hbm_gb=10.0)


@st.composite
def _cases(draw):
    N, Gn, S = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 3))
    L = draw(st.integers(1, 3))
    P = N * Gn * S
    E = draw(st.integers(max(1, P // 2), P))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    phy = np.stack([np.concatenate([rng.permutation(E), rng.integers(0, E, P - E)])[
        rng.permutation(P)] for _ in range(L)])
    slot = rng.gamma(draw(st.sampled_from([0.2, 1.0, 5.0])), size=(L, P)) * 100
    slot[rng.random((L, P)) < 0.2] = 0.0
    return slot, phy, Gn, S, draw(st.integers(0, 6)), draw(st.integers(0, 3))


@settings(max_examples=80, deadline=None)
@given(_cases())
def test_plan_is_feasible_conserves_and_never_raises_the_max(case):
    slot, phy, Gn, S, K, cap = case
    L, P = slot.shape
    G = P // S
    p = plan(slot, phy, Gn, S, K, cap)
    tol = 1e-9 * max(slot.sum(), 1.0)
    made = p.gpu >= 0
    # picks conserved per layer and per expert; none negative
    assert (p.slot >= -tol).all() and (p.picks >= 0).all()
    assert np.allclose(p.slot.sum(1) + (p.picks * made).sum((1, 2)), slot.sum(1), atol=tol)
    E = phy.max() + 1
    for layer in range(L):
        before = np.bincount(phy[layer], slot[layer], E)
        after = np.bincount(phy[layer], p.slot[layer], E)
        after += np.bincount(p.expert[layer][made[layer]], p.picks[layer][made[layer]], E)
        assert np.allclose(before, after, atol=tol)
    # never two copies of an expert on a GPU; never on a GPU the placement gives it
    held = phy.reshape(L, G, S)
    for layer, n, k in zip(*np.nonzero(made), strict=True):
        g, e = p.gpu[layer, n, k], p.expert[layer, n, k]
        assert e not in held[layer, g]
        assert g // Gn == p.source[layer, n, k] // Gn == n  # inside the node
        same = (p.gpu[layer] == g) & (p.expert[layer] == e)
        assert same.sum() == 1
    # the HBM budget: at most cap copies per GPU and layer, at most K per node
    assert (p.copies() <= cap).all()
    assert (made.sum(-1) <= K).all()
    # per-GPU picks follow, and the busiest GPU never gets busier than even split's
    recv = per_gpu(p.slot, S)
    np.add.at(recv, (np.nonzero(made)[0], p.gpu[made]), p.picks[made])
    assert np.allclose(recv, p.recv, atol=tol)
    even = per_gpu(slot, S)
    assert (p.recv.max(1) <= even.max(1) + tol).all()
    if cap == 0 or K == 0 or Gn == 1:
        assert not made.any() and np.array_equal(p.slot, slot)


def test_plan_copies_a_hot_expert_and_levels_the_pair():
    # one node of 2 GPUs, 2 slots each: expert 0 carries 100 picks on GPU 0, GPU 1 is idle
    phy = np.array([[0, 1, 2, 3]])
    slot = np.array([[100.0, 0.0, 0.0, 0.0]])
    p = plan(slot, phy, 2, 2, experts=4, cap=1)
    assert p.recv.tolist() == [[50.0, 50.0]]
    assert p.gpu[0, 0, 0] == 1 and p.expert[0, 0, 0] == 0 and p.source[0, 0, 0] == 0
    assert (p.gpu[0, 0, 1:] == -1).all()  # nothing left to gain
    # a copy that would not pay for itself (min_gain above the gain) is not made
    q = plan(slot, phy, 2, 2, experts=4, cap=1, min_gain=60.0)
    assert (q.gpu == -1).all() and q.recv.tolist() == [[100.0, 0.0]]


def _unit(phase, seed=3):
    cfg = serving.ClusterConfig.deepseek_day6()
    topo = cfg.topology(phase)
    rng = np.random.default_rng(seed)
    load = rng.gamma(0.5, size=(58, 256))
    return topo, trivial_placement(deepseek_v3, topo), load, rng


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_step_model_with_zero_overheads_never_has_a_busier_gpu(phase):
    topo, p, load, rng = _unit(phase)
    tokens = 4096 if phase == "prefill" else 128
    batch = RankBatch.uniform(phase, topo.num_gpus, tokens=tokens, context=1500)
    even = StepModel(phase, topo)
    dup = StepModel(phase, topo, dispatch="duplicate", duplicate=FREE)
    r_e, r_d = even.prepare(p, load), dup.prepare(p, load)
    for _ in range(2):
        step = load * rng.gamma(10, 0.1, size=load.shape)
        a, b = even.time_routed(batch, r_e, step), dup.time_routed(batch, r_d, step)
        assert (b.gpu_load_max <= a.gpu_load_max * (1 + 1e-12)).all()
        assert b.gpu_load_mean == pytest.approx(a.gpu_load_mean, rel=1e-12)  # picks conserved
        assert b.gpu_load_max.mean() < a.gpu_load_max.mean()  # the trivial placement is skewed
        assert sum(b.breakdown.values()) == pytest.approx(b.total_s)
    # the unprepared path agrees with the prepared one (decode: no visit probabilities)
    if phase == "decode":
        c = dup.time(batch, p, step)
        assert c.total_s == pytest.approx(b.total_s, rel=1e-9)


def test_overheads_are_charged_and_configurable():
    topo, p, load, _ = _unit("prefill")
    batch = RankBatch.uniform("prefill", topo.num_gpus, tokens=4096, context=1500)
    free = StepModel("prefill", topo, dispatch="duplicate", duplicate=FREE).time(batch, p, load)
    paid = StepModel("prefill", topo, dispatch="duplicate",
                     duplicate=DuplicateConfig(planner_s=1e-4)).time(batch, p, load)
    assert paid.meta["duplicate_s"] >= 1e-4 * 58 * 2  # planner on the critical path
    assert paid.meta["duplicate_copy_s"] > 0
    assert paid.total_s - paid.meta["duplicate_s"] > 0
    assert free.meta["duplicate_s"] <= paid.meta["duplicate_s"]


def test_bad_options_and_topologies_are_refused():
    topo = Topology(4, 1, 64)  # one GPU per node: no peer to copy to
    with pytest.raises(InputError, match="1 GPU per node"):
        StepModel("decode", topo, dispatch="duplicate")
    day6 = serving.ClusterConfig.deepseek_day6()
    t8 = day6.topology("decode")
    with pytest.raises(InputError, match="duplicate.experts = 0"):
        StepModel("decode", t8, dispatch="duplicate", duplicate=DuplicateConfig(experts=0))
    with pytest.raises(InputError, match="holds no expert copy"):
        StepModel("decode", t8, dispatch="duplicate", duplicate=DuplicateConfig(hbm_gb=0.0))
    with pytest.raises(InputError, match="prefill: duplicate.hbm_gb"):
        day6.replace(dispatch="duplicate", duplicate=DuplicateConfig(hbm_gb=0.05,
                                                                     overlap="previous_layer"))
    for bad, match in ((dict(experts=-1), "duplicate.experts"), (dict(experts=1.5), "integer"),
                       (dict(hbm_gb=float("inf")), "duplicate.hbm_gb"),
                       (dict(planner_s=-1e-6), "duplicate.planner_s"),
                       (dict(overlap="next_layer"), "duplicate.overlap")):
        with pytest.raises(InputError, match=match):
            DuplicateConfig(**bad)
    with pytest.raises(InputError, match="dispatch must be one of even, .*, duplicate"):
        day6.replace(dispatch="duplicated")
    with pytest.raises(InputError, match="unknown dispatch policy 'duplicated'"):
        StepModel("decode", t8, dispatch="duplicated")
    with pytest.raises(InputError, match="per-source loads"):
        p = trivial_placement(deepseek_v3, t8)
        StepModel("decode", t8, dispatch="duplicate").time(
            RankBatch.uniform("decode", t8.num_gpus, tokens=8, context=100), p,
            np.ones((58, t8.num_gpus, 256)))
    # the TOML block refuses unknown keys
    with pytest.raises(InputError, match="unknown key duplicate.budget"):
        serving.ClusterConfig.from_dict({"duplicate": {"budget": 1}})


def test_toml_steady_state_simulator_and_advise_accept_it(tmp_path):
    cfg = serving.ClusterConfig.deepseek_day6().replace(
        dispatch="duplicate", duplicate=DuplicateConfig(experts=4, overlap="previous_layer"))
    path = tmp_path / "c.toml"
    cfg.write_toml(path)
    back = serving.ClusterConfig.load(path)
    assert back == cfg and back.duplicate.experts == 4
    # the copies' HBM comes out of the KV cache
    less = with_duplicate_memory(back)
    assert less.decode.kv_capacity_tokens < cfg.decode.kv_capacity_tokens
    topo, p, load, _ = _unit("decode")
    s_even = serving.steady_state(cfg.replace(dispatch="even"), "decode", batch=64,
                                  placement=p, load=load)
    s_dup = serving.steady_state(back, "decode", batch=64, placement=p, load=load)
    assert s_dup["kv_usage"] > s_even["kv_usage"]
    assert s_dup["step_s"] != s_even["step_s"]
    wl = serving.workload.synthesize(20, rate=4.0, input_mean=512.0, output_mean=16.0, seed=0)
    res = serving.simulate(back, wl, seed=0, duration_s=5.0, progress=False)
    assert (res.steps["phase"] == "decode").any()
    a = advise(load, "2x8", 256, phase="prefill", tokens_per_rank=4096, redundant=(),
               levers=["dispatch_duplicate"], max_tokens=8192)
    rows = a.table[a.table.lever == "dispatch_duplicate"]
    assert set(rows["dispatch"]) == {"duplicate"} and len(rows) == 2
    assert (rows["kv_tokens_per_gpu"] < a.table.iloc[0]["kv_tokens_per_gpu"]).all()
    b = advise(load, "16x1", 256, phase="decode", tokens_per_rank=32, redundant=(),
               levers=["dispatch_duplicate"], max_tokens=64)
    assert (b.table.lever == "today").all()
    assert "dispatch_duplicate skipped" in str(b.meta) and "1 GPU per node" in str(b.meta)
