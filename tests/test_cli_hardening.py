"""Issue 13 regressions at the command line: outputs never overwrite inputs, hostile input gets
one ``eplb: error:`` line and exit 2, atomic writes keep modes and follow symlinks, SIGTERM
removes unfinished temporary files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest

from eplb import traces
from eplb.cli import main
from eplb.io import read_placement
from tests._cli import run_cli
from tests.conftest import BUNDLED, REPO

SAMPLE = BUNDLED / "zipf-58x256.npz"


def one_error(rc: int, err: str, *fragments: str) -> None:
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("eplb: error:"), err
    assert "Traceback" not in err
    for frag in fragments:
        assert frag in lines[0], (frag, lines[0])


@pytest.fixture()
def work(tmp_path, monkeypatch):
    """A small trace, a placement for it and a cwd to resolve relative paths against."""
    trace = traces.synth.zipf(4, 16, windows=3, tokens=200, top_k=2, seed=1,
                              layer_ids=[3, 4, 5, 6], meta={"num_groups": 4})
    traces.write(trace, tmp_path / "t.npz")
    assert main(["solve", str(tmp_path / "t.npz"), "--topology", "2x2", "--slots", "20",
                 "-o", str(tmp_path / "p.json")]) == 0
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ----------------------------------------------------------------- §8 data loss
SAME = [
    ("solve", ["solve", "t.npz", "--topology", "2x2", "--slots", "20", "-o", "{in}"], "t.npz"),
    ("convert", ["trace", "convert", "t.npz", "{in}"], "t.npz"),
    ("synth", ["trace", "synth", "tokens", "--target", "t.npz", "-o", "{in}"], "t.npz"),
    ("info plot", ["trace", "info", "t.npz", "--plot", "{in}"], "t.npz"),
    ("evaluate -o", ["evaluate", "p.json", "t.npz", "-o", "{in}"], "p.json"),
    ("evaluate plot", ["evaluate", "p.json", "t.npz", "--plot", "{in}"], "t.npz"),
    ("evaluate slots", ["evaluate", "p.json", "t.npz", "--save-slots", "{in}"], "p.json"),
    ("compare", ["compare", "t.npz", "--solvers", "deepseek", "--topologies", "2x2:20",
                 "--quiet", "-o", "{in}"], "t.npz"),
    ("compare md", ["compare", "t.npz", "--solvers", "deepseek", "--topologies", "2x2:20",
                    "--quiet", "--markdown", "{in}"], "t.npz"),
    ("replay", ["replay", "t.npz", "--topology", "2x2", "--slots", "20", "--quiet",
                "-o", "{in}"], "t.npz"),
    ("replay plot", ["replay", "t.npz", "--topology", "2x2", "--slots", "20", "--quiet",
                     "--plot", "{in}"], "t.npz"),
]


@pytest.mark.parametrize("spelling", ["same", "relative", "symlink", "hardlink"])
@pytest.mark.parametrize(("name", "argv", "victim"), SAME, ids=[s[0] for s in SAME])
def test_output_that_is_an_input_is_refused(work, name, argv, victim, spelling):
    before = (work / victim).read_bytes()
    target = {"same": victim, "relative": f"./sub/../{victim}",
              "symlink": "link", "hardlink": "hard"}[spelling]
    (work / "sub").mkdir()
    os.symlink(work / victim, work / "link")
    os.link(work / victim, work / "hard")
    rc, _, err = run_cli(*[a.replace("{in}", target) for a in argv])
    one_error(rc, err, "is the input", "destroy")
    assert (work / victim).read_bytes() == before
    assert not [p for p in work.iterdir() if p.name.endswith(".tmp")]


def test_outputs_that_are_each_other_are_refused(work):
    rc, _, err = run_cli("evaluate", "p.json", "t.npz", "-o", "x.csv", "--plot", "./x.csv")
    one_error(rc, err, "same file as -o")
    assert not (work / "x.csv").exists()


def test_output_inside_an_input_directory_is_refused(work):
    d = work / "dir"
    d.mkdir()
    (d / "0").mkdir()
    rc, _, err = run_cli("trace", "convert", d, d / "0" / "moe_layer-3.csv")
    one_error(rc, err, "is the input")


@pytest.mark.parametrize("verb", [
    ["solve", "t.npz", "--topology", "2x2", "--slots", "20"],
    ["trace", "convert", "t.npz"],
    ["evaluate", "p.json", "t.npz"],
])
def test_empty_and_directory_outputs(work, verb):
    out = [] if verb[1] == "convert" else ["-o"]
    rc, _, err = run_cli(*verb, *out, "")
    one_error(rc, err, "empty")
    (work / "adir").mkdir()
    rc, _, err = run_cli(*verb, *out, "adir")
    one_error(rc, err, "existing directory")


# ----------------------------------------------------------------- atomic writes
def test_atomic_write_keeps_mode_and_follows_symlinks(tmp_path):
    from eplb.atomic import atomic_write_text

    f = tmp_path / "secret.json"
    f.write_text("old")
    os.chmod(f, 0o600)
    atomic_write_text(f, "new")
    assert f.read_text() == "new" and (f.stat().st_mode & 0o777) == 0o600
    link = tmp_path / "link.json"
    os.symlink(f, link)
    atomic_write_text(link, "via link")
    assert link.is_symlink() and f.read_text() == "via link"
    assert (f.stat().st_mode & 0o777) == 0o600


def test_atomic_write_refusals_name_the_target(tmp_path, monkeypatch):
    from eplb.atomic import atomic_write_text
    from eplb.errors import InputError

    ro = tmp_path / "ro.json"
    ro.write_text("keep")
    os.chmod(ro, 0o444)
    with pytest.raises(InputError, match="ro.json: the file is read-only"):
        atomic_write_text(ro, "x")
    assert ro.read_text() == "keep"
    with pytest.raises(InputError, match="existing directory"):
        atomic_write_text(tmp_path, "x")
    with pytest.raises(InputError, match="empty"):
        atomic_write_text("", "x")
    with pytest.raises(InputError, match="directory .*nowhere does not exist"):
        atomic_write_text(tmp_path / "nowhere" / "x.json", "x")

    def full(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(InputError) as info:
        atomic_write_text(tmp_path / "target.json", "x")
    msg = str(info.value)
    assert "target.json" in msg and "No space left" in msg and ".tmp" not in msg
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_atomic_write_to_a_device_writes_through(tmp_path):
    from eplb.atomic import atomic_write_text

    atomic_write_text(os.devnull, "discarded")  # not replaced by a regular file
    assert not os.path.isfile(os.devnull)


def test_stale_temporaries_of_dead_processes_are_cleaned(tmp_path):
    from eplb.atomic import atomic_write_text

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    stale = tmp_path / f".p.json.{dead}.abc.tmp"
    live = tmp_path / f".p.json.{os.getppid()}.abc.tmp"  # a running process: maybe writing
    other = tmp_path / f".q.json.{dead}.abc.tmp"  # another target's: not ours to touch
    for f in (stale, live, other):
        f.write_text("partial")
    atomic_write_text(tmp_path / "p.json", "{}")
    assert not stale.exists() and live.exists() and other.exists()


def test_sigterm_removes_the_unfinished_temporary_file(tmp_path):
    """``eplb.cli.main`` turns SIGTERM into an exception: the atomic write in progress
    deletes its temporary file, the old output stays, exit status 143."""
    out = tmp_path / "out.json"
    out.write_text("old")
    script = textwrap.dedent(f"""
        import os, signal, sys, time
        import eplb.cli.trace as verb
        from eplb.atomic import atomic_write
        from eplb.cli import main

        def slow_write(args):
            with atomic_write(args.output) as fh:
                fh.write("half")
                fh.flush()
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(30)
            return 0

        verb.run_convert = slow_write
        sys.exit(main(["trace", "convert", {str(SAMPLE)!r}, {str(out)!r}]))
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 128 + signal.SIGTERM, r.stderr
    assert "eplb: terminated" in r.stderr and "Traceback" not in r.stderr
    assert out.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


