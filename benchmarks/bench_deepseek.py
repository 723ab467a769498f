"""Speed of the `deepseek` solver on 58 x 256 loads (prefill 4x8/288 hierarchical, decode 18x8/288
global). Prints median milliseconds and the ratio against the plain per-layer loop oracle
(`eplb.testing.deepseek_reference`) run in the same process on the same input.

Run: ``python benchmarks/bench_deepseek.py [--repeat 20] [--load FILE]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from eplb import Topology, solvers, traces
from eplb.data_dirs import traces_dir
from eplb.testing.deepseek_reference import rebalance as loop_reference

REPO = Path(__file__).resolve().parents[1]

SHARED = traces_dir() / "deepseek-v3-sglang" / "prefill_in1024.json"
BUNDLED = REPO / "traces" / "data" / "zipf-58x256.npz"


def median_ms(fn, repeat: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--load", type=Path, default=SHARED if SHARED.exists() else BUNDLED)
    args = ap.parse_args()
    load = traces.read(args.load).load()
    print(f"load {args.load.name}: {load.shape[0]} layers x {load.shape[1]} experts")
    print(f"{'setting':<28}{'deepseek ms':>12}{'loop ms':>10}{'speed-up':>10}")
    for name, topo in [
        ("prefill 4x8, 288 slots", Topology(4, 8, 9)),
        ("decode 18x8, 288 slots", Topology(18, 8, 2)),
    ]:
        fast = median_ms(
            lambda t=topo: solvers.solve("deepseek", load, t, num_groups=8), args.repeat
        )
        slow = median_ms(
            lambda t=topo: loop_reference(load, t.num_slots, 8, t.num_nodes, t.num_gpus),
            max(1, args.repeat // 10),
        )
        print(f"{name:<28}{fast:>12.2f}{slow:>10.1f}{slow / fast:>9.0f}x")


if __name__ == "__main__":
    main()
