"""``eplb workload info / synth / convert`` end to end, bad input (one line, exit 2, no file)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eplb.evaluation.serving import workload as W
from tests._cli import run_cli

REPO = Path(__file__).resolve().parents[1]


def _error(*argv, frags=()):
    code, out, err = run_cli(*argv)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("eplb: error: "), err
    for f in frags:
        assert f in err, err
    return err


def test_synth_then_info(tmp_path):
    out_file = tmp_path / "w.parquet"
    code, out, err = run_cli(
        "workload",
        "synth",
        "-n",
        2000,
        "--rate",
        8,
        "--hit-rate",
        0.5,
        "--system-prompts",
        3,
        "--system-prompt-tokens",
        1024,
        "-o",
        out_file,
    )
    assert code == 0, err
    assert "wrote" in out and "(target 0.5)" in out
    w = W.read(out_file)
    assert len(w) == 2000 and abs(w.summary()["prefix_hit_rate"] - 0.5) <= 0.01
    code, out, err = run_cli("workload", "info", out_file)
    assert code == 0, err
    assert "2,000" in out and "prefix-hit rate" in out and "session continuation" in out
    assert out.count("input") >= 2 and "p99" in out
    code, out, _ = run_cli("workload", "info", out_file, "--json")
    doc = json.loads(out)
    assert doc["count"] == 2000 and doc["prefix_hit_rate"] == w.summary()["prefix_hit_rate"]


def test_synth_is_deterministic_and_gamma(tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    for p in (a, b):
        code, _, err = run_cli(
            "workload",
            "synth",
            "-n",
            300,
            "--arrival",
            "gamma",
            "--cv",
            3,
            "--seed",
            5,
            "-o",
            p,
        )
        assert code == 0, err
    assert a.read_bytes() == b.read_bytes()
    code, _, _ = run_cli("workload", "synth", "-n", 300, "--seed", 6, "-o", tmp_path / "c.csv")
    assert (tmp_path / "c.csv").read_bytes() != a.read_bytes()


def test_convert_round_trip_rescale_and_head(tmp_path):
    src = tmp_path / "w.parquet"
    W.write(W.synthesize(400, rate=2, hit_rate=0.4, seed=1), src)
    code, out, err = run_cli("workload", "convert", src, tmp_path / "w.csv")
    assert code == 0, err
    assert W.read(tmp_path / "w.csv").equals(W.read(src))
    assert "meta" in out  # CSV drops meta, and says so
    code, out, err = run_cli(
        "workload", "convert", src, tmp_path / "f.jsonl", "--rate", 10, "--head", 100
    )
    assert code == 0, err
    f = W.read(tmp_path / "f.jsonl")
    assert len(f) == 100 and f.summary()["rate_rps"] == pytest.approx(10, rel=1e-6)
    assert "note: arrivals rescaled" in out and "session" in out
    code, _, err = run_cli(
        "workload",
        "convert",
        src,
        tmp_path / "p.parquet",
        "--speedup",
        2,
        "--poisson",
        "--seed",
        3,
    )
    assert code == 0, err
    assert any("Poisson" in n for n in W.read(tmp_path / "p.parquet").meta["notes"])


def test_real_files(tmp_path, mooncake_jsonl, azure_csv):
    code, out, err = run_cli("workload", "info", mooncake_jsonl)
    assert code == 0, err
    assert "12,031" in out and "(mooncake)" in out
    code, out, err = run_cli("workload", "info", azure_csv)
    assert code == 0, err
    assert "8,819" in out and "no block hashes" in out
    code, out, err = run_cli(
        "workload",
        "convert",
        azure_csv,
        tmp_path / "a.parquet",
        "--speedup",
        4,
    )
    assert code == 0, err
    assert len(W.read(tmp_path / "a.parquet")) == 8819


def test_bad_input_is_one_line_exit_2_and_no_file(tmp_path):
    src = tmp_path / "w.csv"
    W.write(W.synthesize(20, seed=0), src)
    before = src.read_bytes()
    _error("workload", "convert", src, src, frags=["is the input IN"])
    _error("workload", "convert", src, tmp_path / "." / "w.csv", frags=["input file"])
    assert src.read_bytes() == before
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": -1, "output_length": 3}\n')
    out = tmp_path / "out.parquet"
    _error("workload", "convert", bad, out, frags=["input_length", ">= 1"])
    assert not out.exists() and not list(tmp_path.glob(".out.parquet*"))
    _error("workload", "info", tmp_path, frags=["directory"])
    _error("workload", "info", tmp_path / "missing.jsonl", frags=["does not exist"])
    _error("workload", "synth", "-n", 10, "-o", tmp_path / "x.txt", frags=["suffix"])
    _error(
        "workload",
        "synth",
        "-n",
        10,
        "--hit-rate",
        1.5,
        "-o",
        tmp_path / "x.csv",
        frags=["hit_rate"],
    )
    _error("workload", "synth", "-n", 0, "-o", tmp_path / "x.csv", frags=["num_requests"])
    _error(
        "workload",
        "synth",
        "-n",
        10,
        "-o",
        tmp_path / "nodir" / "x.csv",
        frags=["does not exist"],
    )
    _error(
        "workload",
        "convert",
        src,
        tmp_path / "y.csv",
        "--poisson",
        frags=["--poisson needs"],
    )
    assert not (tmp_path / "x.csv").exists() and not (tmp_path / "y.csv").exists()


def test_fifo_via_subprocess_does_not_hang(tmp_path):
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "eplb.cli", "workload", "info", str(fifo)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("eplb: error:") and "FIFO" in proc.stderr
    assert "Traceback" not in proc.stderr
