"""`eplb simulate`: outputs, all-or-nothing output folder, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from eplb.evaluation import serving
from eplb.evaluation.serving.config import EplbConfig, UnitConfig
from tests._cli import run_cli

REPO = Path(__file__).resolve().parents[1]
SYNTH = "synth:n=60,rate=6,input_mean=1200,output_mean=40,hit_rate=0.4,open_sessions=16,seed=3"


def _config() -> serving.ClusterConfig:
    base = serving.ClusterConfig.deepseek_day6()
    return base.replace(
        prefill=UnitConfig(nodes=4, token_budget=8192, balancer="deepseek_prefill"),
        decode=UnitConfig(nodes=4, max_running_requests=64, balancer="deepseek_decode"),
        eplb=EplbConfig(solver="deepseek", rebalance_interval_s=5, history_s=5),
        name="cli-small",
    )


def eplb(*args, cwd=None, subprocess_run: bool = False) -> subprocess.CompletedProcess:
    """Runs ``eplb ARGS`` in this process (``main``), or as a real process when asked."""
    if subprocess_run:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        return subprocess.run(
            [sys.executable, "-m", "eplb.cli", *map(str, args)],
            capture_output=True,
            text=True,
            env=env,
            cwd=cwd,
            timeout=600,
        )
    return subprocess.CompletedProcess(args, *run_cli(*args))


def test_simulate_writes_every_output(tmp_path):
    cfg = tmp_path / "cluster.toml"
    _config().write_toml(cfg)
    out = tmp_path / "run"
    r = eplb(
        "simulate",
        cfg,
        "--workload",
        SYNTH,
        "-o",
        out,
        "--no-progress",
        "--seed",
        "2",
        subprocess_run=True,
    )
    assert r.returncode == 0, r.stderr
    assert "ttft_p50_s" in r.stdout and "tok/s/node" in r.stdout
    names = {p.name for p in out.iterdir()}
    assert {
        "summary.json",
        "requests.parquet",
        "steps.parquet",
        "rebalances.csv",
        "faults.csv",
        "utilisation.parquet",
        "config.toml",
        "plots",
    } <= names
    assert len(list((out / "plots").glob("*.png"))) == 4
    payload = json.loads((out / "summary.json").read_text())
    assert payload["summary"]["requests_finished"] == 60 and payload["meta"]["seed"] == 2
    req = pd.read_parquet(out / "requests.parquet")
    assert len(req) == 60 and req["finish_s"].notna().all()
    assert serving.ClusterConfig.from_toml(out / "config.toml") == serving.ClusterConfig.from_toml(
        cfg
    )
    assert len(pd.read_csv(out / "rebalances.csv")) > 0
    # no temporary folders left beside it
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_existing_output_needs_force(tmp_path):
    cfg = tmp_path / "cluster.toml"
    _config().write_toml(cfg)
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    r = eplb("simulate", cfg, "--workload", SYNTH, "-o", out, "--no-progress", "--no-plots")
    assert r.returncode == 2
    assert r.stderr.strip().startswith("eplb: error:") and "--force" in r.stderr
    assert (out / "keep.txt").exists()
    r = eplb(
        "simulate",
        cfg,
        "--workload",
        SYNTH,
        "-o",
        out,
        "--no-progress",
        "--no-plots",
        "--force",
        "--window",
        "0:10",
    )
    # --force replaces only a folder an eplb run wrote: keep.txt is the user's
    assert r.returncode == 2 and r.stderr.count("eplb: error:") == 1, r.stderr
    assert "keep.txt" in r.stderr and (out / "keep.txt").read_text() == "x"
    (out / "keep.txt").unlink()
    r = eplb("simulate", cfg, "--workload", SYNTH, "-o", out, "--no-progress", "--no-plots")
    assert r.returncode == 0, r.stderr
    r = eplb("simulate", cfg, "--workload", SYNTH, "-o", out, "--no-progress", "--no-plots",
             "--force", "--window", "0:10")
    assert r.returncode == 0, r.stderr  # the folder the first run wrote is replaced
    assert json.loads((out / "summary.json").read_text())["window"] == [0.0, 10.0]


@pytest.mark.parametrize(
    "toml_extra, args, match",
    [
        ('[prefill]\nbalancer = "nope"\n', (), "balancer"),
        ('[eplb]\nsolver = "nope"\n', (), "eplb.solver"),
        ("[kv]\nstore_capacity_blocks = -5\n", (), "store_capacity_blocks"),
        ("[decode]\nnodes = 2\nep_size = 32\n", (), "ep_size"),
        ('[[faults]]\ntime_s = 1.0\nunit = ["decode", 0]\ngpu = 999\n', (), "GPU 999"),
        ("", ("--workload", "synth:n=10,bogus=1"), "bogus"),
        ("", ("--workload", "no/such/file.jsonl"), "does not exist"),
        ("", ("--duration", "-3"), "--duration"),
        ("", ("--window", "5:1"), "--window"),
    ],
)
def test_bad_input_is_one_error_line(tmp_path, toml_extra, args, match):
    cfg = tmp_path / "cluster.toml"
    cfg.write_text(toml_extra or 'name = "custom"\n')  # an empty config is itself refused
    out = tmp_path / "run"
    argv = ["simulate", cfg, "--workload", SYNTH, "-o", out, "--no-progress", "--no-plots"]
    if args:
        argv = [a for a in argv if a not in ("--workload", SYNTH)] + list(args)
        if "--workload" not in args:
            argv += ["--workload", SYNTH]
    r = eplb(*argv)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("eplb: error:"), r.stderr
    assert match in lines[0]
    assert "Traceback" not in r.stderr
    assert not out.exists()
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_preset_name_and_missing_config(tmp_path):
    r = eplb(
        "simulate", "no_such_preset", "--workload", SYNTH, "-o", tmp_path / "x", "--no-progress"
    )
    assert r.returncode == 2 and "preset" in r.stderr and not (tmp_path / "x").exists()
