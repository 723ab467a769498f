"""Speed of what an operator runs (issue 22 part 3), every figure with a baseline measured in
the same run:

- start-up: ``eplb solve`` on the bundled trace (a subprocess, wall and CPU seconds), against
  ``python -c "import numpy"`` (the floor any numpy program pays);
- the bound every table prints: the closed form (`evaluation.balance.BOUND_NAME`) against the
  LP relaxation that ``evaluate`` and ``compare``'s "lower bounds" stage used before (2 slots
  per GPU);
- `deepseek` and `greedy` at 4x8:288, 18x8:288, 8x8:320 (best of ``--repeat``, one thread
  where the solver takes ``threads``), against the plain loop transcription of DeepSeek's
  algorithm in `eplb.testing.deepseek_reference`;
- ``evaluate`` at 18x8:288 and ``execute`` of one layer, wall seconds in process.

Run: ``python benchmarks/bench_operators.py [--repeat 5] [--skip-lp]``. On a shared machine
read the CPU seconds: wall time waits for other processes.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUNDLED = REPO / "traces" / "data" / "deepseek-v3-calibrated.npz"


def child(cmd: list[str], repeat: int) -> tuple[float, float]:
    """Best wall and best CPU (user + sys) seconds of ``cmd`` in a subprocess."""
    walls, cpus = [], []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, cwd=REPO)
        walls.append(time.perf_counter() - t)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return min(walls), min(cpus)


def best(fn, repeat: int) -> float:
    """Best CPU seconds of this process over ``repeat`` calls (after one warm-up): on a shared
    machine wall time also counts the waits for other processes."""
    fn()
    out = []
    for _ in range(repeat):
        t = time.process_time()
        fn()
        out.append(time.process_time() - t)
    return min(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--skip-lp", action="store_true", help="skip the LP bound (about a minute)")
    args = ap.parse_args()
    r = args.repeat
    py = sys.executable
    print("== start-up (subprocess, best of", r, ")")
    base = child([py, "-c", "import numpy"], r)
    solve = child([py, "-m", "eplb.cli", "solve", str(BUNDLED), "--topology", "4x8", "--slots",
                   "288"], r)
    imp = child([py, "-c", "import eplb.solvers"], r)
    for name, (w, c) in (("python -c 'import numpy'", base), ("python -c 'import eplb.solvers'",
                                                              imp), ("eplb solve bundled", solve)):
        print(f"{name:<34} wall {w:6.2f} s  cpu {c:6.2f} s  ({c / base[1]:4.1f}x numpy's cpu)")

    from eplb import Topology, solvers, traces
    from eplb.evaluation.balance import closed_bound
    from eplb.evaluation.evaluate import evaluate
    from eplb.evaluation.execute import execute_trace
    from eplb.solvers.analysis.bounds import lower_bound
    from eplb.testing.deepseek_reference import rebalance as loop_reference

    trace = traces.read(BUNDLED)
    load = trace.load()
    t18 = Topology.parse("18x8", 288)
    print("\n== the printed bound at 18x8:288 (2 slots per GPU)")
    bumps = iter(range(1, 10**6))  # a new load each call: lower_bound caches by content
    cf = best(lambda: closed_bound(load * (1 + 1e-9 * next(bumps)), t18, None), r)
    print(f"closed form {cf * 1e3:8.1f} ms", end="")
    if args.skip_lp:
        print()
    else:
        t = time.process_time()
        lower_bound(load * (1 + 1e-9 * next(bumps)), t18, lp=True)
        lp = time.process_time() - t
        print(f"   LP relaxation {lp:6.1f} s   ratio {lp / cf:,.0f}x")

    print(f"\n== solvers on {load.shape[0]} layers x {load.shape[1]} experts, best of {r}, CPU ms "
          "(OMP threads as set)")
    print(f"{'setting':<12}{'deepseek ms':>12}{'greedy ms':>11}{'loop ref ms':>13}"
          f"{'loop/deepseek':>15}{'greedy/deepseek':>17}")
    for spec, slots in (("4x8", 288), ("18x8", 288), ("8x8", 320)):
        topo = Topology.parse(spec, slots)
        ds = best(lambda t=topo: solvers.solve("deepseek", load, t, num_groups=8), r)
        gr = best(lambda t=topo: solvers.solve("greedy", load, t, num_groups=8), r)
        ref = best(lambda t=topo: loop_reference(load, t.num_slots, 8, t.num_nodes,
                                                 t.num_gpus), 1)
        print(f"{spec}:{slots:<7}{ds * 1e3:>12.1f}{gr * 1e3:>11.1f}{ref * 1e3:>13.0f}"
              f"{ref / ds:>14.0f}x{gr / ds:>16.1f}x")

    print("\n== evaluate and execute (in process, CPU seconds)")
    p18 = solvers.solve("deepseek", trace, t18, num_groups=8)
    ev = best(lambda: evaluate(p18, trace), max(1, r // 2))
    print(f"evaluate 18x8:288        {ev:6.2f} s")
    p4 = solvers.solve("greedy", trace, Topology.parse("4x8", 288))
    ex = best(lambda: execute_trace(p4, trace, num_tokens=4096, hidden=512), max(1, r // 2))
    print(f"execute 4,096 tokens     {ex:6.2f} s (hidden 512, one layer)")
    print(f"\nmachine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
