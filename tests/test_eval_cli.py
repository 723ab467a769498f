"""CLI end to end: eplb evaluate / compare / replay, and their one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from eplb.cli import main
from eplb.traces import Trace, synth, write_npz
from tests._cli import run_cli

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture()
def files(tmp_path):
    multi = synth.zipf(4, 16, windows=4, tokens=300, top_k=2, seed=1)
    multi = Trace(multi.counts, layer_ids=[3, 4, 5, 6], meta=multi.meta)
    write_npz(multi, tmp_path / "multi.npz")
    rng = np.random.default_rng(2)
    N = 200
    ids = np.stack([np.stack([rng.choice(16, 2, replace=False) for _ in range(4)])
                    for _ in range(N)])
    counts = np.zeros((1, 4, 16))
    for layer in range(4):
        np.add.at(counts[0, layer], ids[:, layer].ravel(), 1)
    tok = Trace(counts, layer_ids=[3, 4, 5, 6], topk_ids=ids, token_rank=rng.integers(0, 4, N),
                meta={"top_k": 2})
    write_npz(tok, tmp_path / "tokens.npz")
    other = synth.zipf(4, 12, windows=1, tokens=100, seed=3)
    write_npz(other, tmp_path / "other.npz")
    np.savez(tmp_path / "empty.npz", counts=np.zeros((0, 4, 16)))
    one = Trace(multi.counts[:1], layer_ids=[3, 4, 5, 6])
    write_npz(one, tmp_path / "one.npz")
    assert main(["solve", str(tmp_path / "multi.npz"), "--topology", "2x2", "--slots", "20",
                 "-o", str(tmp_path / "p.json")]) == 0
    return tmp_path


def error_line(err: str) -> str:
    err = err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("eplb: error: ")
    return err[0]


def test_evaluate_text_json_csv(files, capsys):
    capsys.readouterr()
    assert main(["evaluate", str(files / "p.json"), str(files / "multi.npz"), "-o",
                 str(files / "layers.csv"), "--plot", str(files / "heat.png")]) == 0
    out = capsys.readouterr().out
    assert "step max/mean GPU load" in out and "expected (sources spread evenly)" in out
    assert len(pd.read_csv(files / "layers.csv")) == 4
    assert (files / "heat.png").read_bytes().startswith(PNG)
    assert main(["evaluate", str(files / "p.json"), str(files / "multi.npz"), "--json",
                 "--dispatch", "local_first"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["traffic"]["policy"] == "local_first" and doc["traffic"]["mode"] == "load"
    assert [r["layer"] for r in doc["layers"]] == [3, 4, 5, 6]
    assert doc["balance"]["step_max_over_mean"] >= 1.0


def test_evaluate_token_level_exact(files, capsys):
    capsys.readouterr()
    slots = files / "slots.npy"
    assert main(["evaluate", str(files / "p.json"), str(files / "tokens.npz"), "--json",
                 "--save-slots", str(slots)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["traffic"]["mode"] == "tokens"
    saved = np.load(slots, allow_pickle=False)
    assert saved.shape == (200, 4, 2)


@pytest.mark.parametrize("case", ["experts", "layers", "empty", "dispatch", "bandwidth"])
def test_evaluate_bad_input_one_line(files, case):
    trace = {"experts": "other.npz", "layers": "multi.npz", "empty": "empty.npz"}.get(case,
                                                                                      "multi.npz")
    argv = ["evaluate", str(files / "p.json"), str(files / trace)]
    if case == "layers":
        p = json.loads((files / "p.json").read_text())
        p["layer_ids"] = [10, 11, 12, 13]
        (files / "q.json").write_text(json.dumps(p))
        argv[1] = str(files / "q.json")
    if case == "dispatch":
        argv += ["--dispatch", "fastest"]
    if case == "bandwidth":
        argv += ["--rdma-gbps", "0"]
    rc, _, err = run_cli(*argv)
    assert rc == 2
    line = error_line(err)
    expect = {"experts": "16 experts per layer but the trace has 12",
              "layers": "no rows for trace layers 3, 4, 5, 6",
              "empty": "needs >= 1 window", "dispatch": "unknown dispatch policy 'fastest'",
              "bandwidth": "--rdma-gbps: 0 must be a finite bandwidth > 0 GB/s"}[case]
    assert expect in line


def test_compare_cli(files, capsys):
    capsys.readouterr()
    argv = ["compare", str(files / "multi.npz"), str(files / "other.npz"), "--solvers",
            "deepseek", "--topologies", "2x2:16,1x4+4", "--quiet", "-o", str(files / "r.csv"),
            "--markdown", str(files / "r.md"), "--plot", str(files / "plots")]
    assert main(argv) == 0
    df = pd.read_csv(files / "r.csv")
    assert len(df) == 4 and (df["status"] == "ok").all()
    assert "### 2x2:16" in (files / "r.md").read_text()
    pngs = list((files / "plots").glob("*.png"))
    assert pngs and all(p.read_bytes().startswith(PNG) for p in pngs)
    assert main(["compare", str(files / "multi.npz"), "--solvers", "deepseek", "--quiet",
                 "--topologies", "2x2:16", "--plot", str(files / "pp"), "--pareto",
                 "--pareto-weights", "0,1", "--ilp-limit", "0"]) == 0
    assert (files / "pp" / "pareto.csv").exists()
    assert (files / "pp" / "pareto_multi_2x2_16.png").read_bytes().startswith(PNG)


@pytest.mark.parametrize("argv,expect", [
    (["--nvlink-gbps", "0"], "--nvlink-gbps: 0 must be a finite bandwidth > 0 GB/s"),
    (["--dispatch", "nope"], "unknown dispatch policy 'nope'"),
    (["--topologies", "4x8:100"], "not a multiple of 32 GPUs; use 128"),
    (["--solvers", "nope"], "unknown solver 'nope'"),
    (["--topologies", "2x2:8"], "every run failed; first: InfeasibleError"),
])
def test_compare_bad_input(files, argv, expect):
    rc, _, err = run_cli("compare", str(files / "multi.npz"), "--quiet", *argv)
    assert rc == 2
    assert expect in error_line(err)


def test_replay_cli(files, capsys):
    capsys.readouterr()
    assert main(["replay", str(files / "multi.npz"), "--solver", "deepseek", "--interval", "2",
                 "--history", "1", "--topology", "2x2", "--slots", "20", "--quiet", "-o",
                 str(files / "replay.csv"), "--plot", str(files / "replay.png"),
                 "--dispatch", "even"]) == 0
    out = capsys.readouterr().out
    assert "rebalances              1" in out
    df = pd.read_csv(files / "replay.csv")
    assert df["rebalanced"].tolist() == [False, False, True, False]
    assert (files / "replay.png").read_bytes().startswith(PNG)
    assert main(["replay", str(files / "one.npz"), "--solver", "deepseek", "--quiet"]) == 2
    assert "needs at least 2" in error_line(capsys.readouterr().err)
    assert main(["replay", str(files / "multi.npz"), "--solver", "deepseek", "--quiet",
                 "--interval", "0"]) == 2
    assert "interval must be a positive integer" in error_line(capsys.readouterr().err)


def test_compare_real_deepseek_file(deepseek_jsons, tmp_path):
    path = deepseek_jsons[0]
    assert main(["compare", str(path), "--solvers", "deepseek", "--topologies", "4x8:288",
                 "--groups", "8", "--quiet", "-o", str(tmp_path / "r.csv")]) == 0
    df = pd.read_csv(tmp_path / "r.csv")
    assert df.loc[0, "status"] == "ok" and df.loc[0, "variant"] == "hierarchical"
    assert 1.0 <= df.loc[0, "step_max_over_mean"] < 1.5


def test_compare_says_once_where_a_contract_policy_fell_back_and_quiet_is_quiet(
    tmp_path, capsys
):
    """Issue 22: 2 groups on 4 nodes cannot keep the contract: ``hierarchical`` and ``ilp
    hierarchical=True`` place globally (DeepSeek's rule), and compare prints one line per
    solver and topology saying so (and the ``fallback`` column); ``--quiet`` prints nothing
    of ilp's layer progress."""
    np.save(tmp_path / "l.npy", np.random.default_rng(0).integers(1, 100, (1, 16)).astype(float))
    out = tmp_path / "c.csv"
    assert main(["compare", str(tmp_path / "l.npy"), "--topologies", "4x1:24,2x2:24",
                 "--groups", "2", "--solvers", "hierarchical,ilp", "--option",
                 "ilp.hierarchical=true", "--time-limit", "1", "--workers", "1", "--quiet",
                 "-o", str(out)]) == 0
    cap = capsys.readouterr()
    said = [ln for ln in cap.err.splitlines() if "fell back to the global policy" in ln]
    assert sorted(ln.split(":")[0] for ln in said) == ["hierarchical on 4x1", "ilp on 4x1"]
    assert "ilp layers" not in cap.err + cap.out
    rows = pd.read_csv(out, dtype={"fallback": str})
    fell = rows[rows["fallback"].fillna("") != ""]
    assert set(zip(fell["solver"], fell["topology"], strict=True)) == {("hierarchical", "4x1:24"),
                                                          ("ilp", "4x1:24")}
    assert (rows[rows["topology"] == "2x2:24"]["variant"] == "hierarchical").all()


def test_evaluate_lp_progress_and_quiet(files, capsys):
    """Issue 22: ``--dispatch lp`` solves one LP per layer; its progress goes to stderr (one
    update per layer, the stdout table unchanged) and ``--quiet`` silences it."""
    argv = ["evaluate", str(files / "p.json"), str(files / "multi.npz"), "--dispatch", "lp"]
    capsys.readouterr()
    assert main(argv) == 0
    shown = capsys.readouterr()
    assert "lp dispatch" in shown.err and "4/4" in shown.err
    assert main([*argv, "--quiet"]) == 0
    quiet = capsys.readouterr()
    assert quiet.err == "" and quiet.out == shown.out


def test_evaluate_lp_heavy_tailed_dump_prints_no_nan(tmp_path, capsys):
    """``evaluate --dispatch lp`` on a dump without top_k (8 assumed) whose hottest experts
    hold more than 1/8 of a layer's picks printed ``nan`` RDMA bytes and all-to-all time."""
    rng = np.random.default_rng(0)
    counts = rng.lognormal(5, 2, (48, 160)).round().astype(int)
    (tmp_path / "d.json").write_text(json.dumps({"logical_count": counts.tolist()}))
    assert main(["solve", str(tmp_path / "d.json"), "--topology", "2x8", "--slots", "176",
                 "--solver", "greedy", "-o", str(tmp_path / "m.json")]) == 0
    capsys.readouterr()
    with np.errstate(all="raise"):
        assert main(["evaluate", str(tmp_path / "m.json"), str(tmp_path / "d.json"),
                     "--dispatch", "lp", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out.lower()
    rdma = next(ln for ln in out.splitlines() if ln.startswith("RDMA bytes"))
    assert float(rdma.split()[2].replace(",", "")) > 0, rdma


def test_replay_and_execute_counts_use_thousands_separators(tmp_path, capsys):
    """Issue 22, one number format: the replicas moved in all and the bytes moved (replay) and
    the copies per phase (execute) print thousands separators like every other count."""
    trace = synth.drift(16, 64, windows=3, tokens=4096, rate=0.5, seed=0)
    write_npz(trace, tmp_path / "drift.npz")
    assert main(["replay", str(tmp_path / "drift.npz"), "--topology", "2x4", "--slots", "128",
                 "--solver", "greedy", "--interval", "1", "--history", "1", "--quiet"]) == 0
    row = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("replicas moved"))
    moved = row.split()[2]
    assert int(moved.replace(",", "")) >= 1000 and "," in moved, row
    assert main(["solve", str(tmp_path / "drift.npz"), "--topology", "2x4", "--slots", "128",
                 "-o", str(tmp_path / "p.json")]) == 0
    capsys.readouterr()
    assert main(["execute", str(tmp_path / "p.json"), "--trace", str(tmp_path / "drift.npz"),
                 "--tokens", "4096", "--hidden", "64"]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines()
            if ln.startswith(("NVLink bytes", "RDMA bytes"))]
    copies = [int(ln.split("(")[-1].split()[0].replace(",", "")) for ln in rows]
    assert rows and all("," in ln.split("(")[-1] for ln, c in zip(rows, copies, strict=True)
                        if c >= 1000)
    assert max(copies) >= 1000, rows


def test_evaluate_says_when_top_k_is_assumed(files, capsys):
    """Issue 22: a trace that records no top_k (an SGLang dump, a per-rank folder) is read as
    top-8; the load row says the top-k was assumed and how to give it, a given one is not."""
    bare = synth.zipf(4, 16, windows=1, tokens=300, top_k=2, seed=1)
    write_npz(Trace(bare.counts, layer_ids=[3, 4, 5, 6]), files / "bare.npz")
    assert Trace(bare.counts).meta.get("top_k") is None
    capsys.readouterr()
    assert main(["evaluate", str(files / "p.json"), str(files / "bare.npz")]) == 0
    load = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("load"))
    assert "(assumed: the trace records no top_k; pass --top-k K)" in load
    assert main(["evaluate", str(files / "p.json"), str(files / "bare.npz"), "--top-k", "2"]) == 0
    load = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("load"))
    assert "top-2" in load and "assumed" not in load


