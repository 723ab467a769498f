"""paper/build.py publishes all or nothing: a failed or interrupted build changes nothing in
its output folder; a finished one replaces tables/, figures/, results.json and paper.md."""

from __future__ import annotations

import importlib.util
import os
import signal
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.fixture(scope="module")
def build():
    spec = importlib.util.spec_from_file_location("paper_build", REPO / "paper" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _old_set(out, build=None):
    """``out`` as an earlier build left it (with ``build``: published by it, so its manifest
    lists tables/old.md, tables/gone.md, figures/old.png, results.json and paper.md), plus
    tables/notes.md, which no build wrote."""
    if build is None:
        (out / "tables").mkdir(parents=True)
        (out / "figures").mkdir()
        (out / "tables" / "old.md").write_text("old table")
        (out / "tables" / "gone.md").write_text("a table the new build no longer makes")
        (out / "figures" / "old.png").write_text("old figure")
        (out / "results.json").write_text("{}")
        (out / "paper.md").write_text("old paper")
    else:
        def old(results):
            build.atomic_write_text(build.OUT / "tables" / "old.md", "old table")
            build.atomic_write_text(build.OUT / "tables" / "gone.md", "no longer made")
            build.atomic_write_text(build.OUT / "figures" / "old.png", "old figure")

        build.run_stages([("old", old)], out, lambda staging, results: (
            (staging / "results.json").write_text("{}"),
            (staging / "paper.md").write_text("old paper")))
    (out / "tables" / "notes.md").write_text("a file no build wrote")
    return {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}


def _snapshot(out):
    return {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}


def _stage_writing(build, name):
    def stage(results):
        build.atomic_write_text(build.OUT / "tables" / f"{name}.md", f"new {name}")
        results[name] = "1"
    return stage


def _render(staging, results):
    (staging / "results.json").write_text(str(sorted(results)))
    (staging / "paper.md").write_text("new paper")


def test_success_replaces_the_whole_set(build, tmp_path):
    out = tmp_path / "paper"
    _old_set(out, build)
    build.run_stages([("a", _stage_writing(build, "a")), ("b", _stage_writing(build, "b"))],
                     out, _render)
    # what the earlier build wrote and this one does not make is gone; notes.md is kept
    assert sorted(p.name for p in (out / "tables").iterdir()) == ["a.md", "b.md", "notes.md"]
    assert (out / "tables" / "notes.md").read_text() == "a file no build wrote"
    assert (out / "paper.md").read_text() == "new paper"
    assert list((out / "figures").iterdir()) == []
    assert not list(out.glob(".paper-build-*"))
    assert build.OUT == build.HERE  # restored


def test_files_no_build_wrote_are_never_removed(build, tmp_path):
    out = tmp_path / "paper"
    before = _old_set(out)  # no manifest: e.g. paper/ before builds recorded what they wrote
    build.run_stages([("a", _stage_writing(build, "a"))], out, _render)
    after = _snapshot(out)
    for rel in ("tables/old.md", "tables/gone.md", "figures/old.png", "tables/notes.md"):
        assert after[Path(rel)] == before[Path(rel)]
    assert after[Path("tables/a.md")] == b"new a"


def test_a_failure_while_publishing_changes_nothing(build, tmp_path, monkeypatch):
    """The publish itself fails after some files moved (a full disk): all are moved back."""
    from eplb import atomic

    out = tmp_path / "paper"
    before = _old_set(out, build)
    real, calls = os.replace, []

    def full_disk(a, b):
        calls.append(1)
        if len(calls) == 4:  # after the first old table went to the journal and a new one in
            raise OSError(28, "No space left on device")
        real(a, b)

    monkeypatch.setattr(atomic.os, "replace", full_disk)
    with pytest.raises(build.EplbError, match="No space left"):
        build.run_stages([("a", _stage_writing(build, "a"))], out, _render)
    monkeypatch.setattr(atomic.os, "replace", real)
    assert _snapshot(out) == before
    assert not list(out.glob(".paper-build-*")) and not list(out.glob(".eplb-publish*"))


@pytest.mark.parametrize("failure", [RuntimeError("stage broke"), KeyboardInterrupt()])
def test_failed_or_interrupted_build_changes_nothing(build, tmp_path, failure):
    out = tmp_path / "paper"
    before = _old_set(out)

    def broken(results):
        raise failure

    with pytest.raises(type(failure)):
        build.run_stages([("a", _stage_writing(build, "a")), ("b", broken)], out, _render)
    assert _snapshot(out) == before
    assert not list(out.glob(".paper-build-*"))


def test_sigterm_during_a_stage_changes_nothing(build, tmp_path):
    out = tmp_path / "paper"
    before = _old_set(out)

    def killed(results):
        os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(KeyboardInterrupt):
        build.run_stages([("a", _stage_writing(build, "a")), ("b", killed)], out, _render)
    assert _snapshot(out) == before
    assert not list(out.glob(".paper-build-*"))
    assert signal.getsignal(signal.SIGTERM) is not build._on_sigterm  # restored


def test_stale_staging_folders_of_dead_builds_are_removed(build, tmp_path):
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    out = tmp_path / "paper"
    _old_set(out)
    stale = out / f".paper-build-{dead}-x"
    stale.mkdir()
    build.run_stages([("a", _stage_writing(build, "a"))], out, _render)
    assert not stale.exists()


def test_data_folder_honours_eplb_data(build, monkeypatch, tmp_path):
    monkeypatch.setenv("EPLB_DATA", str(tmp_path))
    assert build.default_data() == tmp_path / "deepseek-v3-sglang"
    monkeypatch.delenv("EPLB_DATA")
    assert build.default_data() == REPO.parent / "shared" / "traces" / "deepseek-v3-sglang"
