"""The simulator's step-time hot path: `StepModel.prepare` / `time_routed` against `time`,
the tabulated expert curve against the exact one, memoised GEMM curves."""

from __future__ import annotations

import numpy as np
import pytest

from eplb import solvers
from eplb.errors import InputError
from eplb.evaluation import serving
from eplb.evaluation.serving import RankBatch, StepModel
from eplb.evaluation.serving.steptime.curves import TABLE_TOL, GemmCurve, TabulatedCurve
from eplb.traces import synth

REL = 1e-12
CFG = serving.ClusterConfig.deepseek_day6()


def _model(phase: str, micro_batches: int = 2) -> StepModel:
    return StepModel(
        phase,
        CFG.topology(phase),
        model=CFG.model_spec,
        hardware=CFG.hardware_spec,
        micro_batches=micro_batches,
    )


def _batches(phase: str, G: int, rng) -> list[RankBatch]:
    if phase == "decode":
        return [
            RankBatch.uniform("decode", G, tokens=80, context=4000, query_tokens=2),
            RankBatch.decode(
                rng.integers(100, 9000, 3000),
                rng.integers(0, G, 3000),
                num_ranks=G,
                query_tokens=2,
            ),
        ]
    return [
        RankBatch.uniform("prefill", G, tokens=16384, context=4000),
        RankBatch.prefill(
            rng.integers(100, 16384, 80),
            rng.integers(0, 5000, 80),
            rng.integers(0, G, 80),
            num_ranks=G,
        ),
    ]


@pytest.mark.parametrize("phase", ["prefill", "decode"])
@pytest.mark.parametrize("micro_batches", [1, 2])
def test_time_routed_equals_time(phase, micro_batches):
    sm = _model(phase, micro_batches)
    topo = sm.topology
    trace = synth.calibrated(windows=2, seed=3, phase=phase)
    placement = solvers.solve("deepseek", trace.load(), topo, num_groups=8)
    routed = sm.prepare(placement, trace.counts[0])
    rng = np.random.default_rng(0)
    for batch in _batches(phase, topo.num_gpus, rng):
        a = sm.time(batch, placement, trace.counts[0])
        b = sm.time_routed(batch, routed)
        assert b.total_s == pytest.approx(a.total_s, rel=REL)
        for key, value in a.breakdown.items():
            assert b.breakdown[key] == pytest.approx(value, rel=REL, abs=REL * a.total_s)
        np.testing.assert_allclose(b.layer_s, a.layer_s, rtol=REL)
        np.testing.assert_allclose(b.gpu_load_max, a.gpu_load_max, rtol=REL)
        np.testing.assert_allclose(b.gpu_load_mean, a.gpu_load_mean, rtol=REL)
        # absolute picks that equal the rescaled distribution give the same step
        dist = trace.counts[0] / trace.counts[0].sum(-1, keepdims=True)
        picks = dist * (8 * batch.tokens.sum())
        c = sm.time_routed(batch, routed, picks, picks=True)
        assert c.total_s == pytest.approx(a.total_s, rel=REL)
        # the tabulated curve changes the step by far less than its own tolerance
        d = sm.time_routed(batch, routed, tabulated=True)
        assert d.total_s == pytest.approx(a.total_s, rel=TABLE_TOL)
        assert sum(d.breakdown.values()) == pytest.approx(d.total_s, rel=1e-9)


def test_decode_step_load_routes_through_placement():
    """With a step load other than the prepared one, decode (picks only) equals `time`."""
    sm = _model("decode")
    trace = synth.calibrated(windows=3, seed=4, phase="decode")
    placement = solvers.solve("greedy", trace.load(), sm.topology, num_groups=8)
    routed = sm.prepare(placement, trace.counts[0])
    batch = _batches("decode", sm.topology.num_gpus, np.random.default_rng(1))[1]
    a = sm.time(batch, placement, trace.counts[2])
    b = sm.time_routed(batch, routed, trace.counts[2])
    assert b.total_s == pytest.approx(a.total_s, rel=REL)


def test_balanced_prepare():
    sm = _model("prefill")
    batch = _batches("prefill", sm.topology.num_gpus, np.random.default_rng(2))[1]
    routed = sm.prepare(None)
    assert sm.time_routed(batch, routed).total_s == pytest.approx(sm.time(batch).total_s, rel=REL)
    with pytest.raises(InputError, match="load needs a placement"):
        sm.prepare(None, np.ones((58, 256)))


def test_prepare_refuses_local_first_and_bad_loads():
    topo = CFG.topology("prefill")
    sm = StepModel("prefill", topo, dispatch="local_first")
    placement = solvers.solve("deepseek", np.ones((58, 256)), topo, num_groups=8)
    with pytest.raises(InputError, match="local_first"):
        sm.prepare(placement, np.ones((58, 256)))
    sm = _model("prefill")
    with pytest.raises(InputError, match="float\\[58, 256\\]"):
        sm.prepare(placement, np.ones((58, 255)))
    with pytest.raises(InputError, match="finite"):
        sm.prepare(placement, -np.ones((58, 256)))


def test_tabulated_curve_within_tolerance():
    sm = _model("decode")
    table = TabulatedCurve(sm.gpu.expert)
    m = np.concatenate(
        [[0.0, 1e-6, 1.0, 63.999, 64.0, 64.001, 8192.0, 1e7], np.geomspace(1e-3, 1e6, 100_001)]
    )
    exact = sm.gpu.expert.seconds(m)
    got = table.seconds(m)
    assert got[0] == 0.0
    nz = exact > 0
    assert np.all(np.abs(got[nz] / exact[nz] - 1) < TABLE_TOL)


def test_gemm_memo_is_exact():
    sm = _model("decode")
    curve: GemmCurve = sm.rank.mla
    m = np.arange(0, 3000) / 2.0
    memo = curve.seconds(m)  # per-rank sized arrays of half tokens go through the memo
    direct = curve._compute(m)
    np.testing.assert_allclose(memo, direct, rtol=1e-15, atol=0)
    odd = np.array([0.25, 3.3, 100.0])  # not half tokens: computed directly
    np.testing.assert_array_equal(curve.seconds(odd), curve._compute(odd))
