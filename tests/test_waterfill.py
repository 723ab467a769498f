"""Waterfill (`eplb.dispatch.waterfill`, SGLang PR #19290): the waterline conserves the shared
expert's tokens, never raises the busiest rank above the local split (nor above even split's
routed load plus local shared work), equals local when routed loads and batches are balanced,
moves only what it must; the step-time model, steady_state, the simulator and TOML honour
``shared_expert``, and a model without a shared expert refuses it with one clear error."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eplb import solvers
from eplb.dispatch.waterfill import shipped, waterline
from eplb.errors import InputError
from eplb.evaluation import serving
from eplb.evaluation.serving import RankBatch, StepModel
from eplb.evaluation.serving.config.model import deepseek_v3


@st.composite
def _loads(draw):
    nodes = draw(st.integers(1, 3))
    G = nodes * draw(st.integers(1, 4))
    L = draw(st.integers(1, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    scale = draw(st.sampled_from([1e-6, 1.0, 1e6]))
    routed = rng.gamma(draw(st.sampled_from([0.3, 1.0, 5.0])), size=(L, G)) * scale
    routed[rng.random((L, G)) < 0.2] = 0.0
    own = rng.integers(0, 40, size=G) * scale
    return routed, own, nodes


@settings(max_examples=60, deadline=None)
@given(_loads())
def test_waterline_conserves_and_never_raises_the_max(case):
    routed, own, nodes = case
    share = waterline(routed, own.sum())
    tol = 1e-9 * max(routed.max(initial=0.0) + own.sum(), 1e-300)
    assert (share >= 0).all()
    assert np.allclose(share.sum(-1), own.sum(), rtol=1e-9, atol=tol)  # every token once
    top = (routed + share).max(-1)
    assert (top <= (routed + own).max(-1) + tol).all()  # never above local
    # the level is the optimum of any split: max(routed) or the mean of routed + shared
    best = np.maximum(routed.max(-1), (routed.sum(-1) + own.sum()) / routed.shape[-1])
    assert np.allclose(top, best, rtol=1e-9, atol=tol)
    out, inn, rd_out, rd_in = shipped(share, own, nodes)
    assert np.allclose(out.sum(-1), inn.sum(-1), rtol=1e-9, atol=tol)  # sent = received
    assert np.allclose(rd_out.sum(-1), rd_in.sum(-1), rtol=1e-9, atol=tol)
    assert (rd_out <= out + tol).all() and (rd_in <= inn + tol).all()
    if nodes == 1:
        assert (rd_out == 0).all()


def test_waterline_equals_local_when_balanced():
    routed = np.full((2, 8), 37.0)
    own = np.full(8, 5.0)
    assert np.array_equal(waterline(routed, own.sum()), np.broadcast_to(own, (2, 8)))
    out, inn, _, _ = shipped(waterline(routed, own.sum()), own, 2)
    assert not out.any() and not inn.any()


def _unit(phase, seed=3):
    cfg = serving.ClusterConfig.deepseek_day6()
    topo = cfg.topology(phase)
    rng = np.random.default_rng(seed)
    load = rng.gamma(0.5, size=(58, 256))
    return cfg, topo, solvers.solve("deepseek", load, topo, num_groups=8), load, rng


def test_step_model_waterfill_equals_local_when_balanced():
    # decode runs the shared expert in the expert stage either way; in prefill the fused
    # shared expert moves from the attention stage to the expert stage (#20089), so only the
    # shares are equal there (test_waterline_equals_local_when_balanced)
    topo = serving.ClusterConfig.deepseek_day6().topology("decode")
    batch = RankBatch.uniform("decode", topo.num_gpus, tokens=64, context=1500)
    local = StepModel("decode", topo).time(batch)  # perfectly balanced routing
    wf = StepModel("decode", topo, shared_expert="waterfill").time(batch)
    assert wf.total_s == pytest.approx(local.total_s, rel=1e-12)
    assert wf.breakdown == pytest.approx(local.breakdown, rel=1e-12)


@pytest.mark.parametrize("phase", ["prefill", "decode"])
@pytest.mark.parametrize("dispatch", ["even", "lp"])
def test_step_model_waterfill_pays_on_skewed_loads(phase, dispatch):
    cfg, topo, p, load, rng = _unit(phase)
    tokens = 4096 if phase == "prefill" else 128
    batch = RankBatch.uniform(phase, topo.num_gpus, tokens=tokens, context=1500)
    kw = dict(dispatch=dispatch, lp_overhead_s=0.0)
    local = StepModel(phase, topo, **kw)
    wf = StepModel(phase, topo, shared_expert="waterfill", **kw)
    r_l, r_w = local.prepare(p, load), wf.prepare(p, load)
    for _ in range(2):
        step = load * rng.gamma(10, 0.1, size=load.shape)
        a, b = local.time_routed(batch, r_l, step), wf.time_routed(batch, r_w, step)
        assert np.array_equal(a.gpu_load_max, b.gpu_load_max)  # routed picks unchanged
        if dispatch == "even" or phase == "decode":
            # (prefill after lp: routed already level, and the fused shared GEMM leaves the
            # attention stage it overlapped with; it can lose there, docs "Waterfill")
            assert b.total_s < a.total_s
        assert sum(b.breakdown.values()) == pytest.approx(b.total_s)
        if phase == "decode":  # the unprepared path agrees (prefill: exact visits there)
            c = wf.time(batch, p, step)
            assert c.total_s == pytest.approx(b.total_s, rel=1e-9)


def test_waterfill_refused_without_a_shared_expert():
    bare = dataclasses.replace(deepseek_v3, name="no_shared", shared_experts=0)
    topo = serving.ClusterConfig.deepseek_day6().topology("decode")
    with pytest.raises(InputError, match="shared_expert 'waterfill' needs a model with a shared"):
        StepModel("decode", topo, model=bare, shared_expert="waterfill")
    StepModel("decode", topo, model=bare)  # local is fine
    with pytest.raises(InputError, match="shared_expert must be one of"):
        serving.ClusterConfig.deepseek_day6().replace(shared_expert="remote")


def test_simulator_steady_state_and_toml_honour_waterfill(tmp_path):
    cfg = serving.ClusterConfig.deepseek_day6().replace(shared_expert="waterfill")
    path = tmp_path / "c.toml"
    cfg.write_toml(path)
    back = serving.ClusterConfig.load(path)
    assert back.shared_expert == "waterfill"
    wl = serving.workload.synthesize(40, rate=4.0, input_mean=512.0, output_mean=32.0, seed=0)
    res = serving.simulate(back, wl, seed=0, duration_s=10.0, progress=False)
    assert (res.steps["phase"] == "decode").any()