# ----------------------------------------------------------------- §8 hostile input
def _write(path, text):
    path.write_text(text)
    return path


def test_hostile_json_and_csv(work):
    solve = ["solve", "--topology", "1x2", "--slots", "2"]
    big = _write(work / "big.json", '{"logical_count": [[1' + "0" * 400 + ", 1]]}")
    one_error(*run_cli(solve[0], big, *solve[1:])[::2], "big.json", "beyond 2**53")
    deep = _write(work / "deep.json", "[" * 5000 + "]" * 5000)
    one_error(*run_cli(solve[0], deep, *solve[1:])[::2], "deep.json", "nested too deeply")
    ovf = _write(work / "ovf.csv", "window,layer,expert,count\n0,0,0,9223372036854775807\n"
                 "0,0,1,9223372036854775807\n")
    one_error(*run_cli(solve[0], ovf, *solve[1:])[::2], "ovf.csv", "2**53")
    huge = _write(work / "huge.csv", "window,layer,expert,count\n0,0,0,1" + "0" * 400 + "\n")
    one_error(*run_cli(solve[0], huge, *solve[1:])[::2], "huge.csv", "count on row 1")
    ids = _write(work / "ids.csv", "window,layer,expert,count\n0,0,9223372036854775807,1\n")
    one_error(*run_cli(solve[0], ids, *solve[1:])[::2], "expert on row 1", "2**31")


