"""`eplb solve` end to end in a subprocess: every format written, read back, validated;
bad input exits 2 with one line and leaves no file."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from eplb import Topology, traces
from eplb.io import read_placement
from tests.conftest import BUNDLED

SAMPLE = BUNDLED / "zipf-58x256.npz"


def eplb(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "eplb.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


def test_version_and_help():
    r = eplb("--version")
    assert r.returncode == 0 and r.stdout.startswith("eplb ")
    r = eplb("solve", "--help")
    assert r.returncode == 0 and "--topology" in r.stdout and "--slots" in r.stdout


@pytest.mark.parametrize(
    ("fmt", "name"),
    [("native", "p.json"), ("npz", "p.npz"), ("sglang", "sg.json"), ("trtllm", "lb.yaml")],
)
def test_solve_writes_each_format(tmp_path, fmt, name):
    out = tmp_path / name
    r = eplb(
        "solve",
        SAMPLE,
        "--topology",
        "4x8",
        "--slots",
        "288",
        "--groups",
        "8",
        "--format",
        fmt,
        "-o",
        out,
    )
    assert r.returncode == 0, r.stderr
    assert "balancedness" in r.stdout and "hierarchical" in r.stdout
    topo = Topology(4, 8, 9)
    p = read_placement(out, topology=topo, num_experts=256)
    trace = traces.read(SAMPLE)
    if fmt == "sglang":
        assert p.num_layers == trace.meta["num_model_layers"]  # all model layers
        rows = p.phy2log[trace.layer_ids]
    else:
        rows = p.phy2log
        np.testing.assert_array_equal(p.layer_ids, trace.layer_ids)
    from eplb import solvers
    want = solvers.solve("deepseek", trace.load(), topo, num_groups=8)
    np.testing.assert_array_equal(rows, want.phy2log)
    if fmt in ("native", "npz"):
        assert p.meta["solver"]["name"] == "deepseek"
        assert p.meta["source"]["sha256"]
        bal = p.meta["metrics"]["balancedness_mean"]
        assert f"mean {bal:.4f}" in r.stdout


def test_summary_reports_the_numbers_it_wrote(tmp_path):
    out = tmp_path / "p.json"
    r = eplb("solve", SAMPLE, "--topology", "18x8", "--slots", "288", "-o", out)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    m = doc["metrics"]
    assert f"worst {m['max_over_mean_worst']:.4f}" in r.stdout
    assert "global" in r.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ["--topology", "4x8", "--slots", "287"],
            "slots 287 is not a multiple of 32 GPUs; use 288",
        ),
        (["--topology", "4x8", "--slots", "224"], "224 slots cannot hold 256 experts"),
        (
            ["--topology", "4x8", "--slots", "288", "--groups", "12", "--solver", "greedy"],
            "--groups 12 does not divide the 256 experts",
        ),
        (["--topology", "4x8", "--slots", "288", "--solver", "magic"], "unknown solver 'magic'"),
        (["--topology", "4by8", "--slots", "288"], "not NODESxGPUS"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_no_file(tmp_path, args, needle):
    out = tmp_path / "p.json"
    r = eplb("solve", SAMPLE, *args, "-o", out)
    assert r.returncode == 2
    assert needle in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_bad_load_files(tmp_path):
    bad = tmp_path / "nan.json"
    bad.write_text(json.dumps({"logical_count": [[1.0, float("nan")]]}).replace("NaN", "NaN"))
    r = eplb("solve", bad, "--topology", "1x2", "--slots", "2", "-o", tmp_path / "p.json")
    assert r.returncode == 2 and "finite" in r.stderr and "Traceback" not in r.stderr
    r = eplb("solve", tmp_path / "missing.npz", "--topology", "1x2", "--slots", "2")
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = eplb("solve", SAMPLE, "--topology", "4x8", "--slots", "288", "-o", tmp_path / "p.txt")
    assert r.returncode == 2 and "cannot tell the placement format" in r.stderr


def test_solves_real_sglang_counts(deepseek_jsons, tmp_path):
    out = tmp_path / "sg.json"
    r = eplb(
        "solve",
        deepseek_jsons[0],
        "--topology",
        "18x8",
        "--slots",
        "288",
        "--groups",
        "8",
        "--format",
        "sglang",
        "-o",
        out,
    )
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["physical_to_logical_map"]
    assert len(rows) == 61 and all(len(row) == 288 for row in rows)
