"""`import eplb.solvers` and the CLI entry stay light: no heavy optional library at import."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("pandas", "scipy", "ortools", "matplotlib", "networkx")
TRACE = ROOT / "traces" / "data" / "deepseek-v3-calibrated.npz"


def _loaded_after(code: str) -> str:
    # one fresh interpreter (sys.modules starts clean); prints the heavy modules it loaded
    code += f"\nimport sys\nprint('HEAVY:' + ','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
    ).stdout.splitlines()
    marks = [line for line in out if line.startswith("HEAVY:")]
    assert len(marks) == 1, out
    return marks[0].removeprefix("HEAVY:")


def test_import_does_not_load_heavy_libraries() -> None:
    out = _loaded_after("import eplb.solvers, eplb.cli.main")
    assert out == "", f"import eplb.solvers / eplb.cli.main loaded {out}; import them where used"


def test_cli_deepseek_solve_does_not_load_heavy_libraries(tmp_path: Path) -> None:
    # the whole `eplb solve` path for the default policy, not only the imports
    dest = tmp_path / "p.json"
    code = (
        "from eplb.cli.main import main\n"
        f"main(['solve', {str(TRACE)!r}, '--topology', '4x8', '--slots', '288',"
        f" '--groups', '8', '-o', {str(dest)!r}])"
    )
    out = _loaded_after(code)
    assert dest.exists()
    assert out == "", f"`eplb solve` (deepseek) loaded {out}; import them where used"
