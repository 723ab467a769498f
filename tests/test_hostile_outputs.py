"""Issue 23, the remaining classes: ``--force`` replaces only what an eplb run wrote; every
writer turns a failed write (a full disk, a name too long, a read-only file system...) into an
`EplbError` naming the path and the fix; ``.pt`` sizes are checked before ``torch.load``."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eplb import traces
from eplb.atomic import MANIFEST, atomic_directory, atomic_write_text, check_output_dir
from eplb.errors import EplbError, InputError
from eplb.io import read_placement, write_placement
from tests._cli import run_cli
from tests.test_hostile import one_error, small  # noqa: F401 - the fixture

FULL = Path("/dev/full")


# ------------------------------------------------------------------ --force
def test_force_refuses_a_folder_holding_a_users_file(small):  # noqa: F811
    out = small / "out"
    out.mkdir()
    (out / "notes.txt").write_text("the user's")
    sim = ["--workload", "w.jsonl", "--no-plots", "--no-progress"]
    for cmd in (["simulate", "deepseek_day6", *sim],  # a single run
                ["simulate", "deepseek_day6", "deepseek_day6", "--seeds", "0", *sim]):
        rc, _, err = run_cli(*cmd, "-o", out, "--force")
        one_error(rc, err, "notes.txt", "no eplb run wrote")
        assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    # a folder a run wrote is replaced by --force; a file added to it afterwards refuses again
    out2 = small / "out2"
    assert run_cli("simulate", "deepseek_day6", *sim, "-o", out2)[0] == 0
    assert (out2 / MANIFEST).is_file()
    assert run_cli("simulate", "deepseek_day6", *sim, "-o", out2, "--force")[0] == 0
    (out2 / "plots").mkdir(exist_ok=True)
    (out2 / "plots" / "mine.png").write_bytes(b"png")
    with pytest.raises(InputError, match="plots/mine.png"):  # files are named before folders
        check_output_dir(out2, force=True)


def test_compare_plot_keeps_files_it_does_not_write(small):  # noqa: F811
    plots = small / "plots"
    plots.mkdir()
    (plots / "notes.txt").write_text("the user's")
    rc, _, err = run_cli("compare", "t.npz", "--solvers", "greedy", "--topologies",
                         "2x4:32", "--plot", plots, "--quiet")
    assert rc == 0, err
    assert (plots / "notes.txt").read_text() == "the user's"
    assert len(list(plots.iterdir())) > 1


def test_force_rechecks_the_folder_at_the_swap(tmp_path):
    out = tmp_path / "run"
    with atomic_directory(out) as tmp:
        (tmp / "a").write_text("a")
    check_output_dir(out, force=True)  # only what the run wrote: may be replaced
    with pytest.raises(InputError, match="theirs.txt"), atomic_directory(out) as tmp:
        (tmp / "b").write_text("b")
        (out / "theirs.txt").write_text("theirs")  # appeared while this run was writing
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "a", "theirs.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    # a forged or broken manifest is not eplb's: everything in the folder is foreign
    (out / MANIFEST).write_text("not json")
    (out / "theirs.txt").unlink()
    with pytest.raises(InputError, match="no eplb run wrote"):
        check_output_dir(out, force=True)


# ------------------------------------------------------------------ writers on a full disk
_CACHE: dict = {}


def _writers(tmp: Path) -> dict:
    """Every public writer, as a function of the target path (built once per folder)."""
    if tmp not in _CACHE:
        _CACHE.clear()
        _CACHE[tmp] = _make_writers(tmp)
    return _CACHE[tmp]


def _make_writers(tmp: Path) -> dict:
    import pandas as pd

    from eplb.evaluation.serving import ClusterConfig
    from eplb.evaluation.serving import workload as W
    from eplb.evaluation.tables import write_csv

    placement = read_placement(tmp / "p.json")
    wl = W.read(tmp / "w.jsonl")
    trace = traces.read(tmp / "t.npz")
    return {
        "write_placement": lambda p: write_placement(placement, p, format="native"),
        "atomic_write_text": lambda p: atomic_write_text(p, "x"),
        "tables.write_csv": lambda p: write_csv(pd.DataFrame({"a": [1]}), p),
        "workload.write": lambda p: W.write(wl, p, format="mooncake"),
        "ClusterConfig.write_toml": lambda p: ClusterConfig.load("deepseek_day6").write_toml(p),
        "traces.write": lambda p: traces.write(trace, p, format="npz"),
    }


WRITERS = ["write_placement", "atomic_write_text", "tables.write_csv", "workload.write",
           "ClusterConfig.write_toml", "traces.write"]


@pytest.mark.parametrize("name", WRITERS)
def test_every_writer_on_dev_full_names_the_path(small, name):  # noqa: F811
    with pytest.raises(EplbError, match=r"/dev/full: No space left on device; free .*ENOSPC"):
        _writers(small)[name](FULL)


ERRNOS = [errno.ENOSPC, errno.EDQUOT, errno.ENAMETOOLONG, errno.EROFS, errno.EACCES,
          errno.EPERM, errno.EIO, errno.EFBIG, errno.ENOLINK]
POINTS = ["os.replace", "os.fsync", "tempfile.mkstemp", "os.chmod"]


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(WRITERS), code=st.sampled_from(ERRNOS),
       point=st.sampled_from(POINTS))
def test_a_failed_os_call_in_any_writer_is_one_named_error(small, monkeypatch, name, code,  # noqa: F811
                                                           point):
    module, attr = point.split(".")
    real = getattr({"os": os, "tempfile": tempfile}[module], attr)

    def boom(*a, **k):
        raise OSError(code, os.strerror(code))

    target = small / f"out_{name}"
    writer = _writers(small)[name]
    with monkeypatch.context() as m:
        m.setattr({"os": os, "tempfile": tempfile}[module], attr, boom)
        with pytest.raises(EplbError) as info:
            writer(target)
    assert getattr({"os": os, "tempfile": tempfile}[module], attr) is real
    text = str(info.value)
    assert str(target) in text and errno.errorcode[code] in text, text
    assert not target.exists()
    assert [p.name for p in small.iterdir() if p.name.endswith(".tmp")] == []


def test_result_save_and_compare_plot_name_the_path(small):  # noqa: F811
    from eplb.evaluation.compare import compare

    res = compare([small / "t.npz"], solvers=["greedy"], topologies="2x4:32", progress=False)
    with pytest.raises(EplbError, match="/dev/full/plots.*(ENOTDIR|ENOENT|EEXIST)"):
        res.plot(FULL / "plots")
    with pytest.raises(EplbError, match="longer than 255|too long"):
        res.write(small / ("n" * 300 + ".csv"))


# ------------------------------------------------------------------ .pt sizes before loading
# torch is skipped per test, not for the module (a module-level skip hid every test here)


def _inflate(data: bytes, numel: int) -> bytes:
    """``data`` (a torch pickle) with the first storage's numel (24) replaced by ``numel``."""
    i = data.index(b"cpu")
    j = data.index(b"K\x18", i)  # BININT1 24
    return data[:j] + b"\x8a\x08" + numel.to_bytes(8, "little") + data[j + 2:]


