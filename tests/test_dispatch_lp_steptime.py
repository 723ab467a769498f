"""``lp`` dispatch in counts mode (`eplb.dispatch.lp_shares`) and in the step-time model and
simulator: the split is the min-max optimum (HiGHS oracle), shares are a distribution per
expert, scale invariant, never route to failed GPUs; the step-time model's busiest GPU never
carries more picks than under ``even``, and with expert GEMMs linear in picks a decode step is
never slower (on the measured curve it can be: pinned counterexample); the overhead is what the
config says."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eplb import Placement, Topology, solvers, traces
from eplb.dispatch import gpu_slots, minmax
from eplb.dispatch.lp_shares import LpShares, lp_shares
from eplb.errors import InputError
from eplb.evaluation import serving
from eplb.evaluation.serving import RankBatch, StepModel
from eplb.evaluation.serving.config.model import deepseek_v3
from eplb.evaluation.serving.steptime.curves import LinearCurve


def _gpu_loads(p: Placement, load: np.ndarray, share: np.ndarray) -> np.ndarray:
    slot = np.take_along_axis(load, np.maximum(p.phy2log, 0), 1) * share
    return slot.reshape(p.num_layers, p.topology.num_gpus, -1).sum(-1)


def _oracle_T(p: Placement, layer: int, load: np.ndarray) -> float:
    """The LP optimum of the layer's min-max split, by HiGHS (independent of the max-flow)."""
    held = gpu_slots(p, layer) >= 0
    ngpu = held.sum(1)
    G = p.topology.num_gpus
    fixed = np.zeros(G)
    single = np.nonzero(ngpu == 1)[0]
    np.add.at(fixed, held[single].argmax(1), load[single])
    flex = np.nonzero(ngpu >= 2)[0]
    if flex.size == 0:
        return float(fixed.max())
    arc_j, arc_g = np.nonzero(held[flex])
    # split_lp takes integer picks: scale the float load to large integers
    scale = 1e6 / max(load.sum(), 1e-300)
    T, _ = minmax.split_lp(np.rint(load[flex] * scale), np.rint(fixed * scale), arc_j, arc_g)
    return T / scale


@st.composite
def _cases(draw):
    N = draw(st.integers(1, 2))
    g = draw(st.integers(1, 3))
    S = draw(st.integers(1, 3))
    failed = draw(st.lists(st.integers(0, N * g - 1), unique=True, max_size=max(N * g - 1, 0)))
    topo = Topology(N, g, S, failed_gpus=failed)
    live_slots = (N * g - len(failed)) * S
    E = draw(st.integers(1, live_slots))
    L = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    p = solvers.solve("greedy", rng.random((L, E)) + 0.05, topo)
    load = rng.integers(0, 50, size=(L, E)) * draw(st.sampled_from([1e-9, 1.0, 1e9]))
    return p, load.astype(float)


@settings(max_examples=60, deadline=None)
@given(_cases())
def test_lp_shares_are_the_minmax_optimum(case):
    p, load = case
    share = lp_shares(p, load)
    assert (share >= 0).all()
    # each expert's shares sum to 1; empty slots get nothing
    sums = np.zeros(load.shape)
    rows = np.repeat(np.arange(p.num_layers), p.topology.num_slots)
    np.add.at(sums, (rows, np.maximum(p.phy2log, 0).ravel()), share.ravel())
    assert np.allclose(sums, 1.0)
    assert (share[p.phy2log < 0] == 0).all()
    gpu = _gpu_loads(p, load, share)
    for failed in p.topology.failed_gpus:
        assert (gpu[:, failed] == 0).all()
    even = np.where(
        p.phy2log >= 0,
        1.0 / np.take_along_axis(p.logcnt, np.maximum(p.phy2log, 0), 1),
        0.0,
    )
    even_gpu = _gpu_loads(p, load, even)
    for layer in range(p.num_layers):
        T = _oracle_T(p, layer, load[layer])
        tol = 1e-6 * max(load[layer].sum(), 1e-300)
        assert gpu[layer].max() <= T + tol
        # and never above the even split's busiest GPU (every layer's own placement: a
        # one-layer slice of the load against the whole phy2log compared layer 0's GPUs)
        ev = even_gpu[layer]
        assert gpu[layer].max() <= ev.max() + tol