def test_hostile_numpy_files(work, monkeypatch):
    np.save(work / "c.npy", np.ones((2, 4)) * (1 + 1j))
    one_error(*run_cli("trace", "info", "c.npy")[::2], "complex")
    # a header claiming 80 GB with a few bytes of data: refused before allocating
    head = {"descr": "<f8", "fortran_order": False, "shape": (100000, 100000)}
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, head)
    with zipfile.ZipFile(work / "lie.npz", "w") as z:
        z.writestr("counts.npy", buf.getvalue() + b"\0" * 64)
    one_error(*run_cli("trace", "info", "lie.npz")[::2], "74.5 GiB", "over the limit")
    # a real array that decompresses past the limit (the limit lowered for the test)
    np.savez_compressed(work / "bomb.npz", counts=np.zeros((64, 64, 64)))
    monkeypatch.setenv("EPLB_MAX_BYTES", "100000")
    one_error(*run_cli("trace", "info", "bomb.npz")[::2], "over the limit", "97.7 KiB")
    monkeypatch.delenv("EPLB_MAX_BYTES")
    # content that does not match a forced format is named, not called "pickled"
    csv = _write(work / "x.csv", "window,layer,expert,count\n0,0,0,1\n")
    rc, _, err = run_cli("trace", "info", csv, "--format", "npy")
    one_error(rc, err, "is not a npy file", "looks like csv")
    assert "pickle" not in err
    _write(work / "fake.npz", json.dumps({"format": "eplb.placement"}))
    rc, _, err = run_cli("evaluate", "fake.npz", "t.npz")
    one_error(rc, err, "not an .npz file", "looks like text")
    assert "pickle" not in err


def test_fifo_input_is_refused_without_hanging(work):
    os.mkfifo(work / "pipe.json")
    one_error(*run_cli("trace", "info", "pipe.json")[::2], "not a regular file")
    one_error(*run_cli("evaluate", "pipe.json", "t.npz")[::2], "not a regular file")


