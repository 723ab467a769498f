"""`eplb.atomic.publish_tree`: a set of files moved into a folder all or nothing; a failure,
an interrupt or a kill at any move leaves the folder as it was; files no publish wrote are
never removed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from eplb import atomic
from eplb.errors import EplbError


def _snapshot(out):
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*")
            if p.is_file()}


def _old(out):
    """``out`` after an earlier publish (tables/a.md, tables/stale.md, figures/f.png, r.json)
    plus a file no publish wrote (tables/mine.md)."""
    stage = out.parent / "stage0"
    for rel, text in {"tables/a.md": "old a", "tables/stale.md": "old stale",
                      "figures/f.png": "old f", "r.json": "old r"}.items():
        (stage / rel).parent.mkdir(parents=True, exist_ok=True)
        (stage / rel).write_text(text)
    atomic.publish_tree(stage, out)
    (out / "tables" / "mine.md").write_text("not written by a build")
    return _snapshot(out)


def _new(tmp_path):
    return _new_in(tmp_path / "out")


def _new_in(out):
    stage = out / ".stage"
    for rel, text in {"tables/a.md": "new a", "tables/b.md": "new b",
                      "figures/f.png": "new f", "r.json": "new r", "extra/x.md": "new x"}.items():
        (stage / rel).parent.mkdir(parents=True, exist_ok=True)
        (stage / rel).write_text(text)
    return stage


def test_publish_replaces_what_it_wrote_and_keeps_the_rest(tmp_path):
    out = tmp_path / "out"
    _old(out)
    stale = atomic.publish_tree(_new(tmp_path), out)
    assert stale == ["tables/stale.md"]
    got = _snapshot(out)
    assert got.pop(atomic.MANIFEST)
    assert got == {"tables/a.md": b"new a", "tables/b.md": b"new b",
                   "tables/mine.md": b"not written by a build", "figures/f.png": b"new f",
                   "r.json": b"new r", "extra/x.md": b"new x"}
    assert atomic.written_files(out) == {"tables/a.md", "tables/b.md", "figures/f.png",
                                         "r.json", "extra/x.md"}
    assert not [p for p in os.listdir(out) if p.startswith(atomic.JOURNAL)]


def test_without_a_manifest_nothing_old_is_removed(tmp_path):
    out = tmp_path / "out"
    (out / "tables").mkdir(parents=True)
    (out / "tables" / "gone.md").write_text("no manifest says a build wrote this")
    atomic.publish_tree(_new(tmp_path), out)
    assert (out / "tables" / "gone.md").read_text() == "no manifest says a build wrote this"


def _moves(tmp_path, monkeypatch) -> int:
    """How many renames a publish of `_new` over `_old` makes (the points it can fail at)."""
    out = tmp_path / "count"
    _old(out)
    real, calls = os.replace, []
    monkeypatch.setattr(atomic.os, "replace", lambda a, b: (calls.append(1), real(a, b)))
    atomic.publish_tree(_new_in(out), out)
    monkeypatch.setattr(atomic.os, "replace", real)
    return len(calls)


@pytest.mark.parametrize("failure", [OSError(28, "No space left on device"),
                                     KeyboardInterrupt()])
def test_a_failure_at_any_move_changes_nothing(tmp_path, monkeypatch, failure):
    n = _moves(tmp_path, monkeypatch)
    assert n >= 10  # each old file to the journal, each new one into place
    for k in range(n):
        out = tmp_path / f"o{k}"
        before = _old(out)
        stage = _new_in(out)
        real, calls = os.replace, []

        def failing(a, b, real=real, calls=calls, k=k):
            calls.append(1)
            if len(calls) == k + 1:
                raise failure
            real(a, b)

        monkeypatch.setattr(atomic.os, "replace", failing)
        with pytest.raises(EplbError if isinstance(failure, OSError) else KeyboardInterrupt):
            atomic.publish_tree(stage, out)
        monkeypatch.setattr(atomic.os, "replace", real)
        after = {k2: v for k2, v in _snapshot(out).items() if not k2.startswith(".stage/")}
        assert after == before, k
        assert not (out / "extra").exists()
        assert not [p for p in os.listdir(out) if p.startswith(atomic.JOURNAL)]


_KILLED = """
import os, sys
from eplb import atomic
real, calls = os.replace, []
def dying(a, b):
    calls.append(1)
    if len(calls) == int(sys.argv[3]) + 1:
        os._exit(9)  # as SIGKILL: no cleanup runs
    real(a, b)
atomic.os.replace = dying
atomic.publish_tree(sys.argv[1], sys.argv[2])
"""


@pytest.mark.parametrize("k", [1, 4, 7])
def test_a_publish_killed_midway_is_undone_by_the_next(tmp_path, k):
    out = tmp_path / "out"
    before = _old(out)
    stage = _new(tmp_path)
    proc = subprocess.run([sys.executable, "-c", _KILLED, str(stage), str(out), str(k)])
    assert proc.returncode == 9
    assert (out / atomic.JOURNAL).is_dir()  # half done: the journal says what to undo
    atomic.recover_publish(out)
    after = {k2: v for k2, v in _snapshot(out).items() if not k2.startswith(".stage/")}
    assert after == before
    assert not [p for p in os.listdir(out) if p.startswith(atomic.JOURNAL)]


def test_a_live_publish_elsewhere_is_refused(tmp_path):
    out = tmp_path / "out"
    before = _old(out)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (out / atomic.JOURNAL).mkdir()
        (out / atomic.JOURNAL / "plan.json").write_text(json.dumps(
            {"pid": holder.pid, "files": [], "dirs": []}))
        with pytest.raises(EplbError, match=f"another process \\(pid {holder.pid}\\)"):
            atomic.publish_tree(_new(tmp_path), out)
    finally:
        holder.kill()
        holder.wait()
    (out / atomic.JOURNAL / "plan.json").unlink()
    (out / atomic.JOURNAL).rmdir()
    assert {k: v for k, v in _snapshot(out).items() if not k.startswith(".stage/")} == before


def test_a_folder_where_a_file_goes_is_refused(tmp_path):
    out = tmp_path / "out"
    (out / "r.json").mkdir(parents=True)
    (out / "r.json" / "keep").write_text("x")
    with pytest.raises(EplbError, match="r.json: it is a folder"):
        atomic.publish_tree(_new(tmp_path), out)
    assert (out / "r.json" / "keep").read_text() == "x"
    assert not (out / "tables").exists()
