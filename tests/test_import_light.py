"""`import eplb.solvers` and the CLI entry stay light: no heavy optional library at import."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("pandas", "scipy.optimize", "ortools", "matplotlib")


def test_import_does_not_load_heavy_libraries() -> None:
    # one fresh interpreter (sys.modules starts clean); both public entry points imported
    code = (
        "import sys, eplb.solvers, eplb.cli.main\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
    ).stdout.strip()
    assert out == "", f"import eplb.solvers / eplb.cli.main loaded {out}; import them where used"