def _zip_inflated(src: Path, dst: Path, numel: int) -> None:
    import zipfile

    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            body = zin.read(info.filename)
            if info.filename.endswith("data.pkl"):
                body = _inflate(body, numel)
            zout.writestr(info.filename, body)


@settings(max_examples=8, deadline=None)
@given(kind=st.sampled_from(["zip", "legacy", "view", "shared-lists"]),
       scale=st.integers(34, 50))
def test_pt_sizes_are_refused_before_torch_load(kind, scale):
    torch = pytest.importorskip("torch")
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        ones = torch.ones(2, 3, 4)
        path = d / "x.pt"
        if kind == "zip":
            torch.save({"logical_count": ones}, d / "ok.pt")
            _zip_inflated(d / "ok.pt", path, 2**scale)
        elif kind == "legacy":
            torch.save({"logical_count": ones}, d / "ok.pt", _use_new_zipfile_serialization=False)
            path.write_bytes(_inflate((d / "ok.pt").read_bytes(), 2**scale))
        elif kind == "view":  # one stored number, viewed as billions
            side = 2 ** ((scale + 1) // 2)
            torch.save({"logical_count": torch.ones(1).expand(side, side)}, path)
        else:  # one row shared by every layer: a few KB on disk
            row = [1] * 2 ** (scale // 3)
            torch.save({"logical_count": [[row] * 2 ** (scale // 3)] * 2 ** (scale // 3)}, path)
        calls = []
        real = torch.load

        def spy(*a, **k):
            calls.append(a)
            return real(*a, **k)

        torch.load = spy
        try:
            with pytest.raises(EplbError, match="EPLB_MAX_BYTES"):
                traces.read(path)
        finally:
            torch.load = real
        if kind in ("zip", "legacy"):
            assert calls == []  # refused from the pickle's opcodes, before loading
        assert os.path.getsize(path) < 2**20


def test_pt_size_check_passes_ordinary_dumps(tmp_path):
    from eplb.safeload import check_torch_file

    torch = pytest.importorskip("torch")

    torch.save({"logical_count": torch.ones(2, 3, 4), "b": torch.ones(5, dtype=torch.bfloat16)},
               tmp_path / "a.pt")
    assert check_torch_file(tmp_path / "a.pt") == 2 * 3 * 4 * 4 + 5 * 2
    assert traces.read(tmp_path / "a.pt").counts.shape[-1] == 4
    shutil.rmtree(tmp_path)


@pytest.mark.parametrize("junk", [True, None, 5, b"x", "x" * 300, "a\0b"])
def test_cluster_config_load_refuses_junk_by_name(junk):
    """Found by the corpus: ``ClusterConfig.load(True)`` raised a bare TypeError."""
    from eplb.evaluation.serving import ClusterConfig

    with pytest.raises(EplbError, match="cluster config"):
        ClusterConfig.load(junk)


# ------------------------------------------------------------------ third pass (full corpus run)
def test_a_read_only_file_is_refused_before_any_work(small):  # noqa: F811
    ro = small / "ro.csv"
    ro.write_text("the user's")
    ro.chmod(0o444)  # refused by its mode bits, so also for root
    cmp = ["compare", "t.npz", "--solvers", "greedy", "--topologies", "2x4:32", "--quiet"]
    for argv in (cmp + ["-o", ro], ["evaluate", "p.json", "t.npz", "-o", ro]):
        one_error(*run_cli(*argv)[::2], "ro.csv", "read-only")
        assert ro.read_text() == "the user's" and (ro.stat().st_mode & 0o777) == 0o444


def test_a_staged_commit_moves_every_file_or_none(tmp_path):
    from eplb.atomic import staged_outputs

    final = tmp_path / "plots"
    final.mkdir()
    (final / "z.png").write_text("old z")
    (final / "z.png").chmod(0o444)  # the last file moved: the earlier ones must not move
    with pytest.raises(InputError, match="z.png.*read-only"), staged_outputs() as stage:
        folder = stage.folder(final)
        for name in ("a.png", "b.png", "z.png"):
            (folder / name).write_text("new")
        (stage.file(tmp_path / "s.csv")).write_text("csv")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plots"]
    assert sorted(p.name for p in final.iterdir()) == ["z.png"]
    assert (final / "z.png").read_text() == "old z"


@pytest.mark.parametrize("verb", [["trace", "info", "t.npz"], ["evaluate", "p.json", "t.npz"],
                                  ["replay", "t.npz", "--topology", "2x4", "--slots", "32",
                                   "--quiet"]])
def test_a_plot_name_matplotlib_cannot_write_is_refused_before_work(small, verb):  # noqa: F811
    one_error(*run_cli(*verb, "--plot", "x.npz")[::2], "--plot x.npz", "Format 'npz'")
    assert not (small / "x.npz").exists()


def test_every_plot_function_checks_the_format_before_drawing(tmp_path):
    import pandas as pd

    from eplb.evaluation import plots

    frame = pd.DataFrame({"window": [0], "step_max_over_mean": [1.0], "rebalanced": [False],
                          "bytes_moved": [0.0]})
    calls = [lambda p: plots.replay_curve(frame, p),
             lambda p: plots.pareto_front(pd.DataFrame(), p),
             lambda p: plots.summary_bars(pd.DataFrame(), p),
             lambda p: plots.load_heatmap([[1.0, 2.0]], [0], p)]
    for call in calls:
        with pytest.raises(InputError, match="Format 'csv' is not supported"):
            call(tmp_path / "x.csv")
    assert list(tmp_path.iterdir()) == []
