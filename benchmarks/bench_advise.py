"""Benchmark (issue 20 target): ``eplb advise`` on one 58-layer dump answers in <= 30 s on
2 cores.

Runs the CLI as a user would (a fresh process, imports included) on SGLang's DeepSeek-V3 dumps
(../shared/traces/deepseek-v3-sglang, 58 MoE layers x 256 experts) under the Day-6 shapes
(prefill EP32 4x8, decode EP144 18x8, 288 slots, H800; the default levers and --redundant
0,32,64), and prints each wall time beside the target and, as the in-process baseline, the
time of one `steady_state` call on the same unit and load (so the ratio reads "advise costs N
step evaluations").

    python benchmarks/bench_advise.py [--dumps decode_in2000out100.json,...] [--curves]

``--curves`` also times the craft lever's per-layer curves (`layer_curves`) on the first decode
dump's load at today's slots per GPU and at one more, the range the lever does not explore.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from eplb import traces
from eplb.data_dirs import traces_dir
from eplb.evaluation.serving import ClusterConfig, UnitConfig, steady_state
from eplb.evaluation.serving.simulator.planner import trivial_placement

DUMPS = traces_dir() / "deepseek-v3-sglang"
SHAPES = {"prefill": ("4x8", 4), "decode": ("18x8", 18)}
TARGET_S = 30.0


def baseline_s(path: Path, phase: str) -> float:
    """Seconds of one steady_state call (trivial placement, the dump's load), best of 3."""
    nodes = SHAPES[phase][1]
    cfg = ClusterConfig(prefill=UnitConfig(nodes=nodes, token_budget=16384),
                        decode=UnitConfig(nodes=nodes, max_running_requests=128))
    load = traces.read(path).counts.sum(0)
    p = trivial_placement(cfg.model_spec, cfg.unit(phase).topology())
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        steady_state(cfg, phase, placement=p, load=load)
        best = min(best, time.perf_counter() - t0)
    return best


def curves_s(path: Path) -> None:
    """Seconds of `layer_curves` (the craft lever's cost) at EP144 and EP32, at 288 slots
    (today's, what the lever explores) and one slot per GPU more."""
    from eplb.solvers.primitives.replica_budget import layer_curves

    load = traces.read(path).counts.sum(0)
    for gpus, slots in ((144, 2), (144, 3), (32, 9), (32, 10)):
        t0 = time.perf_counter()
        layer_curves(load, gpus, slots)
        print(f"layer_curves EP{gpus} x {slots} slots/GPU ({gpus * slots} slots): "
              f"{time.perf_counter() - t0:.2f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dumps", default="prefill_in2048.json,prefill_in512.json,"
                    "decode_in2000out100.json,decode_in1000out1000.json")
    ap.add_argument("--curves", action="store_true", help="also time craft's layer curves")
    args = ap.parse_args()
    if args.curves:
        curves_s(DUMPS / "decode_in2000out100.json")
    worst = 0.0
    print(f"{'dump':28s} {'phase':8s} {'advise s':>9s} {'target s':>9s} {'1 step s':>9s} "
          f"{'ratio':>7s}")
    for name in args.dumps.split(","):
        path = DUMPS / name
        phase = "prefill" if name.startswith("prefill") else "decode"
        topo = SHAPES[phase][0]
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "eplb.cli", "advise", str(path), "--topology",
                        topo, "--slots", "288", "--phase", phase], check=True,
                       stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        base = baseline_s(path, phase)
        worst = max(worst, wall)
        print(f"{name:28s} {phase:8s} {wall:9.2f} {TARGET_S:9.0f} {base:9.4f} "
              f"{wall / base:7.0f}")
    print(f"worst {worst:.2f} s: {'meets' if worst <= TARGET_S else 'MISSES'} the "
          f"{TARGET_S:.0f} s target")
    return 0 if worst <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