def test_evaluate_says_when_the_hidden_size_is_assumed(files, capsys):
    """Without --hidden the traffic figures use DeepSeek-V3's 7168; the traffic row says so
    and the JSON's ``assumed`` holds it; a given --hidden (even 7168) is not flagged."""
    args = ["evaluate", str(files / "p.json"), str(files / "multi.npz")]

    def traffic_row(extra):
        capsys.readouterr()
        assert main([*args, *extra]) == 0
        return next(ln for ln in capsys.readouterr().out.splitlines()
                    if ln.startswith("traffic"))

    row = traffic_row([])
    assert "7168 x 1 B dispatch" in row
    assert "(hidden 7168 assumed: DeepSeek-V3's; pass --hidden H for another model)" in row
    for given in ("7168", "2048"):
        row = traffic_row(["--hidden", given])
        assert f"{given} x 1 B dispatch" in row and "assumed" not in row
    docs = {}
    for extra in ([], ["--hidden", "2048"]):
        assert main([*args, *extra, "--json"]) == 0
        docs[tuple(extra)] = json.loads(capsys.readouterr().out)
    plain, given = docs[()], docs[("--hidden", "2048")]
    assert plain["assumed"] == {"hidden": 7168} and plain["traffic"]["hidden"] == 7168
    assert given["assumed"] == {} and given["traffic"]["hidden"] == 2048
    # the assumption matters: bytes scale with the hidden size
    assert given["traffic"]["rdma_bytes"] == pytest.approx(
        plain["traffic"]["rdma_bytes"] * 2048 / 7168)
    # a trace without top_k: both assumptions are listed
    bare = synth.zipf(4, 16, windows=1, tokens=300, top_k=2, seed=1)
    write_npz(Trace(bare.counts, layer_ids=[3, 4, 5, 6]), files / "bare.npz")
    assert main(["evaluate", str(files / "p.json"), str(files / "bare.npz"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["assumed"] == {"top_k": 8, "hidden": 7168}
    # the library records it (the CLI prints Evaluation.assumed)
    from eplb import traces
    from eplb.evaluation.evaluate import evaluate
    from eplb.io import read_placement

    p, t = read_placement(files / "p.json"), traces.read(files / "multi.npz")
    assert evaluate(p, t).assumed == {"hidden": 7168}
    assert evaluate(p, t, hidden=7168).assumed == {}
