"""Issue 23 regressions, one block per class: data loss, all-or-nothing outputs and signals,
hangs, sizes refused before allocation, tracebacks (a hypothesis strategy of hostile files
per reader), wrong answers to bad input. `scripts/hostile_corpus.py` runs the wider corpus."""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from eplb import Topology, solvers, traces
from eplb.atomic import (
    MANIFEST,
    Terminated,
    atomic_directory,
    atomic_write_text,
    check_output_dir,
    clear_signals,
    note_signal,
    staged_outputs,
)
from eplb.cli import main
from eplb.errors import EplbError, InputError
from eplb.format import json_text
from eplb.io import read_placement, write_placement
from eplb.safeload import json_loads, max_bytes, yaml_load
from tests._cli import run_cli
from tests.conftest import BUNDLED

SAMPLE = BUNDLED / "zipf-58x256.npz"


def one_error(rc: int, err: str, *fragments: str) -> str:
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("eplb: error:"), err
    for f in fragments:
        assert f in err, err
    return err


@pytest.fixture()
def small(tmp_path):
    """A tiny trace, placement and workload in ``tmp_path`` (cwd)."""
    os.chdir(tmp_path)
    assert run_cli("trace", "synth", "zipf", "-o", "t.npz", "--layers", "2", "--experts",
                   "16", "--windows", "3")[0] == 0
    assert run_cli("solve", "t.npz", "--topology", "2x4", "--slots", "32", "-o",
                   "p.json")[0] == 0
    assert run_cli("workload", "synth", "-n", "20", "--rate", "20", "-o", "w.jsonl")[0] == 0
    return tmp_path


def _digest(path: Path) -> bytes:
    return path.read_bytes()


# ------------------------------------------------------------------ 1. data loss
@pytest.mark.parametrize("inside", ["workload", "config"])
def test_simulate_force_refuses_inputs_inside_the_output(small, inside):
    out = small / "out"
    out.mkdir()
    shutil.copy(small / "w.jsonl", out / "w.jsonl")
    (out / "c.toml").write_text('name = "x"\n')
    before = {p.name: _digest(p) for p in out.iterdir()}
    if inside == "workload":
        argv = ["simulate", "deepseek_day6", "--workload", out / "w.jsonl"]
    else:
        argv = ["simulate", out / "c.toml", "--workload", "w.jsonl"]
    rc, _, err = run_cli(*argv, "-o", out, "--force", "--no-plots", "--no-progress")
    one_error(rc, err, "holds the input")
    assert {p.name: _digest(p) for p in out.iterdir()} == before


@pytest.mark.parametrize("spelling", ["", ".", "./", ".."])
def test_output_folder_refuses_empty_and_current(small, spelling):
    with pytest.raises(InputError, match="empty|current folder"):
        check_output_dir(spelling, force=True)


def test_synth_lengths_from_is_not_overwritten(small):
    before = _digest(small / "w.jsonl")
    rc, _, err = run_cli("workload", "synth", "-n", "5", "--lengths-from", "w.jsonl", "-o",
                         "./w.jsonl")
    one_error(rc, err, "is the input --lengths-from")
    assert _digest(small / "w.jsonl") == before


def test_compare_plot_folder_holding_an_input(small):
    (small / "plots").mkdir()
    shutil.copy(small / "t.npz", small / "plots" / "pareto.csv")
    before = _digest(small / "plots" / "pareto.csv")
    rc, _, err = run_cli("compare", "plots/pareto.csv", "--solvers", "greedy",
                         "--topologies", "2x4:32", "--plot", "plots", "--quiet")
    one_error(rc, err, "--plot plots holds")
    assert _digest(small / "plots" / "pareto.csv") == before


