"""scripts/serving_examples.py, tiny: the README's serving commands as written, on a one-node
cluster and 160 requests, in this process; every verdict agrees with its figures (the full
run, `python scripts/serving_examples.py --check`, regenerates and checks the docs)."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from pathlib import Path

import pytest

from tests._cli import run_cli

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "serving_examples.py"


def here(argv: list[str], cwd: Path) -> tuple[int, str, str]:
    """The command in this process, in ``cwd`` (no interpreter start)."""
    with contextlib.chdir(cwd):
        return run_cli(*argv)


@pytest.fixture(scope="module")
def examples():
    sys.path.insert(0, str(SCRIPT.parent))  # as running the script does (its `docblock`)
    spec = importlib.util.spec_from_file_location("serving_examples", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["serving_examples"] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("serving_examples", None)
        sys.path.remove(str(SCRIPT.parent))


def test_tiny_examples_agree_with_their_figures(examples, tmp_path):
    outcomes, got = examples.run_all(tiny=True, only={"capacity", "sim40", "rates"},
                                     shared=tmp_path, runner=here)
    assert [o.name for o in outcomes] == ["synth", "capacity", "sim40", "rates"]
    for o in outcomes:
        assert o.checks and not o.failed, (o.command, o.failed, o.stderr[-2000:])
    assert got["sim40"]["overloaded"] == 1.0 and got["sim40"]["bottleneck"] == "prefill"
    assert got["capacity"]["rate"] > 0 and len(got["capacity"]["lines"]) >= 2
    # the README block names the capacity the run found, and every command it runs
    block = examples.readme_block({**got, "sim": got["sim40"]})
    assert f"{got['capacity']['rate']:.3g} req/s" in block
    for _, cmd, _ in examples.EXAMPLES:
        assert cmd in block


def test_a_contradiction_is_caught(examples, tmp_path):
    """The checks fail on the issue's example: an overloaded run's table printed with
    'overloaded no' and a 'not overloaded' verdict beside TTFT far above the SLO; and on byte
    counts printed bare or with an exponent."""
    examples.write_tiny_config(tmp_path)
    cmd = ("eplb workload synth -n 160 --rate 60 --input-mean 1500 --output-mean 12 "
           "--seed 1 -o wl.parquet")
    assert not examples.run("synth", cmd, tmp_path, here).failed
    cmd = "eplb simulate tiny.toml --workload wl.parquet --duration 15 -o sim/"
    res = examples.run("sim", cmd, tmp_path, here)
    s = examples.check_simulate(res, tmp_path / "sim", None)
    assert not res.failed and s["overloaded"] == 1.0, res.failed
    lines = res.stdout.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("overloaded "):
            lines[i] = line.replace("yes", "no ")
        if line.startswith("verdict: "):
            lines[i] = "verdict: not overloaded"
    lied = examples.Outcome("sim", cmd, 0, "\n".join(lines), "", 0.0)
    examples.check_simulate(lied, tmp_path / "sim", None)
    failed = " | ".join(lied.failed)
    assert "overloaded recomputed True" in failed and "not overloaded with first" in failed
    bad = examples.Outcome("x", "x", 0, "825,181,077,504.0 bytes and 8.769e+04 GB", "", 0.0)
    examples.check_text(bad)
    assert bad.failed


@pytest.mark.parametrize("phase, per_rank", [("decode", "100000"), ("prefill", "4096")])
def test_advise_check_reads_the_operating_point(examples, phase, per_rank):
    """check_advise compares the operating-point line with the table's per-rank column under
    both phases' names (decode: running requests per rank, issue 34 part 4 renamed it; the
    check looked for a ``tokens_per_rank`` column only and crashed on the README's decode
    advise), and fails when the header's number is not the table's."""
    data = Path(__file__).resolve().parents[1] / "traces" / "data"
    cmd = (f"eplb advise {data / 'deepseek-v3-calibrated.npz'} --topology 2x8 --slots 288 "
           f"--phase {phase} --tokens-per-rank {per_rank} --levers rebalance")
    res = examples.run("advise", cmd, data, here)
    examples.check_advise(res)
    assert res.checks and not res.failed, (res.failed, res.stderr[-2000:])
    line = next(x for x in res.stdout.splitlines() if x.startswith("operating point: "))
    ran = line.split(", ")[1].split()[0]
    lied = examples.Outcome("advise", cmd, 0, res.stdout.replace(line, line.replace(
        f", {ran} ", f", {int(ran.replace(',', '')) + 1} ", 1)), "", 0.0)
    examples.check_advise(lied)
    assert any("header per rank" in f for f in lied.failed), lied.failed
