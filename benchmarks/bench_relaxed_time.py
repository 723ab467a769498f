"""Wall and CPU seconds of one ``relaxed`` solve (default options, 8 groups) per trace file,
with ``hierarchical`` (its start) and ``deepseek`` timed in the same process as baselines.

Run: ``python benchmarks/bench_relaxed_time.py [FILE ...] [--topology 4x8x9] [--repeat 3]``
(default: every file of ../shared/traces/deepseek-v3-sglang and the bundled traces/data
files). Reports the median of ``--repeat`` runs; CPU seconds are this process's
(``time.process_time``), which a busy shared machine inflates less than wall seconds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from eplb import Topology, solvers, traces
from eplb.data_dirs import traces_dir

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = sorted((traces_dir() / "deepseek-v3-sglang").glob("*.json"))
DEFAULT += [ROOT / "traces" / "data" / "deepseek-v3-calibrated.npz"]


def timed(name: str, load, topo: Topology, repeat: int) -> tuple[float, float]:
    """Median (wall, CPU) seconds of ``repeat`` solves."""
    wall, cpu = [], []
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        solvers.solve(name, load, topo, num_groups=8)
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path, default=DEFAULT)
    ap.add_argument("--topology", default="4x8x9", help="nodes x GPUs per node x slots per GPU")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    N, gpn, S = (int(x) for x in args.topology.split("x"))
    topo = Topology(N, gpn, S)
    print(f"topology {topo}, 8 groups, median of {args.repeat} runs")
    print(
        "file | layers x experts | relaxed wall s | relaxed CPU s | hierarchical wall s | "
        "deepseek wall s | relaxed / deepseek (wall)"
    )
    for f in args.files:
        load = traces.read(f).load()
        r = timed("relaxed", load, topo, args.repeat)
        h = timed("hierarchical", load, topo, args.repeat)
        d = timed("deepseek", load, topo, args.repeat)
        print(
            f"{f.stem} | {load.shape[0]} x {load.shape[1]} | {r[0]:.2f} | {r[1]:.2f} | "
            f"{h[0]:.2f} | {d[0]:.3f} | {r[0] / d[0]:.0f}"
        )


if __name__ == "__main__":
    main()