@pytest.mark.parametrize(("argv", "fragments"), [
    (["solve", "t.npz", "--topology", "100000x100000", "--slots", "10000000000"],
     ["10000000000 GPUs", "limit"]),
    (["trace", "synth", "zipf", "--windows", "100000000", "-o", "w.npz"],
     ["--windows 100000000", "TiB", "over the limit"]),
    (["execute", "p.json", "--tokens", "1000000000"], ["--tokens 1000000000", "over the limit"]),
    (["evaluate", "p.json", "t.npz", "--top-k", "100"], ["top_k 100", "exceeds the 16 experts"]),
    (["evaluate", "p.json", "t.npz", "--top-k", "16"], ["top_k 16 is impossible"]),
    (["evaluate", "p.json", "t.npz", "--groups", "0"], ["--groups must be >= 1"]),
    (["evaluate", "p.json", "t.npz", "--topk-groups", "9"], ["--topk-groups 9 must be in 1..4"]),
    (["solve", "t.npz", "--topology", "2x2", "--slots", "20", "--groups", "0"],
     ["--groups must be >= 1"]),
    # (deepseek takes any groups and falls back to its global policy: DeepSeek's rule)
    (["solve", "t.npz", "--topology", "2x2", "--slots", "20", "--groups", "5", "--solver",
      "greedy"], ["--groups 5 does not divide the 16 experts", "1, 2, 4, 8, 16"]),
    (["compare", "t.npz", "--topologies", "2x2:20", "--groups", "0", "--quiet"],
     ["--groups must be >= 1"]),
    (["compare", "t.npz", "--topologies", "2x2:20", "--topk-groups", "5", "--quiet"],
     ["--topk-groups 5 must be in 1..4"]),
    (["evaluate", "p.json", "t.npz", "--groups", "8", "--topk-groups", "9"],
     ["--topk-groups 9 must be in 1..8"]),
    (["solve", "t.npz", "--topology", "2x2", "--slots", "15"],
     ["not a multiple of 4 GPUs; use 16"]),
    (["solve", "t.npz", "--topology", "4x8", "--slots", "15"],
     ["use 32 (the smallest multiple of 32 that holds 16 experts)"]),
    (["solve", "t.npz", "--topology", "2x2", "--slots", "12"],
     ["12 slots cannot hold 16 experts", "use 16"]),
    (["solve", "t.npz", "--topology", "2x2", "--slots", "20", "--seed",
      "9999999999999999999999999"], ["--seed", "outside 0..2147483647"]),
    (["solve", "t.npz", "--topology", "2x2", "--slots", "20", "--time-limit", "inf"],
     ["finite number of seconds"]),
])
def test_absurd_and_inconsistent_options(work, argv, fragments):
    one_error(*run_cli(*argv)[::2], *fragments)
    assert not (work / "w.npz").exists()


# ----------------------------------------------------------------- §3 --option
@pytest.mark.parametrize(("verb", "option", "fragments"), [
    ("solve", "bogus=1", ["bogus", "solver 'greedy' has no option", "rdma_weight"]),
    ("solve", "time_limit=abc", ["time_limit is not a solver option; use --time-limit"]),
    ("solve", "seed=3", ["use --seed"]),
    ("solve", "budget=\"x\"", ["greedy: option budget must be an integer"]),
    ("solve", "weighted=yes", ["greedy: option weighted must be true or false"]),
    ("compare", "bogus=1", ["bogus", "has no option"]),
    ("compare", "greedy.budget=abc", ["greedy: option budget must be an integer"]),
    ("compare", "time_limit=5", ["use --time-limit"]),
])
def test_bad_solver_options(work, verb, option, fragments):
    common = {"solve": ["solve", "t.npz", "--topology", "2x2", "--slots", "20"],
              "compare": ["compare", "t.npz", "--topologies", "2x2:20", "--quiet"]}[verb]
    one_error(*run_cli(*common, "--solver" if verb == "solve" else "--solvers", "greedy",
                       "--option", option)[::2], *fragments)


def test_solver_option_beyond_its_range_is_one_line(work):
    """An option value a solver's backend cannot take (CP-SAT's 32-bit thread count) is refused
    by the option checks at `solvers.solve`, naming the option and its range; the CLI does not
    translate stray TypeErrors any more (issue 19)."""
    rc, _, err = run_cli("solve", "t.npz", "--topology", "2x2", "--slots", "20",
                         "--solver", "ilp", "--option", "threads=2147483648")
    one_error(rc, err, "ilp: option threads must be an integer >= 1 and <= 2147483647",
              "2147483648")


def test_solve_help_lists_solvers_and_their_options(capsys):
    with pytest.raises(SystemExit):
        main(["solve", "--help"])
    out = capsys.readouterr().out
    for name in ("deepseek", "greedy", "hierarchical", "ilp"):
        assert f"\n  {name}" in out
    assert "rdma_weight" in out and "migration_budget" in out


