"""The library functions behind the CLI verbs (issue 19): each gives what its verb prints.

`eplb.evaluation.evaluate`, `eplb.executor.run` / `eplb.evaluation.execute`,
`eplb.evaluation.solve`, `eplb.evaluation.solver_options`, `eplb.evaluation.pareto.sweep_traces`,
`eplb.evaluation.replay.replay_topology`, `eplb.traces.generate`, `eplb.traces.summary`,
`eplb.evaluation.plots.load_heatmap`, `eplb.atomic.atomic_directory`; and the raisers that
used to leak ``TypeError``/``ValueError`` (the CLI no longer translates them).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest

from eplb import Topology, solvers, traces
from eplb.cli import main
from eplb.errors import EplbError, InputError, TraceError
from eplb.io import read_placement, write_placement
from tests.test_executor import random_placement

PNG = b"\x89PNG\r\n\x1a\n"


def _field(out: str, name: str) -> str:
    m = re.search(rf"^{re.escape(name)}\s+(.+)$", out, re.M)
    assert m, f"{name!r} not in output:\n{out}"
    return m.group(1).strip()


@pytest.fixture()
def files(tmp_path):
    trace = traces.synth.zipf(4, 16, windows=3, tokens=300, top_k=2, seed=1,
                              layer_ids=[3, 4, 5, 6], meta={"num_groups": 4})
    traces.write(trace, tmp_path / "t.npz")
    tok = traces.synth.token_level(trace, num_tokens=200, num_groups=4, topk_groups=2,
                                   top_k=2, num_ranks=4)
    traces.write(tok, tmp_path / "tok.npz")
    assert main(["solve", str(tmp_path / "t.npz"), "--topology", "2x2", "--slots", "20",
                 "--solver", "greedy", "-o", str(tmp_path / "p.json")]) == 0
    return tmp_path


# ----------------------------------------------------------------- evaluate
@pytest.mark.parametrize(("trace", "extra", "kw"), [
    ("t.npz", [], {}),
    ("tok.npz", ["--dispatch", "local_first"], {"policy": "local_first"}),
    ("tok.npz", ["--windows", "0", "--dispatch", "random", "--seed", "3"],
     {"windows": [0], "policy": "random", "seed": 3}),
    ("t.npz", ["--groups", "4", "--topk-groups", "2", "--hidden", "512"],
     {"num_groups": 4, "topk_groups": 2, "hidden": 512}),
])
def test_evaluate_is_what_the_cli_prints(files, capsys, trace, extra, kw):
    from eplb.evaluation.evaluate import evaluate

    capsys.readouterr()
    p, t = files / "p.json", files / trace
    assert main(["evaluate", str(p), str(t), "--json", *extra]) == 0
    printed = json.loads(capsys.readouterr().out)
    ev = evaluate(read_placement(p), traces.read(t), **kw)
    doc = json.loads(json.dumps({"placement": str(p), "trace": str(t), **ev.to_dict()}))
    assert printed == doc
    assert main(["evaluate", str(p), str(t), *extra]) == 0
    out = capsys.readouterr().out
    assert _field(out, "GPU picks as dispatched").startswith(
        f"step max/mean {ev.dispatched_max_over_mean:.4f} ")
    gt = ev.traffic.gpu_tokens
    assert ev.dispatched_max_over_mean == pytest.approx(gt.max(1).sum() / gt.mean(1).sum())
    per = ev.per_token_layer
    assert per["rdma_bytes"] == pytest.approx(ev.totals["rdma_bytes"] / ev.layer_tokens.sum())


def test_evaluate_windows_and_token_source_refused(files):
    from eplb.evaluation.evaluate import evaluate

    with pytest.raises(InputError, match="windows apply to counts"):
        evaluate(read_placement(files / "p.json"), traces.read(files / "tok.npz"),
                 source="tokens", windows=[0])


# ----------------------------------------------------------------- execute
TOPO = Topology(2, 2, 3)


@pytest.fixture()
def placement_file(tmp_path):
    p = random_placement(np.random.default_rng(0), TOPO, 10, layers=3)
    write_placement(p, tmp_path / "placement.json")
    return tmp_path / "placement.json"


def test_execute_is_what_the_cli_prints(placement_file, capsys):
    from eplb.executor.run import execute

    capsys.readouterr()
    argv = ["execute", str(placement_file), "--layer", "1", "--tokens", "200", "--hidden",
            "16", "--top-k", "3", "--dispatch", "local_first", "--dtype", "float64"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    rep = execute(read_placement(placement_file), layer=1, num_tokens=200, hidden=16, top_k=3,
                  policy="local_first", dtype="float64")
    assert rep.passed and rep.routing == "router" and rep.row == 1
    assert _field(out, "check") == "PASS"
    assert _field(out, "max abs error vs dense") == (
        f"{rep.max_abs_error:.3e} (tolerance {rep.tolerance:.1e})")
    nv = int(_field(out, "NVLink bytes (dispatch + combine)").split()[0].replace(",", ""))
    assert nv == rep.stats.nvlink_bytes
    assert _field(out, "max / mean GPU picks") == f"{rep.stats.max_over_mean:.4f}"


def test_execute_trace_replays_and_biases(placement_file, tmp_path, capsys):
    from eplb.evaluation.execute import execute_trace
    from eplb.executor.run import execute

    rng = np.random.default_rng(5)
    n, k = 300, 2
    topk = np.stack([np.argsort(rng.random((n, 10)), 1)[:, :k] for _ in range(3)], 1)
    rank = rng.integers(0, TOPO.num_gpus, n).astype(np.int32)
    counts = np.stack([np.bincount(topk[:, i].ravel(), minlength=10) for i in range(3)])[None]
    trace = traces.Trace(counts.astype(float), topk_ids=topk.astype(np.int16), token_rank=rank,
                         meta={"top_k": k})
    traces.write_npz(trace, tmp_path / "tok.npz")
    placement = read_placement(placement_file)
    capsys.readouterr()
    assert main(["execute", str(placement_file), "--trace", str(tmp_path / "tok.npz"),
                 "--layer", "2", "--tokens", "1000", "--hidden", "8", "--dispatch", "random",
                 "--seed", "4"]) == 0
    out = capsys.readouterr().out
    rep = execute_trace(placement, trace, layer=2, num_tokens=1000, hidden=8, policy="random",
                        seed=4)
    assert rep.routing == "picks" and rep.num_tokens == n and rep.layer.top_k == k
    rd = int(_field(out, "RDMA bytes (dispatch + combine)").split()[0].replace(",", ""))
    assert rd == rep.stats.rdma_bytes
    # the same run from the core, with the layer's picks given as arrays
    core = execute(placement, layer=2, num_tokens=1000, hidden=8, policy="random", seed=4,
                   topk_ids=topk[:, 2], token_rank=rank)
    assert core.stats.rdma_bytes == rep.stats.rdma_bytes
    assert core.max_abs_error == rep.max_abs_error
    with pytest.raises(InputError, match="disagrees"):
        execute_trace(placement, trace, top_k=3, hidden=8)
    # a counts trace biases the router towards its popularity
    counts_only = traces.Trace(counts.astype(float), meta={"top_k": k})
    biased = execute_trace(placement, counts_only, num_tokens=64, hidden=8)
    assert biased.routing == "biased" and biased.layer.top_k == k and biased.passed
    share = counts[0, 0] / counts[0, 0].sum()
    assert np.allclose(biased.layer.router_bias, np.log(np.maximum(share, 1e-12)), atol=1e-6)


def test_execute_helpers():
    from eplb.executor.run import default_row, popularity_bias, row_of, tolerance

    p = random_placement(np.random.default_rng(1), TOPO, 10, layers=3)
    assert default_row(p, [2, 1]) == 1
    assert row_of(p, 2) == 2
    with pytest.raises(InputError, match="layer 7 is not a layer of the placement"):
        row_of(p, 7)
    ref = np.full((2, 3), 4.0)
    assert tolerance(np.float32, ref) == pytest.approx(4e-5)
    assert tolerance(np.float64, np.zeros((0, 3))) == 1e-9
    assert popularity_bias([0, 1, 1]).tolist() == pytest.approx(
        [np.log(1e-12), np.log(0.5), np.log(0.5)])


# ----------------------------------------------------------------- solve
@pytest.mark.parametrize("extra", [[], ["--windows", "0,2"], ["--windows", "1:3", "--ema", "0.5"],
                                   ["--groups", "4", "--solver", "hierarchical"]])
def test_solve_trace_is_what_the_cli_writes(files, capsys, extra):
    from eplb.evaluation.solve import solve_trace

    t = files / "t.npz"
    capsys.readouterr()
    assert main(["solve", str(t), "--topology", "2x2", "--slots", "20", "-o",
                 str(files / "q.json"), *extra]) == 0
    out = capsys.readouterr().out
    opts = dict(zip(extra[::2], extra[1::2], strict=True))
    res = solve_trace(opts.get("--solver", "deepseek"), traces.read(t),
                      Topology.parse("2x2", 20), windows=opts.get("--windows"),
                      ema=float(opts["--ema"]) if "--ema" in opts else None,
                      num_groups=int(opts["--groups"]) if "--groups" in opts else None, path=t)
    written = read_placement(files / "q.json")
    assert np.array_equal(written.phy2log, res.placement.phy2log)
    assert written.meta["source"] == res.placement.meta["source"]
    assert written.meta["metrics"] == res.placement.meta["metrics"]
    assert res.placement.meta["source"]["windows"] == opts.get("--windows")
    b = res.balance
    assert _field(out, "max / mean GPU load") == (
        f"mean {b['max_over_mean_mean']:.4f}  worst {b['max_over_mean_worst']:.4f} over 4 layers")


def test_solve_trace_records_a_list_selection(files):
    from eplb.evaluation.solve import file_sha256, solve_trace

    res = solve_trace("greedy", traces.read(files / "t.npz"), Topology.parse("2x2", 20),
                      windows=slice(0, 2))
    assert res.placement.meta["source"] == {"num_model_layers": None, "windows": [0, 1],
                                            "ema": None}
    assert res.windows.tolist() == [0, 1] and res.num_windows == 3
    assert len(file_sha256(files / "t.npz")) == 64


# ----------------------------------------------------------------- compare
def test_split_options():
    from eplb.evaluation.solver_options import split_options

    assert split_options({"budget": 5}, ["deepseek", "greedy"]) == {"deepseek": {},
                                                                    "greedy": {"budget": 5}}
    assert split_options({"greedy.budget": 3, "rdma_weight": 0.5},
                         ["greedy", "greedy_traffic"]) == {
        "greedy": {"budget": 3, "rdma_weight": 0.5}, "greedy_traffic": {"rdma_weight": 0.5}}
    with pytest.raises(InputError, match="has no option 'bogus'"):
        split_options({"bogus": 1}, ["deepseek", "greedy"])
    with pytest.raises(InputError, match="not among the solvers"):
        split_options({"ilp.threads": 2}, ["greedy"])
    with pytest.raises(InputError, match="budget must be an integer"):
        split_options({"greedy.budget": "x"}, ["greedy"])


def test_sweep_traces_is_the_cli_pareto_table(files, capsys):
    from eplb.evaluation.compare import CompareSpec
    from eplb.evaluation.pareto import sweep_traces

    assert main(["compare", str(files / "t.npz"), "--solvers", "deepseek", "--quiet",
                 "--topologies", "2x2:20", "--plot", str(files / "pp"), "--pareto",
                 "--pareto-weights", "0,1", "--ilp-limit", "0"]) == 0
    csv = pd.read_csv(files / "pp" / "pareto.csv")
    # the CLI's --pareto-dispatch default is local_first
    frames = sweep_traces({"t": traces.read(files / "t.npz")},
                          CompareSpec(topologies="2x2:20", policy="local_first"),
                          weights=[0, 1], ilp_time_limit=0)
    assert len(frames) == 1 and set(frames[0][["trace", "topology"]].itertuples(index=False)) \
        == {("t", "2x2:20")}
    got = pd.concat(frames, ignore_index=True)
    cols = [c for c in csv.columns if c != "solve_seconds"]
    pd.testing.assert_frame_equal(csv[cols], got[cols], check_dtype=False)


def test_sweep_traces_reads_its_compare_spec(files):
    """`sweep_traces` takes compare's `CompareSpec` (issue 32 part 5): its dispatch policy,
    bandwidths and traffic sizes reach the traffic model; anything else is one error."""
    from eplb.evaluation.compare import CompareSpec
    from eplb.evaluation.pareto import sweep_traces

    tr = {"tok": traces.read(files / "tok.npz")}

    def sweep(**spec):
        (df,) = sweep_traces(tr, CompareSpec(topologies="2x2:20", **spec), weights=[0.0],
                             ilp_time_limit=0)
        return df.set_index("label")

    base = sweep(policy="local_first")
    assert set(base["topology"]) == {"2x2:20"} and (base["status"] == "ok").all()
    # local_first keeps a pick on its node where a replica is there; even does not look
    assert (sweep(policy="even")["rdma_bytes"] >= base["rdma_bytes"]).all()
    assert (sweep(policy="even")["rdma_bytes"] > base["rdma_bytes"]).any()
    # twice the hidden size: twice the bytes; half the RDMA bandwidth: more all-to-all time
    wide = sweep(policy="local_first", traffic={"hidden": 2 * 7168})
    np.testing.assert_allclose(wide["rdma_bytes"], 2 * base["rdma_bytes"])
    slow = sweep(policy="local_first", rdma_gbps=25.0)
    assert (slow["alltoall_seconds"] > base["alltoall_seconds"]).all()
    pd.testing.assert_series_equal(slow["rdma_bytes"], base["rdma_bytes"])
    with pytest.raises(InputError, match="spec must be a CompareSpec"):
        sweep_traces(tr, ["2x2:20"])
    with pytest.raises(InputError, match="unknown dispatch policy 'nope'"):
        CompareSpec(topologies="2x2:20", policy="nope")


@pytest.mark.parametrize("argv,expect", [
    (["--dispatch", "nope"], "unknown dispatch policy 'nope'"),
    (["--pareto-dispatch", "duplicate"], "dispatch policy 'duplicate' splits each micro-batch"),
    (["--holdout", "1"], "holdout must be in [0, 1), got 1.0"),
    (["--topologies", "4y8"], "topology '4y8' is not NxG:SLOTS"),
])
def test_compare_cli_checks_its_spec_before_reading_traces(files, monkeypatch, argv, expect):
    """`eplb compare` checks every setting once, by building its `CompareSpec` (and the Pareto
    sweep's), before any trace is read (issue 32 part 5)."""
    from tests._cli import run_cli

    def no_read(*a, **k):
        raise AssertionError("a trace was read before the settings were checked")

    monkeypatch.setattr(traces, "read", no_read)
    rc, _, err = run_cli("compare", files / "t.npz", "--quiet", *argv)
    assert rc == 2 and err.startswith("eplb: error: ") and expect in err, err


# ----------------------------------------------------------------- replay
def test_replay_topology_is_the_cli_default(files, capsys):
    from eplb.evaluation.replay import replay_topology

    capsys.readouterr()
    assert main(["replay", str(files / "t.npz"), "--topology", "3x1", "--quiet"]) == 0
    topo = replay_topology(16, "3x1")
    assert topo.num_slots == 21  # 16 experts rounded up to 3 GPUs, plus one slot per GPU
    assert _field(capsys.readouterr().out, "topology") == (
        "3 nodes x 1 GPUs x 7 slots = 21 slots")
    assert replay_topology(16).num_gpus == 32
    assert replay_topology(16, "2x2x5").num_slots == 20


# ----------------------------------------------------------------- trace
def test_generate_is_what_trace_synth_writes(tmp_path, capsys):
    from eplb.traces.generate import generate

    assert main(["trace", "synth", "zipf", "--layers", "3", "--experts", "8", "--windows", "2",
                 "--first-layer", "5", "--param", "skew=[0.8,1.2]", "-o",
                 str(tmp_path / "z.npz")]) == 0
    written = traces.read(tmp_path / "z.npz")
    made = generate("zipf", first_layer=5, num_layers=3, num_experts=8, windows=2,
                    skew=[0.8, 1.2], seed=0)
    assert np.array_equal(written.counts, made.counts)
    assert written.layer_ids.tolist() == [5, 6, 7]
    with pytest.raises(InputError, match="zipf does not take bogus"):
        generate("zipf", bogus=1)
    with pytest.raises(InputError, match="first_layer does not apply to calibrated"):
        generate("calibrated", first_layer=3)
    with pytest.raises(InputError, match="num_layers must be a positive integer"):
        generate("zipf", first_layer=2, num_layers="x")


def test_trace_info_figures(files, capsys):
    from eplb.traces.summary import picks_spread, skew_overview, skew_table

    trace = traces.read(files / "t.npz")
    capsys.readouterr()
    assert main(["trace", "info", str(files / "t.npz")]) == 0
    out = capsys.readouterr().out
    per = picks_spread(trace.counts)
    assert _field(out, "picks per window-layer") == (
        f"min {per['min']:.0f}  median {per['median']:.0f}  max {per['max']:.0f}")
    over = skew_overview(skew_table(trace.load(), trace.layer_ids))
    assert list(over.index) == ["median", "max"]
    row = re.search(r"^max\s+(.+)$", out, re.M).group(1).split()
    assert row[0] == f"{over.loc['max', 'max_over_mean']:.2f}"


def test_load_heatmap(tmp_path):
    from eplb.evaluation.plots import load_heatmap

    load = np.arange(12.0).reshape(3, 4)
    path = load_heatmap(load, [3, 4, 5], tmp_path / "h.png", title="t")
    assert path.read_bytes().startswith(PNG)
    with pytest.raises(InputError, match="--plot x.bogus: Format 'bogus' is not supported"):
        load_heatmap(load, [3, 4, 5], "x.bogus", what="--plot")


# ----------------------------------------------------------------- atomic folders
def test_atomic_directory(tmp_path):
    from eplb.atomic import MANIFEST, atomic_directory

    out = tmp_path / "run"
    with atomic_directory(out) as tmp:  # an earlier run: its files are listed in MANIFEST
        (tmp / "old.txt").write_text("old")
    with pytest.raises(RuntimeError), atomic_directory(out) as tmp:
        (tmp / "new.txt").write_text("new")
        raise RuntimeError("interrupted")
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "old.txt"]
    with atomic_directory(out) as tmp:
        (tmp / "new.txt").write_text("new")
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # no temporary folder left


