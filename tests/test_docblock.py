"""The one doc-block writer of the scripts (`scripts/docblock.update_doc`): a block's body is
replaced and nothing else, ``check`` compares and never writes, a missing block is refused
by name before anything is written, and a write is atomic (a failed rename leaves the old
document whole)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from eplb.errors import EplbError

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "docblock.py"
DOC = (
    "# Title\n\n<!-- a:begin -->\nold a\n<!-- a:end -->\n\n"
    "text\n<!-- b:begin -->\nold b\n<!-- b:end -->\n"
)


@pytest.fixture(scope="module")
def docblock():
    spec = importlib.util.spec_from_file_location("docblock_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def doc(tmp_path) -> Path:
    path = tmp_path / "page.md"
    path.write_text(DOC, encoding="utf-8")
    return path


def test_write_replaces_only_the_blocks(docblock, doc):
    assert docblock.update_doc(doc, {"b": "new b\nline 2", "a": "new a"}, check=False,
                               script="x.py") == 0
    assert doc.read_text(encoding="utf-8") == DOC.replace("old a", "new a").replace(
        "old b", "new b\nline 2"
    )
    # the bodies the document holds, written back: the same bytes
    docblock.update_doc(doc, {"a": "new a"}, check=False, script="x.py")
    assert doc.read_text(encoding="utf-8") == DOC.replace("old a", "new a").replace(
        "old b", "new b\nline 2"
    )


def test_check_compares_and_never_writes(docblock, doc, monkeypatch, capsys):
    def no_write(*args, **kwargs):
        raise AssertionError("check mode wrote")

    monkeypatch.setattr(docblock, "atomic_write_text", no_write)
    before = doc.stat().st_mtime_ns
    assert docblock.update_doc(doc, {"a": "old a", "b": "old b"}, check=True, script="x.py") == 0
    assert capsys.readouterr().err == ""
    assert docblock.update_doc(doc, {"a": "changed"}, check=True, script="x.py --write") == 1
    assert capsys.readouterr().err == "page.md is stale; run python scripts/x.py --write\n"
    assert doc.read_text(encoding="utf-8") == DOC and doc.stat().st_mtime_ns == before


@pytest.mark.parametrize("text", [DOC.replace("<!-- b:begin -->", ""),
                                  DOC.replace("<!-- b:end -->", ""),
                                  "<!-- b:end -->\n" + DOC.replace("<!-- b:end -->", "")],
                         ids=["no-begin", "no-end", "end-before-begin"])
@pytest.mark.parametrize("check", [False, True])
def test_a_missing_block_is_refused_by_name(docblock, doc, text, check):
    doc.write_text(text, encoding="utf-8")
    with pytest.raises(SystemExit, match=r"page\.md has no <!-- b:begin --> \.\.\. "
                                         r"<!-- b:end --> block"):
        docblock.update_doc(doc, {"a": "new a", "b": "new b"}, check=check, script="x.py")
    assert doc.read_text(encoding="utf-8") == text  # block "a" was not written either


def test_a_failed_write_leaves_the_old_document(docblock, doc, monkeypatch):
    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(EplbError, match="page.md"):
        docblock.update_doc(doc, {"a": "new a"}, check=False, script="x.py")
    assert doc.read_text(encoding="utf-8") == DOC
    assert sorted(p.name for p in doc.parent.iterdir()) == ["page.md"]  # no temporary file
