"""`import eplb.solvers` and the CLI entry stay light: no heavy optional library at import."""

import subprocess
import sys

import pytest

HEAVY = ("pandas", "scipy.optimize", "ortools", "matplotlib")


@pytest.mark.parametrize("module", ["eplb.solvers", "eplb.cli.main"])
def test_import_does_not_load_heavy_libraries(module: str, tmp_path) -> None:
    code = (
        f"import sys, {module}\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        cwd=tmp_path,  # the repo root would shadow the installed package mapping
    ).stdout.strip()
    assert out == "", f"import {module} loaded {out}; import them where they are used"