def test_lp_shares_per_layer_never_above_even_on_a_pinned_two_layer_case():
    """The case that exposed the property's own slicing bug (layer 1 compared against layer
    0's GPUs): per layer, the lp split's busiest GPU is at most the even split's."""
    p = Placement(np.array([[0, 2, 0, 1], [1, 0, 2, 2]]), 3, Topology(1, 2, 2))
    load = np.array([[25, 30, 48], [36, 31, 27]]) * 1e-9
    gpu = _gpu_loads(p, load, lp_shares(p, load))
    even = _gpu_loads(p, load, p.share)
    np.testing.assert_allclose(gpu.max(1), [51.5e-9, 67e-9])  # by hand: (25+30+48)/2; 36+31
    assert (gpu.max(1) <= even.max(1) + 1e-18).all()


@settings(max_examples=30, deadline=None)
@given(_cases(), st.sampled_from([1e-7, 3.0, 1e8]))
def test_lp_shares_scale_invariant_and_warm_start_safe(case, c):
    p, load = case
    ls = LpShares(p)
    first = ls(load)
    again = ls(load * c)  # a second call starts from the first call's cut sets
    assert np.allclose(
        _gpu_loads(p, load, first).max(1), _gpu_loads(p, load, again).max(1), rtol=1e-9, atol=0
    )


@settings(max_examples=10, deadline=None)
@given(_cases(), st.integers(0, 2**31 - 1))
def test_lp_shares_do_not_depend_on_the_warm_start(case, seed):
    # every warm start is a lower bound, so the last solve runs at the optimal T with the
    # same capacities: a warmed solver returns exactly what a fresh one does
    p, load = case
    warm = LpShares(p)
    rng = np.random.default_rng(seed)
    for _ in range(12):  # more calls than cut sets remembered
        warm(load * rng.gamma(1.0, size=load.shape))
    assert np.array_equal(warm(load), LpShares(p)(load))


def test_lp_counts_send_nothing_to_a_failed_gpu():
    p = Placement(np.array([[0, -1]]), 1, Topology(1, 2, 1, failed_gpus=[1]))
    assert lp_shares(p, np.array([[31.0]])).tolist() == [[1.0, 0.0]]


def _unit(phase):
    cfg = serving.ClusterConfig.deepseek_day6()
    topo = cfg.topology(phase)
    rng = np.random.default_rng(3)
    load = rng.gamma(0.5, size=(58, 256))
    return cfg, topo, solvers.solve("deepseek", load, topo, num_groups=8), load, rng


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_step_model_lp_never_loads_the_busiest_gpu_more_than_even(phase):
    cfg, topo, p, load, rng = _unit(phase)
    tokens = 2048 if phase == "prefill" else 64
    batch = RankBatch.uniform(phase, topo.num_gpus, tokens=tokens, context=1500)
    even = StepModel(phase, topo, dispatch="even")
    lp = StepModel(phase, topo, dispatch="lp", lp_overhead_s=0.0)
    r_even, r_lp = even.prepare(p, load), lp.prepare(p, load)
    for _ in range(3):
        step = load * rng.gamma(10, 0.1, size=load.shape)
        a, b = even.time_routed(batch, r_even, step), lp.time_routed(batch, r_lp, step)
        assert (b.gpu_load_max <= a.gpu_load_max * (1 + 1e-9)).all()
        assert b.gpu_load_max.sum() < a.gpu_load_max.sum()
        # the unprepared path agrees with the prepared one on the GPU loads
        c = lp.time(batch, p, step)
        assert np.allclose(c.gpu_load_max, b.gpu_load_max, rtol=1e-9)


