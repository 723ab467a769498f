"""evaluation.compare / pareto / plots: sweeps, local pool and Dask runners, tables, figures."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eplb import InputError, Topology, TopologyError, solvers
from eplb.evaluation.compare import TopologySpec, compare, parse_topologies
from eplb.evaluation.metrics import score, summarize
from eplb.evaluation.pareto import front, sweep
from eplb.evaluation.traffic import simulate
from eplb.traces import Trace, synth

PNG = b"\x89PNG\r\n\x1a\n"
STABLE = ["trace", "topology", "solver", "status", "step_max_over_mean", "balancedness_min",
          "rdma_bytes", "nvlink_bytes", "alltoall_seconds"]


def small_traces():
    a = synth.zipf(4, 12, windows=3, tokens=400, top_k=2, seed=1)
    b = synth.zipf(4, 12, windows=2, tokens=300, top_k=2, seed=2)
    rng = np.random.default_rng(3)
    src = rng.integers(0, 20, (2, 4, 2, 12)).astype(float)  # 2 source ranks
    c = Trace(src.sum(2), source_counts=src, meta={"top_k": 2, "num_groups": 4})
    return {"a": a, "b": b, "ranked": c}


def test_topology_specs():
    assert TopologySpec.parse("4x8:288").resolve(256).slots_per_gpu == 9
    assert TopologySpec.parse("4x8x9").resolve(256).num_slots == 288
    assert TopologySpec.parse("2x4+3").resolve(12).num_slots == 16  # 15 rounded up to 8 GPUs
    assert TopologySpec.parse("2x4").resolve(12).num_slots == 16
    assert [s.text for s in parse_topologies("4x8:288, 18x8:288")] == ["4x8:288", "18x8:288"]
    with pytest.raises(TopologyError, match="not a multiple of 32 GPUs; use 288"):
        TopologySpec.parse("4x8:287").resolve(256)
    with pytest.raises(TopologyError, match="is not NxG:SLOTS"):
        parse_topologies("four")


def test_compare_inline_is_tidy_and_matches_direct_scoring():
    traces = small_traces()
    res = compare(traces, solvers=["deepseek"], topologies="2x2:16,1x4+4,2x2:8",
                  progress=False)
    s = res.summary
    assert len(s) == 3 * 3
    bad = s[s["topology"] == "2x2:8"]
    assert bad["status"].str.contains("InfeasibleError").all()  # 8 slots < 12 experts
    ok = s[s["status"] == "ok"]
    assert len(ok) == 6
    # one task recomputed by hand
    row = ok[(ok["trace"] == "a") & (ok["topology"] == "2x2:16")].iloc[0]
    topo = Topology(2, 2, 4)
    p = solvers.solve("deepseek", traces["a"].load(), topo)
    direct = summarize(score(p, traces["a"].load()))
    assert row["step_max_over_mean"] == pytest.approx(direct["step_max_over_mean"])
    rep = simulate(p, load=traces["a"].load(), top_k=2)
    assert row["rdma_bytes"] == pytest.approx(rep.summary()["rdma_bytes"])
    assert row["traffic_source"] == "even"
    ranked = ok[ok["trace"] == "ranked"]
    assert set(ranked["traffic_source"]) == {"per-rank"}  # 2 ranks divide 4 GPUs
    assert set(ranked["num_groups"]) == {4}
    assert len(res.layers) == 6 * 4
    assert res.gpu_loads[("a", "2x2:16", "deepseek")].shape == (4, 4)


def test_holdout_scores_unseen_windows():
    traces = {"a": small_traces()["a"]}
    res = compare(traces, solvers=["deepseek"], topologies="2x2:16", holdout=0.34,
                  progress=False)
    row = res.summary.iloc[0]
    assert not row["in_sample"]
    p = solvers.solve("deepseek", traces["a"].load(slice(0, 2)), Topology(2, 2, 4))
    direct = summarize(score(p, traces["a"].load(slice(2, 3))))
    assert row["step_max_over_mean"] == pytest.approx(direct["step_max_over_mean"])


def test_process_pool_and_dask_give_the_same_table():
    traces = small_traces()
    kw = dict(solvers=["deepseek"], topologies="2x2:16,1x4+4", progress=False)
    inline = compare(traces, **kw).summary[STABLE]
    pool = compare(traces, workers=2, **kw).summary[STABLE]
    pd.testing.assert_frame_equal(inline, pool)
    distributed = pytest.importorskip("distributed", reason="dask extra not installed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                                  dashboard_address=None) as cluster:
        on_dask = compare(traces, scheduler=cluster.scheduler_address, **kw).summary[STABLE]
    pd.testing.assert_frame_equal(inline, on_dask)


def test_tables_and_plots(tmp_path):
    res = compare(small_traces(), solvers=["deepseek"], topologies="2x2:16,2x2:8",
                  progress=False)
    res.write(tmp_path / "r.csv", tmp_path / "r.md", tmp_path / "layers.csv")
    back = pd.read_csv(tmp_path / "r.csv")
    assert len(back) == len(res.summary)
    md = (tmp_path / "r.md").read_text()
    assert "### 2x2:16: `max_over_bound_mean`" in md and "### failed tasks" in md
    assert md.index("`max_over_bound_mean`") < md.index("`step_max_over_mean`")
    assert "| a |" in md
    files = res.plot(tmp_path / "plots")
    assert files and all(f.read_bytes().startswith(PNG) for f in files)
    names = {f.name for f in files}
    assert {"balance_a_2x2_16.png", "heatmap_a_2x2_16.png", "summary_2x2_16.png"} <= names


def test_compare_bad_input():
    traces = small_traces()
    with pytest.raises(InputError, match="unknown solver"):
        compare(traces, solvers=["nope"], progress=False)
    with pytest.raises(InputError, match="unknown dispatch policy"):
        compare(traces, solvers=["deepseek"], policy="nope", progress=False)
    with pytest.raises(TopologyError, match="rdma_gbps must be a positive"):
        compare(traces, solvers=["deepseek"], rdma_gbps=-1, progress=False)
    with pytest.raises(InputError, match="no traces"):
        compare({}, solvers=["deepseek"], progress=False)


@settings(max_examples=30)
@given(pts=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=1, max_size=12))
def test_front_is_the_non_dominated_set(pts):
    x = np.array([p[0] for p in pts], float)
    y = np.array([p[1] for p in pts], float)
    mask = front(x, y)
    for i in range(len(pts)):
        dominated = any(x[j] <= x[i] and y[j] <= y[i] and (x[j] < x[i] or y[j] < y[i])
                        for j in range(len(pts)))
        assert mask[i] == (not dominated)


def test_pareto_sweep(tmp_path):
    from eplb.evaluation.plots import pareto_front

    load = synth.zipf(3, 16, tokens=500, seed=4).load()
    topo = Topology(2, 2, 5)
    df = sweep(load, topo, weights=[0.0, 1.0], num_groups=4, topk_groups=2,
               ilp_time_limit=0.2, ilp_weights=[1.0], ilp_options={"workers": 1})
    labels = set(df["label"])
    assert {"deepseek hierarchical", "deepseek global"} <= labels
    have = set(solvers.available())
    assert ("hierarchical" in labels) == ("hierarchical" in have)
    if "greedy" in have:
        assert df.loc[df["label"] == "greedy", "rdma_weight"].tolist() == [0.0, 1.0]
    if "ilp" in have:
        assert df.loc[df["label"] == "ilp", "rdma_weight"].tolist() == [1.0]
    ok = df[df["status"] == "ok"]
    assert ok["on_front"].any()
    # every point is measured by the traffic model, not by the solver
    p = solvers.solve("deepseek", load, topo, num_groups=4)
    rep = simulate(p, load=load, policy="local_first", num_groups=4, topk_groups=2)
    got = ok.loc[ok["label"] == "deepseek hierarchical", "rdma_bytes"].item()
    assert got == pytest.approx(rep.rdma_bytes.sum())
    out = pareto_front(df, tmp_path / "front.png")
    assert out.read_bytes().startswith(PNG)


def test_every_summary_column_is_defined_in_the_docs():
    from eplb.evaluation.compare import SUMMARY_COLUMNS, TABLES
    from tests.conftest import REPO

    doc = (REPO / "docs" / "evaluation.md").read_text()
    missing = [c for c in SUMMARY_COLUMNS if f"`{c}`" not in doc]
    assert not missing, missing
    assert set(TABLES) <= set(SUMMARY_COLUMNS)
    assert list(TABLES)[0] == "max_over_bound_mean"  # the ratio to the bound comes first
