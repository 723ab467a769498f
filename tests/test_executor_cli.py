"""``eplb execute`` end to end: PASS on valid placements, FAIL (exit 1) on a wrong result,
exit 2 with a clear message on bad input, token-level traces replayed with the model's traffic."""

from __future__ import annotations

import re

import numpy as np
import pytest

from eplb import Topology
from eplb.cli import main
from eplb.io import write_placement
from tests.test_executor import random_placement

TOPO = Topology(2, 2, 3)  # 4 GPUs, 12 slots


@pytest.fixture
def placement_file(tmp_path):
    p = random_placement(np.random.default_rng(0), TOPO, 10, layers=3)
    path = tmp_path / "placement.json"
    write_placement(p, path)
    return path, p


def _field(out: str, name: str) -> str:
    m = re.search(rf"^{re.escape(name)}\s+(.+)$", out, re.M)
    assert m, f"{name!r} not in output:\n{out}"
    return m.group(1).strip()


@pytest.mark.parametrize("policy", ["even", "local_first"])
def test_execute_passes(placement_file, capsys, policy):
    path, _ = placement_file
    rc = main(["execute", str(path), "--layer", "1", "--tokens", "200", "--hidden", "16",
               "--top-k", "3", "--dispatch", policy, "--dtype", "float64"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert _field(out, "check") == "PASS"
    assert "RDMA out MB" in out and re.search(r"^3\s+1\s+\d+", out, re.M)  # GPU 3 on node 1
    err = float(_field(out, "max abs error vs dense").split()[0])
    assert err <= 1e-9


def test_execute_replays_token_trace_with_model_traffic(placement_file, tmp_path, capsys):
    from eplb import traces
    from eplb.evaluation.traffic import simulate

    path, placement = placement_file
    rng = np.random.default_rng(5)
    n, k = 300, 2
    topk = np.stack([np.argsort(rng.random((n, 10)), 1)[:, :k] for _ in range(3)], 1)
    rank = rng.integers(0, TOPO.num_gpus, n).astype(np.int32)
    counts = np.stack([np.bincount(topk[:, i].ravel(), minlength=10) for i in range(3)])[None]
    trace = traces.Trace(counts.astype(float), topk_ids=topk.astype(np.int16), token_rank=rank,
                         meta={"top_k": k})
    tpath = tmp_path / "tokens.npz"
    traces.write_npz(trace, tpath)
    rc = main(["execute", str(path), "--trace", str(tpath), "--layer", "2", "--tokens", "1000",
               "--hidden", "8", "--dispatch", "random", "--seed", "4"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "300 from trace" in out
    report = simulate(placement, topk_ids=topk, token_rank=rank, policy="random", hidden=8,
                      seed=4)
    nv = int(_field(out, "NVLink bytes (dispatch + combine)").split()[0].replace(",", ""))
    rd = int(_field(out, "RDMA bytes (dispatch + combine)").split()[0].replace(",", ""))
    assert (nv, rd) == (report.nvlink_bytes[2], report.rdma_bytes[2])
    assert _field(out, "check") == "PASS"


def test_execute_reports_fail_on_wrong_output(placement_file, capsys, monkeypatch):
    from eplb.executor import kernels

    real = kernels.combine
    monkeypatch.setattr(kernels, "combine", lambda y, w, lo, **kw: real(y, w, lo, **kw) * 1.001)
    path, _ = placement_file
    rc = main(["execute", str(path), "--tokens", "64", "--hidden", "8", "--top-k", "2"])
    out = capsys.readouterr().out
    assert rc == 1
    assert _field(out, "check") == "FAIL"


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--layer", "3"], "--layer 3 is not a layer of the placement; its model layer ids"),
        (["--tokens", "1000000000"], "--tokens 1000000000 --hidden 8 needs"),
        (["--tokens", "0"], "--tokens must be >= 1"),
        (["--top-k", "11"], "top_k 11 exceeds num_experts 10"),
        (["--groups", "3"], "num_groups 3 does not divide num_experts 10"),
    ],
)
def test_execute_bad_input_exits_2(placement_file, capsys, extra, match):
    path, _ = placement_file
    rc = main(["execute", str(path), "--hidden", "8", "--tokens", "16", *extra])
    err = capsys.readouterr().err
    assert rc == 2
    assert match in err and "Traceback" not in err


def test_execute_missing_file_exits_2(tmp_path, capsys):
    assert main(["execute", str(tmp_path / "nope.json")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("hidden", [None, 16])
def test_execute_says_when_the_hidden_size_is_assumed(placement_file, capsys, hidden):
    path, _ = placement_file
    extra = [] if hidden is None else ["--hidden", str(hidden)]
    rc = main(["execute", str(path), "--tokens", "32", "--top-k", "2", *extra])
    row = _field(capsys.readouterr().out, "bytes per element")
    assert rc == 0
    assert f"hidden {hidden or 512}" in row
    assert ("assumed" in row) == (hidden is None)