def test_claimed_folder_is_never_replaced(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(InputError, match="appeared while"), \
            atomic_directory(out, replace=False) as tmp:
        (tmp / "mine.txt").write_text("mine")
        out.mkdir()  # another run wrote the folder meanwhile
        (out / "theirs.txt").write_text("theirs")
    assert sorted(p.name for p in out.iterdir()) == ["theirs.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # temporary folder removed
    with atomic_directory(tmp_path / "new", replace=False) as tmp:
        (tmp / "a").write_text("a")
    assert (tmp_path / "new" / "a").read_text() == "a"


# ------------------------------------------------------------------ 2. all-or-nothing, signals
def test_staged_outputs_all_or_nothing(tmp_path):
    plots = tmp_path / "plots"
    plots.mkdir()
    (plots / "notes.txt").write_text("the user's")
    with pytest.raises(RuntimeError), staged_outputs() as stage:
        atomic_write_text(stage.file(tmp_path / "s.csv"), "a,b\n")
        (stage.folder(plots) / "x.png").write_text("png")
        raise RuntimeError("a plot failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plots"]
    assert sorted(p.name for p in plots.iterdir()) == ["notes.txt"]
    with staged_outputs() as stage:
        atomic_write_text(stage.file(tmp_path / "s.csv"), "a,b\n")
        (stage.folder(plots) / "x.png").write_text("png")
    assert (tmp_path / "s.csv").read_text() == "a,b\n"
    assert sorted(p.name for p in plots.iterdir()) == ["notes.txt", "x.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plots", "s.csv"]


def test_symlinked_output_folder_leaves_nothing_behind(tmp_path):
    real = tmp_path / "real"
    with atomic_directory(real, replace=False) as tmp:  # an earlier run's folder
        (tmp / "old.txt").write_text("old")
    link = tmp_path / "link"
    link.symlink_to(real)
    with atomic_directory(link) as tmp:
        (tmp / "new.txt").write_text("new")
    assert link.is_symlink() and sorted(p.name for p in link.iterdir()) == [MANIFEST,
                                                                               "new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]


def test_a_legal_250_byte_name_is_written(tmp_path):
    name = "n" * 245 + ".json"
    atomic_write_text(tmp_path / name, "{}")
    with atomic_directory(tmp_path / ("d" * 250)) as tmp:
        (tmp / "a").write_text("a")
    assert sorted(len(p.name) for p in tmp_path.iterdir()) == [250, 250]
    with pytest.raises(InputError, match="longer than 255"):
        atomic_write_text(tmp_path / ("n" * 300), "{}")


def test_a_swallowed_signal_still_stops_every_commit(tmp_path):
    try:
        note_signal(15)  # as a handler whose exception a weakref callback swallowed
        with pytest.raises(Terminated):
            atomic_write_text(tmp_path / "a.txt", "x")
        with pytest.raises(Terminated), atomic_directory(tmp_path / "d") as tmp:
            (tmp / "a").write_text("a")
        with pytest.raises(Terminated), staged_outputs() as stage:
            (stage.folder(tmp_path / "plots") / "a.png").write_text("png")
    finally:
        clear_signals()
    assert list(tmp_path.iterdir()) == []


def test_cli_exits_128_plus_signal_when_the_exception_was_swallowed(monkeypatch, tmp_path):
    import eplb.cli.trace as verb
    from eplb.cli.main import _raise_terminated

    def swallowed(args):
        try:
            _raise_terminated(15, None)
        except Terminated:
            pass  # what "Exception ignored in ..." does to a weakref callback's exception
        atomic_write_text(tmp_path / "late.txt", "x")  # refused: the signal is on record
        return 0

    monkeypatch.setattr(verb, "run_info", swallowed)
    assert main(["trace", "info", str(SAMPLE)]) == 143
    assert list(tmp_path.iterdir()) == []

    def ignored(args):
        try:
            _raise_terminated(15, None)
        except Terminated:
            pass
        return 0

    monkeypatch.setattr(verb, "run_info", ignored)
    assert main(["trace", "info", str(SAMPLE)]) == 143


# ------------------------------------------------------------------ 3. hangs
@pytest.mark.parametrize("kind", ["fifo", "device", "socket"])
def test_every_reader_refuses_a_fifo(tmp_path, kind):
    import socket

    from eplb.evaluation.serving import ClusterConfig
    from eplb.evaluation.serving import workload as W

    readers = {"t.npz": traces.read, "t.json": traces.read, "p.json": read_placement,
               "c.toml": ClusterConfig.load, "w.jsonl": W.read}
    for name, reader in readers.items():
        path = tmp_path / name
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "device":
            path.symlink_to("/dev/zero")  # endless: reading it would never finish
        else:
            sock = socket.socket(socket.AF_UNIX)
            sock.bind(str(path))
            sock.close()
        with pytest.raises(EplbError, match="FIFO|regular file"):
            reader(path)


@pytest.mark.parametrize("key,old,new", [
    ("eplb", "rebalance_interval_s", 1e-9),
    ("eplb", "migration_gbps", 1e-12),
    ("kv", "transfer_gbps", 1e-12),
    ("eplb", "history_s", math.inf),
])
def test_unbounded_simulations_are_refused_before_starting(key, old, new):
    from eplb.evaluation.serving import ClusterConfig, simulate
    from eplb.evaluation.serving import workload as W

    data = ClusterConfig.deepseek_day6().to_dict()
    data[key][old] = new
    wl = W.synthesize(20, rate=10.0)
    with pytest.raises(InputError, match="limit") as info:
        simulate(ClusterConfig.from_dict(data), wl, progress=False)
    assert old in str(info.value)


def test_a_workload_spanning_centuries_is_refused():
    from eplb.evaluation.serving import ClusterConfig, simulate
    from eplb.evaluation.serving import workload as W

    config = ClusterConfig.deepseek_day6()
    with pytest.raises(InputError, match="spans .* over the limit"):
        simulate(config, W.rescale(W.synthesize(20, rate=10.0), rate=1e-9), progress=False)
    for bucket in (1e-12, True, math.nan):
        with pytest.raises(InputError, match="bucket_s"):
            simulate(config, W.synthesize(20, rate=10.0), bucket_s=bucket, progress=False)


# ------------------------------------------------------------------ 4. sizes
def test_yaml_aliases_are_refused(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    (tmp_path / "bomb.yaml").write_text("\n".join(lines) + "\ninitial_global_assignments: "
                                        "{0: *a9}\n")
    with pytest.raises(EplbError, match="alias"):
        read_placement(tmp_path / "bomb.yaml", topology=Topology.parse("2x4", 32))
    assert yaml_load("a: [1, 2]\nb: {c: 3}\n") == {"a": [1, 2], "b": {"c": 3}}


@pytest.mark.parametrize("value", ["inf", "1e400", "-5", "abc", "nan", "0"])
def test_bad_max_bytes_is_named(monkeypatch, value):
    monkeypatch.setenv("EPLB_MAX_BYTES", value)
    with pytest.raises(InputError, match="EPLB_MAX_BYTES"):
        max_bytes()
    with pytest.raises(InputError, match="EPLB_MAX_BYTES"):
        traces.read(SAMPLE)


def test_sizes_are_checked_before_allocation(monkeypatch, tmp_path):
    from eplb.evaluation.serving import workload as W

    with pytest.raises(InputError, match="EPLB_MAX_BYTES"):
        W.synthesize(10**13)
    pd.DataFrame({"window": np.zeros(2000, int), "layer": 0, "expert": np.arange(2000),
                  "count": 1}).to_parquet(tmp_path / "t.parquet")
    monkeypatch.setenv("EPLB_MAX_BYTES", "10000")
    with pytest.raises(EplbError, match="Parquet table needs"):
        traces.read(tmp_path / "t.parquet")


# ------------------------------------------------------------------ 5. tracebacks
_NASTY = st.sampled_from([b"NaN", b"Infinity", b"-1", b"1e400", b"\xff\xfe", b"\x00",
                          b"[" * 3000, b"{", b'"x"', b"true", b"9" * 5000, b"*a", b"&a",
                          b"!!python/object:os.system", b"\n", b","])


@st.composite
def hostile_bytes(draw):
    """A valid file of some format, truncated, spliced with nasty tokens or replaced."""
    suffix = draw(st.sampled_from([".json", ".csv", ".npz", ".toml", ".jsonl", ".yaml"]))
    base = {
        ".json": json.dumps({"logical_count": [[[1, 2, 3, 4]] * 2] * 2}).encode(),
        ".csv": b"window,layer,expert,count\n0,0,0,5\n0,0,1,3\n",
        ".npz": SAMPLE.read_bytes()[:20000],
        ".toml": b'name = "x"\n[kv]\nblock_size = 512\n',
        ".jsonl": b'{"timestamp": 0, "input_length": 10, "output_length": 5}\n',
        ".yaml": b"num_slots: 4\ninitial_global_assignments: {0: [0, 1, 2, 3]}\n",
    }[suffix]
    how = draw(st.sampled_from(["truncate", "splice", "random", "nest"]))
    if how == "truncate":
        data = base[: draw(st.integers(0, len(base)))]
    elif how == "splice":
        at = draw(st.integers(0, len(base)))
        data = base[:at] + draw(_NASTY) + base[at + draw(st.integers(0, 8)):]
    elif how == "random":
        data = draw(st.binary(min_size=0, max_size=300))
    else:
        depth = draw(st.integers(1, 20_000))
        data = b"[" * depth + b"1" + b"]" * depth if suffix != ".toml" else \
            b"x = " + b"[" * depth + b"]" * depth
    return suffix, data


@given(hostile_bytes())
def test_hostile_files_raise_eplb_errors_only(tmp_path_factory, case):
    from eplb.evaluation.serving import ClusterConfig
    from eplb.evaluation.serving import workload as W

    suffix, data = case
    path = tmp_path_factory.mktemp("h") / f"f{suffix}"
    path.write_bytes(data)
    topo = Topology.parse("1x4", 4)
    readers = {".json": [traces.read, read_placement], ".csv": [traces.read, W.read],
               ".npz": [traces.read, read_placement], ".toml": [ClusterConfig.from_toml],
               ".jsonl": [W.read], ".yaml": [lambda p: read_placement(p, topology=topo)]}
    for reader in readers[suffix]:
        try:
            reader(path)
        except EplbError:
            pass


def test_long_names_and_full_disks_name_the_path(tmp_path, small):
    with pytest.raises(EplbError, match="File name too long|longer than"):
        traces.read(tmp_path / ("x" * 300 + ".npz"))
    placement = read_placement(small / "p.json")
    with pytest.raises(EplbError, match="/dev/full"):
        write_placement(placement, "/dev/full", format="native")
    one_error(*run_cli("trace", "convert", "t.npz", "/dev/full", "--format", "npz")[::2],
              "/dev/full")


def test_tables_refuse_booleans_dates_and_missing_ids(tmp_path):
    (tmp_path / "b.csv").write_text("window,layer,expert,count\nTrue,0,0,5\nFalse,0,1,3\n")
    with pytest.raises(EplbError, match="booleans"):
        traces.read(tmp_path / "b.csv")
    pd.DataFrame({"window": pd.array([0, None], dtype="Int64"), "layer": [0, 0],
                  "expert": [0, 1], "count": [1, 2]}).to_parquet(tmp_path / "n.parquet")
    with pytest.raises(EplbError, match="missing"):
        traces.read(tmp_path / "n.parquet")
    pd.DataFrame({"window": [0, 0], "layer": [0, 0], "expert": [0, 1],
                  "count": pd.to_datetime(["2020-01-01", "2020-01-02"])}
                 ).to_parquet(tmp_path / "d.parquet")
    with pytest.raises(EplbError, match="dates"):
        traces.read(tmp_path / "d.parquet")


def test_pt_dumps_with_odd_tensors(tmp_path):
    torch = pytest.importorskip("torch")
    ones = torch.ones(2, 3, 4)
    cases = {"sparse": ones.to_sparse(), "meta": torch.ones(2, 3, 4, device="meta"),
             "quantized": torch.quantize_per_tensor(ones, 0.1, 0, torch.qint8)}
    for kind, tensor in cases.items():
        torch.save({"logical_count": tensor}, tmp_path / f"{kind}.pt")
        with pytest.raises(EplbError, match=kind):
            traces.read(tmp_path / f"{kind}.pt")
    for rank in ("x", [1], -1):
        torch.save({"logical_count": ones, "rank": rank}, tmp_path / "r.pt")
        with pytest.raises(EplbError, match="rank"):
            traces.read(tmp_path / "r.pt")
    torch.save({"logical_count": ones.to(torch.bfloat16)}, tmp_path / "bf16.pt")
    assert traces.read(tmp_path / "bf16.pt").counts.sum() == 24


def test_rank_folder_with_a_superscript_digit(tmp_path):
    (tmp_path / "²").mkdir()  # '²'.isdigit(), yet int('²') fails: named, not a traceback
    with pytest.raises(EplbError, match="'²' is not written in ASCII digits"):
        traces.read(tmp_path)


@given(st.recursive(st.floats() | st.integers() | st.text(max_size=3),
                    lambda kids: st.lists(kids, max_size=3)
                    | st.dictionaries(st.text(max_size=3), kids, max_size=3), max_leaves=12))
def test_json_text_is_strict_json(doc):
    text = json_text(doc)
    json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in {text}"))


def test_placement_meta_must_be_an_object(small):
    doc = json.loads((small / "p.json").read_text())
    doc["meta"] = "a string"
    (small / "m.json").write_text(json.dumps(doc))
    with pytest.raises(EplbError, match="'meta' is str"):
        read_placement(small / "m.json")


# ------------------------------------------------------------------ 6. wrong answers
def test_json_duplicate_keys_and_big_integers(tmp_path):
    with pytest.raises(InputError, match="appears twice"):
        json_loads('{"a": 1, "a": 2}')
    (tmp_path / "d.json").write_text('{"logical_count": [[[1,2]]], "logical_count": [[[3,4]]]}')
    with pytest.raises(EplbError, match="appears twice"):
        traces.read(tmp_path / "d.json")
    (tmp_path / "b.json").write_text('{"logical_count": [[[9007199254740993, 1]]]}')
    with pytest.raises(EplbError, match="2\\*\\*53"):
        traces.read(tmp_path / "b.json")


@pytest.mark.parametrize("top_k", [0, "eight", True, 99])
def test_trace_meta_routing_fields(top_k):
    with pytest.raises(EplbError, match="top_k"):
        traces.Trace(np.ones((1, 2, 16)), meta={"top_k": top_k})


def test_wrong_answers_are_errors(small):
    from eplb.evaluation.compare import compare
    from eplb.evaluation.replay import replay
    from eplb.evaluation.serving import ClusterConfig
    from eplb.evaluation.serving import workload as W
    from eplb.evaluation.serving.results.steady import steady_state
    from eplb.solvers.analysis.bounds import lower_bound

    topo = Topology.parse("2x4", 32)
    with pytest.raises(InputError, match="num_groups 3"):
        lower_bound(np.ones((1, 16)), topo, num_groups=3)
    with pytest.raises(InputError, match="batch"):
        steady_state(ClusterConfig.deepseek_day6(), "decode", batch=10**20)
    for cv in (-1.0, math.nan):
        with pytest.raises(InputError, match="cv"):
            W.synthesize(5, cv=cv)
    with pytest.raises(InputError, match="bogus"):
        replay(traces.read("t.npz"), topo, policy="even", bogus=1)
    with pytest.raises(InputError, match="bogus"):
        compare(["t.npz"], solvers=["greedy"], topologies="2x4:32", progress=False,
                traffic={"bogus": 1})
    one_error(*run_cli("execute", "p.json", "--trace", "t.npz", "--combine-bytes",
                       "0")[::2], "combine_bytes")
    one_error(*run_cli("replay", "t.npz", "--topology", "2x4", "--slots", "32",
                       "--topk-groups", "2", "--quiet")[::2], "--topk-groups")
    one_error(*run_cli("solve", "t.npz", "--topology", "2x4x4", "--rdma-gbps",
                       "1e-320")[::2],
              "rdma_gbps")


# ------------------------------------------------------------------ third pass (full corpus run)
@functools.lru_cache(maxsize=1)
def _zips() -> dict[str, bytes]:
    """A compressed trace npz and a placement npz, as bytes (made once)."""
    folder = Path(tempfile.mkdtemp(prefix="eplb-zips-"))
    try:
        trace = traces.Trace(np.random.default_rng(0).integers(0, 50, (2, 2, 16)).astype(float))
        traces.write(trace, folder / "t.npz")
        placement = solvers.solve("greedy", trace, Topology.parse("2x4", 32))
        write_placement(placement, folder / "p.npz")
        return {name: (folder / name).read_bytes() for name in ("t.npz", "p.npz")}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@given(st.sampled_from(["t.npz", "p.npz"]), st.integers(0, 10**6), st.integers(0, 7),
       st.integers(1, 3))
def test_npz_bit_flips_raise_eplb_errors_only(tmp_path_factory, name, at, bit, flips):
    data = bytearray(_zips()[name])
    for k in range(flips):  # a corrupt deflate stream raised zlib.error before
        data[(at + 97 * k) % len(data)] ^= 1 << bit
    path = tmp_path_factory.mktemp("flip") / name
    path.write_bytes(bytes(data))
    reader = traces.read if name == "t.npz" else read_placement
    try:
        reader(path)
    except EplbError:
        pass


def test_sglang_counts_refuse_booleans(tmp_path):
    for value in ("true", "false"):
        (tmp_path / "b.json").write_text('{"logical_count": [[[1, 2, ' + value + ", 4]]]}")
        with pytest.raises(EplbError, match=rf"logical_count\[0\]\[0\]\[2\] is {value}"):
            traces.read(tmp_path / "b.json")
    (tmp_path / "ok.json").write_text('{"logical_count": [[[1, 2]]], "note": "true"}')
    assert traces.read(tmp_path / "ok.json").counts.sum() == 3


@pytest.mark.parametrize("text", ["", "\n", "# comments only\n"])
def test_an_empty_cluster_config_is_refused(tmp_path, text):
    from eplb.evaluation.serving import ClusterConfig

    (tmp_path / "c.toml").write_text(text)
    with pytest.raises(EplbError, match="holds no settings"):
        ClusterConfig.load(tmp_path / "c.toml")


@pytest.mark.parametrize("junk", [None, True, b"\xff", 10**30, -5, float("nan"), {"a": 1},
                                  np.ones(3)], ids=repr)
def test_workload_read_refuses_what_is_not_a_path(junk):
    from eplb.evaluation.serving import workload as W

    with pytest.raises(EplbError, match="workload file must be a file name"):
        W.read(junk)


def test_lengths_sigma_is_bounded(small):
    from eplb.evaluation.serving import workload as W

    for key in ("input_sigma", "output_sigma"):
        with pytest.raises(InputError, match=f"{key} must be <= 10"):
            W.synthesize(5, **{key: 1e300})
    one_error(*run_cli("workload", "synth", "-n", "5", "--output-sigma", "1e300", "-o",
                       "s.jsonl")[::2], "output_sigma")
    assert not (small / "s.jsonl").exists()
    assert len(W.synthesize(5, input_sigma=10, output_sigma=0)) == 5


@pytest.mark.parametrize("flag,value", [("--goodput", "nan"), ("--goodput", "0"),
                                        ("--goodput", "1.5"), ("--rel-tol", "nan"),
                                        ("--rel-tol", "1"), ("--rel-tol", "-0.1")])
def test_simulate_fractions_are_checked_without_capacity(small, flag, value):
    one_error(*run_cli("simulate", "deepseek_day6", "--workload", "w.jsonl", "--no-plots",
                       "--no-progress", "-o", "o", flag, value)[::2], flag, "fraction")
    assert not (small / "o").exists()


def test_topology_flags_must_agree_with_a_native_placement(small):
    for verb in (["evaluate", "p.json", "t.npz"], ["execute", "p.json", "--trace", "t.npz"]):
        one_error(*run_cli(*verb, "--topology", "2x4x3")[::2], "--topology 2x4x3",
                  "stores 2x4x4")
    assert run_cli("evaluate", "p.json", "t.npz", "--topology", "2x4", "--slots",
                   "32")[0] == 0


def test_python_m_eplb_cli_runs_the_verb_only_as_main(capsys):
    import runpy

    # a spawned worker imports the main module as __mp_main__: it must not run the verb again
    runpy.run_module("eplb.cli", run_name="__mp_main__")
    assert capsys.readouterr() == ("", "")
    with pytest.raises(SystemExit):
        runpy.run_module("eplb.cli", run_name="__main__")


SLOW_POLICY = """
import time

import numpy as np

from eplb.solvers import register


@register("slow_rr")
def slow_rr(load, topology):
    '''slot p holds expert p mod E, after 5 s'''
    time.sleep(5)
    return np.tile(np.arange(topology.num_slots) % load.shape[1], (load.shape[0], 1))
"""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="uses /proc")
def test_sigterm_to_compare_with_workers_cancels_the_queue(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import REPO
    from tests.test_solvers_ilp_runtime import _alive, _children, _gone, _kill_all

    (tmp_path / "slowplug.py").write_text(SLOW_POLICY)
    traces.write(traces.Trace(np.ones((2, 2, 16))), tmp_path / "t.npz")
    # 8 tasks of 5 s on 2 workers: 20 s uninterrupted, >= 15 s still queued at the signal
    topologies = ",".join(f"{n}x{g}:{s}" for n, g in (("2", "4"), ("1", "8"))
                          for s in (32, 64, 96, 128))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "eplb.cli", "compare", "t.npz", "--plugin", "slowplug",
         "--solvers", "slow_rr", "--topologies", topologies, "--workers", "2", "-o", "out.csv",
         "--quiet"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True)
    kids: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(kids) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
            kids = [k for k in _children(proc.pid) if _alive(k)]
        assert len(kids) >= 2, proc.stderr.read().decode() if proc.poll() is not None else ""
        time.sleep(0.5)  # the workers are inside their first task
        sent = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)  # the parent alone, as `kill PID` does
        proc.wait(timeout=60)
        stopped = time.monotonic() - sent
        err = proc.stderr.read().decode()
        assert proc.returncode == 143, err
        assert stopped < 5.0, f"took {stopped:.1f} s to stop: the queue ran on"
        assert _gone(kids, 10.0), "workers outlived the run"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["slowplug.py", "t.npz"]
    finally:
        _kill_all(proc, kids)
