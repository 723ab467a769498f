"""evaluation.metrics: per-layer and per-window scores, summaries, mismatch errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eplb import Placement, PlacementError, Topology, TraceError, solvers
from eplb.evaluation.align import align
from eplb.evaluation.metrics import (
    balancedness,
    gpu_loads,
    gpu_matrix,
    max_over_mean,
    score,
    score_trace,
    score_windows,
    summarize,
)
from eplb.solvers.analysis import bounds


def random_placement(rng, topo, L, E, weighted=False):
    rows = [rng.permutation(np.concatenate([np.arange(E), rng.integers(0, E, topo.num_slots - E)]))
            for _ in range(L)]
    phy2log = np.array(rows)
    share = None
    if weighted:
        share = rng.random(phy2log.shape) + 0.05
        sums = np.zeros((L, E))
        np.add.at(sums, (np.arange(L)[:, None], phy2log), share)
        share /= np.take_along_axis(sums, phy2log, 1)
    return Placement(phy2log, E, topo, share).validate()


def test_hand_computed_layer():
    # 1 node x 2 GPUs x 2 slots; GPU 0 holds experts 0, 1; GPU 1 holds 2 and a replica of 0
    topo = Topology(1, 2, 2)
    p = Placement([[0, 1, 2, 0]], 3, topo).validate()
    df = score(p, [[6.0, 2.0, 4.0]], bound=False)
    row = df.iloc[0]
    # expert 0 splits 3 + 3: GPU 0 = 3 + 2 = 5, GPU 1 = 4 + 3 = 7
    assert row["gpu_max"] == 7 and row["gpu_mean"] == 6 and row["gpu_min"] == 5
    assert row["balancedness"] == pytest.approx(6 / 7)
    assert row["max_over_mean"] == pytest.approx(7 / 6)
    assert row["imbalance"] == pytest.approx(1 / 6)
    assert row["node_max_over_mean"] == 1.0
    assert row["replicas_max"] == 2 and row["experts_replicated"] == 1
    assert row["hottest_replicas"] == 2 and row["replicas_mean"] == pytest.approx(4 / 3)
    assert np.isnan(row["max_over_bound"])


def test_idle_layer_is_balanced():
    p = Placement([[0, 1]], 2, Topology(1, 2, 1)).validate()
    row = score(p, [[0.0, 0.0]], bound=False).iloc[0]
    assert row["balancedness"] == 1.0 and row["imbalance"] == 0.0


@settings(max_examples=15)
@given(seed=st.integers(0, 2**16), weighted=st.booleans(),
       shape=st.sampled_from([(1, 2, 3), (2, 2, 2), (2, 4, 1), (3, 1, 3)]))
def test_window_scores_match_per_layer_scores(seed, weighted, shape):
    rng = np.random.default_rng(seed)
    topo = Topology(*shape)
    E = topo.num_slots - int(rng.integers(0, 3))
    p = random_placement(rng, topo, 3, E, weighted)
    counts = rng.random((4, 3, E)) * 100
    counts[1, 2] = 0  # an idle layer
    M = gpu_matrix(p)
    np.testing.assert_allclose(M.sum(-1), 1.0)
    loads = gpu_loads(p, counts, chunk=3)  # chunking must not change anything
    wide = score_windows(p, counts)
    assert len(wide) == 4 * 3
    for t in range(4):
        np.testing.assert_allclose(loads[t], p.gpu_load(counts[t]))
        one = score(p, counts[t], bound=False)
        part = wide[wide["window"] == t].reset_index(drop=True)
        for col in ("gpu_max", "gpu_mean", "balancedness", "max_over_mean", "imbalance",
                    "node_max_over_mean", "picks"):
            np.testing.assert_allclose(part[col], one[col], err_msg=col)
    np.testing.assert_allclose(wide["balancedness"], 1 / wide["max_over_mean"])
    np.testing.assert_allclose(balancedness(loads[0]), 1 / max_over_mean(loads[0]))


def test_summaries():
    rng = np.random.default_rng(0)
    topo = Topology(2, 2, 2)
    p = random_placement(rng, topo, 4, 6)
    load = rng.random((4, 6)) * 10
    df = score(p, load, bound=False)
    s = summarize(df)
    assert s["layers"] == 4
    assert s["step_max_over_mean"] == pytest.approx(df["gpu_max"].sum() / df["gpu_mean"].sum())
    assert s["balancedness_min"] == pytest.approx(df["balancedness"].min())
    assert s["max_over_mean_worst"] == pytest.approx(df["max_over_mean"].max())
    w = score_windows(p, np.stack([load, 2 * load, load * 0.5]))
    per = summarize(w, by="window")
    assert list(per.index) == [0, 1, 2]
    # scaling the load does not change the ratios
    np.testing.assert_allclose(per["step_max_over_mean"], s["step_max_over_mean"])


def test_lower_bound_ratio():
    rng = np.random.default_rng(1)
    topo = Topology(2, 4, 3)
    load = rng.random((5, 20)) * 100
    p = solvers.solve("deepseek", load, topo)
    df = score(p, load)
    np.testing.assert_allclose(df["lower_bound"], bounds.lower_bound(load, topo))
    assert (df["max_over_bound"] >= 1 - 1e-9).all()


def test_mismatch_errors_name_the_shapes():
    from eplb.traces import Trace

    topo = Topology(1, 2, 2)
    p = Placement([[0, 1, 2, 3]], 4, topo).validate()
    with pytest.raises(PlacementError, match="placement is \\[1 layers, 4 experts\\]"):
        score(p, np.ones((1, 5)))
    with pytest.raises(PlacementError, match="4 experts per layer but the trace has 3"):
        align(p, Trace(np.ones((1, 1, 3))))
    with pytest.raises(PlacementError, match="no rows for trace layers 7"):
        align(p, Trace(np.ones((1, 1, 4)), layer_ids=[7]))
    with pytest.raises(TraceError):
        Trace(np.ones((0, 1, 4)))  # a trace with no windows cannot even be built


def test_align_selects_trace_layers():
    from eplb.traces import Trace

    topo = Topology(1, 2, 1)
    p = Placement([[0, 1], [1, 0], [0, 1]], 2, topo, layer_ids=[3, 4, 5]).validate()
    trace = Trace(np.array([[[1.0, 3.0], [5.0, 1.0]]]), layer_ids=[5, 4])
    sub = align(p, trace)
    np.testing.assert_array_equal(sub.layer_ids, [5, 4])
    np.testing.assert_array_equal(sub.phy2log, [[0, 1], [1, 0]])
    df = score_trace(p, trace)
    assert df["layer"].tolist() == [5, 4]
    np.testing.assert_allclose(df["gpu_max"], [3.0, 5.0])