def test_lp_overhead_is_on_the_critical_path():
    cfg, topo, p, load, _ = _unit("decode")
    batch = RankBatch.uniform("decode", topo.num_gpus, tokens=64, context=1500)
    free = StepModel("decode", topo, dispatch="lp", lp_overhead_s=0.0).time(batch, p, load)
    paid = StepModel("decode", topo, dispatch="lp", lp_overhead_s=2e-4).time(batch, p, load)
    extra = 2e-4 * 58 * 2  # per MoE layer and micro-batch
    assert paid.total_s == pytest.approx(free.total_s + extra)
    assert paid.breakdown["overhead"] == pytest.approx(free.breakdown["overhead"] + extra)
    assert sum(paid.breakdown.values()) == pytest.approx(paid.total_s)
    # other dispatch rules pay nothing
    ev = StepModel("decode", topo, dispatch="even", lp_overhead_s=2e-4).time(batch, p, load)
    ev0 = StepModel("decode", topo, dispatch="even").time(batch, p, load)
    assert ev.total_s == ev0.total_s


@pytest.mark.parametrize("bad", [-1e-6, float("inf"), float("nan"), True, "1"])
def test_bad_lp_overhead_is_refused(bad):
    with pytest.raises(InputError, match="lp_overhead_s"):
        serving.ClusterConfig.deepseek_day6().replace(dispatch="lp", lp_overhead_s=bad)
    with pytest.raises(InputError, match="lp_overhead_s"):
        StepModel("decode", Topology(1, 8, 32), dispatch="lp", lp_overhead_s=bad)


def test_simulator_and_toml_accept_lp(tmp_path):
    cfg = serving.ClusterConfig.deepseek_day6().replace(dispatch="lp", lp_overhead_s=5e-5)
    path = tmp_path / "c.toml"
    cfg.write_toml(path)
    back = serving.ClusterConfig.load(path)
    assert (back.dispatch, back.lp_overhead_s) == ("lp", 5e-5)
    wl = serving.workload.synthesize(40, rate=4.0, input_mean=512.0, output_mean=32.0, seed=0)
    res = serving.simulate(back, wl, seed=0, duration_s=10.0, progress=False)
    assert len(res.steps) > 0
    assert (res.steps["phase"] == "decode").any()


@st.composite
def _small_units(draw):
    """A small MoE (``L`` layers, ``E`` experts, top-``k``) on a small topology, a `greedy`
    placement, a uniform batch and a step load with zeros."""
    N, g, S = draw(st.integers(1, 2)), draw(st.integers(1, 4)), draw(st.integers(1, 3))
    topo = Topology(N, g, S)
    E = draw(st.integers(1, N * g * S))
    L, k = draw(st.integers(1, 3)), draw(st.integers(1, min(E, 4)))
    model = dataclasses.replace(deepseek_v3, num_layers=3 + L, num_experts=E, top_k=k,
                                num_groups=1, topk_groups=1)
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    p = solvers.solve("greedy", rng.random((L, E)) + 0.05, topo)
    step = rng.gamma(draw(st.sampled_from([0.2, 1.0, 5.0])), size=(L, E))
    step[rng.random((L, E)) < 0.2] = 0.0
    return topo, model, p, step, draw(st.integers(1, 64))


def _even_and_lp(phase, topo, model, linear=False):
    ev = StepModel(phase, topo, model=model)
    lp = StepModel(phase, topo, model=model, dispatch="lp", lp_overhead_s=0.0)
    if linear:  # expert GEMMs linear in picks: the curve's non-linearity taken out
        ev.gpu.expert = lp.gpu.expert = LinearCurve(1e-6)
    return ev, lp


@settings(max_examples=40, deadline=None)
@given(_small_units(), st.sampled_from(["prefill", "decode"]))
def test_lp_busiest_gpu_picks_never_above_even_on_any_step(case, phase):
    topo, model, p, step, tokens = case
    batch = RankBatch.uniform(phase, topo.num_gpus, tokens=tokens, context=256)
    ev, lp = _even_and_lp(phase, topo, model)
    a = ev.time_routed(batch, ev.prepare(p, step), step)
    b = lp.time_routed(batch, lp.prepare(p, step), step)
    assert (b.gpu_load_max <= a.gpu_load_max * (1 + 1e-9) + 1e-9).all()