# ----------------------------------------------------------------- raisers fixed
def test_ilp_threads_beyond_32_bits_is_an_input_error():
    load = np.arange(16.0).reshape(2, 8) + 1
    for name in ("ilp", "ilp_weighted"):
        with pytest.raises(InputError, match=rf"{name}: option threads must be an integer >= 1 "
                                             r"and <= 2147483647, got 2147483648"):
            solvers.solve(name, load, Topology.parse("2x2", 12), threads=2**31, time_limit=1)


@pytest.mark.parametrize(("kind", "kw", "match"), [
    ("calibrated", {"model": [1]}, "model must be a string"),
    ("calibrated", {"phase": ["all"]}, "phase must be a string"),
    ("calibrated", {"meta": "x"}, "meta must be a dict"),
    ("token_level", {"meta": [1]}, "meta must be a dict"),
    ("token_level", {"layer_ids": 5}, "layer_ids must be a list of 2 model layer ids"),
    ("token_level", {"target": object()}, "target must be a Trace"),
])
def test_synth_junk_is_a_trace_error(kind, kw, match):
    args = {"windows": 1, "tokens": 64} if kind == "calibrated" else {
        "target": traces.synth.zipf(2, 16, tokens=100, top_k=2), "num_tokens": 32,
        "num_groups": 4, "topk_groups": 2, "top_k": 2}
    with pytest.raises(TraceError, match=match):
        getattr(traces.synth, kind)(**{**args, **kw})
    assert issubclass(TraceError, EplbError)