def test_argparse_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as info:
        main(["solve", "x.npz", "--slots", "abc"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("eplb: error:") and len(err.strip().splitlines()) == 1


def test_trace_info_help_has_no_doubled_percent(capsys):
    with pytest.raises(SystemExit):
        main(["trace", "info", "--help"])
    assert "%%" not in capsys.readouterr().out


# ----------------------------------------------------------------- §7 solve and execute
def test_solve_windows_and_ema(work):
    rc, out, err = run_cli("solve", "t.npz", "--topology", "2x2", "--slots", "20",
                           "--windows", "1", "-o", "w1.json")
    assert rc == 0, err
    assert "window 1 of 3" in out
    rc, out, err = run_cli("solve", "t.npz", "--topology", "2x2", "--slots", "20",
                           "--ema", "0.5", "-o", "ema.json")
    assert rc == 0, err
    assert "EMA alpha=0.5 over all 3 windows" in out
    trace = traces.read(work / "t.npz")
    w1 = read_placement(work / "w1.json")
    assert w1.meta["source"]["windows"] == "1"
    # the placement is the one solved on window 1 alone, with the groups the trace records
    # (issue 37: solve without --groups takes them from the trace or its model)
    from eplb import solvers
    ref = solvers.solve("deepseek", trace.load([1]), w1.topology,
                        num_groups=trace.meta["num_groups"])
    assert np.array_equal(ref.phy2log, w1.phy2log)
    one_error(*run_cli("solve", "t.npz", "--topology", "2x2", "--slots", "20",
                       "--windows", "7")[::2], "windows")


def test_solve_summary_says_what_it_runs_over(work):
    rc, out, _ = run_cli("solve", "t.npz", "--topology", "2x2", "--slots", "20")
    assert rc == 0
    assert "max GPU load / lower bound" in out and "over 4 layers" in out
    assert "mean" in out and "min" in out


def test_execute_takes_model_layer_ids_and_defaults_to_the_first_moe_layer(work):
    """An SGLang export has rows for the dense layers 0..2 (default map); --layer is a model
    layer id and the default is the first MoE layer, 3."""
    rc, _, err = run_cli("solve", "t.npz", "--topology", "2x2", "--slots", "20",
                         "--format", "sglang", "-o", "sg.json")
    assert rc == 0, err
    common = ["execute", "sg.json", "--topology", "2x2", "--slots", "20", "--experts", "16",
              "--tokens", "64", "--hidden", "8"]
    rc, out, err = run_cli(*common)
    assert rc == 0, err
    assert "model layer 3 (row 3)" in out
    rc, out, err = run_cli(*common, "--layer", "5", "--trace", "t.npz")
    assert rc == 0, err
    assert "model layer 5 (row 5)" in out
    rc, out, err = run_cli(*common, "--trace", "t.npz")
    assert rc == 0 and "model layer 3" in out
    one_error(*run_cli(*common, "--layer", "9")[::2], "--layer 9 is not a layer")


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-5", "fast"])
@pytest.mark.parametrize("verb", [
    ["solve", "t.npz", "--topology", "2x2", "--slots", "20", "-o", "q.json"],
    ["execute", "p.json", "t.npz"],
    ["evaluate", "p.json", "t.npz"],
    ["replay", "t.npz", "--solver", "deepseek", "--topology", "2x2", "--slots", "20"],
    ["compare", "t.npz", "--solvers", "deepseek", "--topology", "2x2", "--slots", "20"],
], ids=lambda v: v[0] if isinstance(v, list) else v)
@pytest.mark.parametrize("flag", ["--nvlink-gbps", "--rdma-gbps"])
def test_bandwidths_are_finite_and_positive_everywhere(work, verb, flag, value):
    """Every verb that takes a bandwidth refuses one that is not a finite number > 0 GB/s,
    also where the topology comes from a placement file (the corpus found `execute` taking
    nan there)."""
    rc, _, err = run_cli(*verb, flag, value)
    one_error(rc, err, flag)
    assert not (work / "q.json").exists()
