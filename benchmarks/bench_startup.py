"""Wall time of `eplb solve` on the bundled trace against bare `python -c "import numpy"`.

Run: python benchmarks/bench_startup.py [--repeat 5]
Prints best-of-N wall seconds for each command and the ratio, measured in the same process
(the machine may be shared, so read the ratio). Issue 22 part 3 target: `eplb solve` <= 1.5 s
wall on 2 cores (pin with `taskset -c 0,1`).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "traces" / "data" / "deepseek-v3-calibrated.npz"


def best_wall(cmd: list[str], repeat: int) -> float:
    """Best wall seconds of `repeat` runs of `cmd` (must exit 0)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "p.json")
        cases = {
            "python -c 'import numpy'": [sys.executable, "-c", "import numpy"],
            "python -c 'import eplb.solvers'": [sys.executable, "-c", "import eplb.solvers"],
            "eplb solve 4x8:288": [sys.executable, "-m", "eplb.cli", "solve", str(TRACE),
                                   "--topology", "4x8", "--slots", "288", "-o", out],
        }
        base = None
        for name, cmd in cases.items():
            t = best_wall(cmd, args.repeat)
            base = base or t
            print(f"{name:34s} {t:7.3f} s   x{t / base:5.2f} of import numpy")


if __name__ == "__main__":
    main()