@settings(max_examples=40, deadline=None)
@given(_small_units())
def test_lp_decode_step_never_slower_with_gemm_linear_in_picks(case):
    # the strongest step-time claim that holds (docs/serving.md, "When lp with no overhead is
    # slower than even"): the measured curve's non-linearity is the only way lp loses in decode
    topo, model, p, step, tokens = case
    batch = RankBatch.uniform("decode", topo.num_gpus, tokens=tokens, context=256)
    ev, lp = _even_and_lp("decode", topo, model, linear=True)
    a = ev.time_routed(batch, ev.prepare(p, step), step)
    b = lp.time_routed(batch, lp.prepare(p, step), step)
    assert b.total_s <= a.total_s * (1 + 1e-12)
    assert (b.layer_s <= a.layer_s * (1 + 1e-12)).all()


def test_lp_without_overhead_can_be_slower_than_even_on_the_measured_curve(
        deepseek_prefill_json):
    # the counterexample docs/serving.md measures (scripts/lp_never_worse.py), pinned: Day-6
    # prefill, 256 tokens per rank; the busiest GPU still holds fewer picks
    cfg = serving.ClusterConfig.deepseek_day6()
    topo = cfg.topology("prefill")
    load = traces.read(deepseek_prefill_json).load()
    p = solvers.solve("deepseek", load, topo, num_groups=8)
    rng = np.random.default_rng(0)
    prob = load / load.sum(1, keepdims=True)
    d = rng.multinomial(8 * 256 * topo.num_gpus, prob).astype(float)
    batch = RankBatch.uniform("prefill", topo.num_gpus, tokens=256, context=1024)
    ev, lp = _even_and_lp("prefill", topo, cfg.model_spec)
    a = ev.time_routed(batch, ev.prepare(p, load), d, picks=True)
    b = lp.time_routed(batch, lp.prepare(p, load), d, picks=True)
    assert b.total_s > a.total_s * 1.01
    assert (b.gpu_load_max <= a.gpu_load_max * (1 + 1e-9)).all()


def test_docs_quote_the_current_lp_cost_and_date_older_ones():
    """The cost of ``lp`` in the simulator quoted in docs/ and paper/: every paragraph naming
    ``benchmarks/bench_dispatch_lp.py`` holds the current one-hour figures, whose ratios are
    the quoted seconds' (CPU 57.4 / 34.4 = 1.67x, no overhead 73.4 / 34.4 = 2.13x, wall
    81.5 / 71.6 = 1.14x), and a paragraph that quotes any other ratio says which of them
    predate the warm start."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    paragraphs = [(path, par) for path in [*root.glob("docs/*.md"), *root.glob("paper/*.md")]
                  for par in path.read_text("utf-8").split("\n\n")
                  if "bench_dispatch_lp" in par]
    assert paragraphs
    for path, par in paragraphs:
        text = " ".join(par.split())
        m = re.search(r"`even` ([\d.]+) s wall, ([\d.]+) s CPU; `lp` ([\d.]+) s wall, ([\d.]+) s "
                      r"CPU: ([\d.]+)x in CPU seconds \(([\d.]+)x wall.*?no overhead.*?([\d.]+) s "
                      r"CPU, ([\d.]+)x", text)
        assert m, f"{path.name}: no current one-hour figures in a bench_dispatch_lp paragraph"
        ew, ec, lw, lc, cpu, wall, zc, zero = map(float, m.groups())
        assert (f"{lc / ec:.2f}", f"{lw / ew:.2f}", f"{zc / ec:.2f}") == (
            f"{cpu:.2f}", f"{wall:.2f}", f"{zero:.2f}")
        current = {cpu, wall, zero, 2.0}  # and the 2x target
        others = {float(x) for x in re.findall(r"\b(\d+(?:\.\d+)?)x\b", text)} - current
        if others:
            assert "before the warm start" in text, (path.name, sorted(others))
