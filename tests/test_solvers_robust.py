"""``robust`` and what it stands on: policies that take windows (registry, `check_solver`,
replay), the forecast, the ring layout for ``lp`` dispatch."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from eplb import InputError, Placement, Topology, solvers
from eplb.evaluation.replay import replay
from eplb.solvers.primitives.even_split import row_caps
from eplb.solvers.primitives.forecast import ALPHAS, backtest, forecast, normalise
from eplb.solvers.primitives.replication import waterfill
from eplb.solvers.primitives.ring_layout import ring_layout
from eplb.testing import assert_valid_placement, check_solver
from eplb.traces import Trace, synth

TOPO = Topology(2, 2, 4)  # 16 slots


@pytest.fixture
def window_spy():
    """Registers ``eval_window_spy`` (``windows=True``) for one test, unregistered after it: a
    policy that records the shape it was given, then places the last window with greedy.
    Yields the list of shapes."""
    seen: list[tuple] = []

    def spy(load, topology):
        seen.append(load.shape)
        return solvers.get("greedy")(load[-1], topology)

    solvers.register("eval_window_spy", windows=True)(spy)
    try:
        yield seen
    finally:
        solvers.unregister("eval_window_spy")


# ------------------------------------------------------------------- forecast
def test_backtest_is_the_one_step_ahead_ema():
    rng = np.random.default_rng(0)
    h = rng.random((5, 2, 6))
    f, err = backtest(h, (1.0, 0.5))
    for i, a in enumerate((1.0, 0.5)):
        pred, e = h[0], np.zeros(2)
        for w in h[1:]:
            e += ((pred - w) ** 2).sum(-1)
            pred = a * w + (1 - a) * pred
        np.testing.assert_allclose(f[i], pred)
        np.testing.assert_allclose(err[i], e)


def test_forecast_follows_drift_and_averages_noise():
    rng = np.random.default_rng(1)
    base = rng.random((1, 40)) * 100 + 10
    noisy = base * np.exp(0.3 * rng.standard_normal((12, 1, 40)))  # stationary noise
    assert forecast(noisy).alpha[0] < 0.5
    steps = np.cumsum(rng.standard_normal((12, 1, 40)), 0)  # a random walk
    assert forecast(base * np.exp(steps)).alpha[0] == 1.0
    one = forecast(noisy[:1])
    np.testing.assert_allclose(one.load, noisy[0])
    assert (one.spread == 0).all()
    two = forecast(noisy[:2])  # too short to backtest: the last window
    assert two.alpha[0] == ALPHAS[0]
    np.testing.assert_allclose(two.load, noisy[1])


def test_normalise_rescales_to_the_latest_total():
    h = np.array([[[1.0, 3.0]], [[10.0, 10.0]], [[0.0, 0.0]], [[2.0, 2.0]]])
    n = normalise(h)
    np.testing.assert_allclose(n.sum(-1)[[0, 1, 3]], 4.0)
    assert (n[2] == 0).all()


# ------------------------------------------------------------------ registry
def test_windowed_policies_get_windows_and_others_one_load(window_spy):
    counts = np.random.default_rng(2).integers(1, 50, (3, 2, 12)).astype(float)
    trace = Trace(counts, layer_ids=[5, 6])
    p = solvers.solve("eval_window_spy", trace, TOPO)
    assert window_spy[-1] == (3, 2, 12) and p.layer_ids.tolist() == [5, 6]
    solvers.solve("eval_window_spy", counts[0], TOPO)  # [L, E] is one window
    assert window_spy[-1] == (1, 2, 12)
    assert solvers.takes_windows("robust") and not solvers.takes_windows("greedy")
    with pytest.raises(InputError, match="windows, layers, experts"):
        solvers.solve("robust", counts[None], TOPO)
    with pytest.raises(InputError):
        solvers.solve("greedy", counts, TOPO)  # a one-load policy refuses windows
    bad = counts.copy()
    bad[1, 0, 3] = np.nan
    with pytest.raises(InputError):
        solvers.solve("robust", bad, TOPO)
    with pytest.raises(InputError, match="windows must be True or False"):
        solvers.register("eval_bad", windows="yes")


def test_check_solver_runs_the_windows_property_on_plain_functions():
    def last_window(load, topology):
        return solvers.get("greedy")(load[-1], topology)

    report = check_solver(last_window, windows=True, max_examples=5)
    assert "windows" in report.passed

    def flattens(load, topology):  # places [W * L, E] rows: wrong once there are 2+ windows
        return solvers.get("greedy")(load.reshape(-1, load.shape[-1]), topology)

    report = check_solver(flattens, windows=True, max_examples=5, raise_on_failure=False)
    assert "valid" in report.passed
    assert [f.prop for f in report.failures] == ["windows"]


# -------------------------------------------------------------------- robust
@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**16), st.sampled_from(["packed", "ring"]), st.integers(1, 4))
def test_robust_is_valid_and_deterministic_on_windows(seed, layout, W):
    rng = np.random.default_rng(seed)
    topo = Topology(int(rng.integers(1, 3)), int(rng.integers(1, 4)), int(rng.integers(1, 4)))
    E = int(rng.integers(1, topo.num_slots + 1))
    windows = rng.integers(0, 30, (W, 2, E)).astype(float) * (rng.random((1, 1, E)) * 5)
    a = solvers.solve("robust", windows, topo, layout=layout)
    assert_valid_placement(a, windows.sum(0))
    assert a.equals(solvers.solve("robust", windows.copy(), topo, layout=layout))


def test_robust_gives_volatile_experts_more_replicas():
    # expert 0 swings between 0 and 200, expert 1 is steady at 100: same mean
    w = np.full((6, 1, 8), 10.0)
    w[:, 0, 0] = [0, 200, 0, 200, 0, 200]
    w[:, 0, 1] = 100
    topo = Topology(1, 4, 3)  # 12 slots, 4 spare
    calm = solvers.solve("robust", w, topo, volatility=0.0).logcnt[0]
    wary = solvers.solve("robust", w, topo, volatility=1.0).logcnt[0]
    assert wary[0] > calm[0]


def test_robust_options_are_checked():
    w = np.ones((2, 1, 12))
    with pytest.raises(InputError, match="ring"):
        solvers.solve("robust", w, TOPO, layout="ring", scenarios="mean")
    with pytest.raises(InputError, match="layout"):
        solvers.solve("robust", w, TOPO, layout="cube")
    with pytest.raises(InputError, match="volatility"):
        solvers.solve("robust", w, TOPO, volatility=-1.0)


def test_robust_repair_moves_fewer_replicas():
    trace = synth.calibrated(windows=6, tokens=2048, seed=3)
    topo = Topology(4, 8, 9)
    live = solvers.solve("robust", trace.counts[:3], topo)
    fresh = solvers.solve("robust", trace.counts[1:4], topo, previous=live)
    kept = solvers.solve("robust", trace.counts[1:4], topo, previous=live, tolerance=0.01)
    assert kept.meta["solver"]["relabeled"]
    assert (
        kept.meta["solver"]["replicas_moved_total"] < fresh.meta["solver"]["replicas_moved_total"]
    )


# --------------------------------------------------------------- ring layout
def _joins(phy2log: np.ndarray, topo: Topology) -> nx.Graph:
    g = nx.Graph()
    g.add_nodes_from(range(topo.num_gpus))
    gpu = np.arange(topo.num_slots) // topo.slots_per_gpu
    for e in np.unique(phy2log):
        hold = np.unique(gpu[phy2log == e])
        g.add_edges_from(zip(hold[:-1], hold[1:], strict=True))
    return g


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**16))
def test_ring_layout_connects_every_gpu_when_spare_slots_allow(seed):
    rng = np.random.default_rng(seed)
    topo = Topology(int(rng.integers(1, 3)), int(rng.integers(1, 4)), int(rng.integers(2, 4)))
    G, P = topo.num_gpus, topo.num_slots
    E = int(rng.integers(max(1, P - 2 * G), P - G + 1))  # P - E >= G: a ring fits
    load = rng.random((1, E)) ** 3 * 100
    counts = waterfill(load, P, row_caps(np.ones((1, E), dtype=bool), G, topo.slots_per_gpu))
    phy2log, ok = ring_layout(load, counts, G, topo.slots_per_gpu)
    assume(ok[0])
    p = Placement(phy2log, E, topo).validate()
    np.testing.assert_array_equal(p.logcnt, counts)
    assert nx.is_connected(_joins(phy2log[0], topo))


# -------------------------------------------------------------------- replay
def test_replay_passes_history_windows_to_windowed_policies(window_spy):
    counts = np.random.default_rng(4).integers(1, 50, (6, 2, 12)).astype(float)
    trace = Trace(counts)
    replay(trace, TOPO, solver="eval_window_spy", interval=2, history=3)
    assert window_spy == [(1, 2, 12), (2, 2, 12), (3, 2, 12)]  # initial, t=2 (windows 0-1), t=4
    with pytest.raises(InputError, match="ema"):
        replay(trace, TOPO, solver="robust", ema=0.5)


def test_replay_dispatches_token_windows():
    target = synth.drift(2, 16, windows=3, tokens=512, seed=1, meta={"num_groups": 4})
    counts, tokens = synth.token_windows(
        target,
        num_tokens=128,
        num_groups=4,
        topk_groups=2,
        top_k=4,
        num_ranks=4,
        iterations=3,
        seed=5,
    )
    assert counts.num_windows == 3 and all(t.num_windows == 1 for t in tokens)
    topo = Topology(2, 2, 5)
    frames = {
        pol: replay(counts, topo, solver="greedy", policy=pol, tokens=tokens)
        for pol in ("even", "lp")
    }
    for f in frames.values():
        assert {"dispatch_step_max_over_mean", "rdma_bytes"} <= set(f.columns)
    assert (
        frames["lp"]["dispatch_step_max_over_mean"]
        <= frames["even"]["dispatch_step_max_over_mean"] + 1e-12
    ).all()
    with pytest.raises(InputError, match="one token-level trace per window"):
        replay(counts, topo, policy="lp", tokens=tokens[:2])
    with pytest.raises(InputError, match="policy"):
        replay(counts, topo, tokens=tokens)
    with pytest.raises(InputError, match="pick counts differ"):
        replay(counts, topo, policy="lp", tokens=tokens[::-1])
