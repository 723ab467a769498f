"""Issue 37 part 4: every README command runs as written from a fresh clone. Each block not
marked ``<!-- readme: long -->`` runs here, in a scratch folder holding only ``traces/data``
(what a clone has), through `scripts/readme_commands.run_block`; the long ones (real dumps
under ``$EPLB_DATA``, simulations of minutes) run in ``python scripts/readme_commands.py``,
which runs every block from a ``git clone``."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests._cli import run_cli

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "readme_commands.py"


def _script():
    spec = importlib.util.spec_from_file_location("readme_commands_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


RC = _script()
BLOCKS = RC.blocks((REPO / "README.md").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """A scratch folder with what a fresh clone has that the commands read: traces/data."""
    root = tmp_path_factory.mktemp("clone")
    shutil.copytree(REPO / "traces" / "data", root / "traces" / "data")
    return root


def test_every_block_is_run_somewhere():
    assert len(BLOCKS) >= 6
    assert all(b.lang in ("bash", "python") for b in BLOCKS)
    assert sum(not b.long for b in BLOCKS) >= 4  # most blocks run in the test suite
    for b in BLOCKS:
        assert "../shared" not in b.text, f"README.md:{b.line} reads ../shared (one checkout)"
        if "$EPLB_DATA" in b.text or "$EPLB_REQUESTS" in b.text:
            assert b.long, f"README.md:{b.line} reads real data: mark it long"


@pytest.mark.parametrize("block", [b for b in BLOCKS if not b.long],
                         ids=lambda b: f"line{b.line}")
def test_readme_block_runs(block, clone):
    from eplb import solvers

    before = set(solvers.available())
    try:
        RC.run_block(block, clone, {**os.environ}, run_cli)
    finally:  # a block registering its own policy (--plugin) leaves nothing behind
        for name in set(solvers.available()) - before:
            solvers.unregister(name)
        sys.modules.pop("mypolicies", None)


def test_the_runner_fails_a_failing_command(clone):
    bad = RC.Block("bash", "eplb solve traces/data/missing.npz --topology 4x8 --slots 288\n",
                   1, False)
    with pytest.raises(AssertionError, match="exited 2"):
        RC.run_block(bad, clone, {}, run_cli)
    other = RC.Block("bash", "ls traces\n", 1, False)
    with pytest.raises(AssertionError, match="not an eplb command"):
        RC.run_block(other, clone, {}, run_cli)
