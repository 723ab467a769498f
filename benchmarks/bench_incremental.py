"""Benchmark: incremental repair (the ``repair`` policy; old spelling: greedy with
``tolerance`` / ``migration_budget`` and ``previous=``) against fresh greedy + relabel, run in
the same process.

1. Replay of the bundled ``traces/data/deepseek-v3-calibrated.npz`` (4 x 8 GPUs, 288 slots,
   rebalance every ``--interval`` windows from the last ``--history``): mean step max/mean
   GPU load over all windows and over the windows after the first rebalance, replicas moved
   per rebalance (the first rebalance starts from the uniform-load placement), solve seconds
   per rebalance.
2. Real DeepSeek-V3 counts (``../shared/traces/deepseek-v3-sglang``, skipped when absent):
   the live placement is greedy's for a file's load; the new load is (a) that load times
   lognormal noise (sigma ``--noise``, seeded) and (b) the next file's load (a workload
   change). Per file and mode: replicas moved, mean max/mean of the new load, worst ratio
   of max load to the fresh greedy's, layers taken from the fresh solve, solve seconds.
   Then (a) again with two slots per GPU (18 x 8 GPUs, 288 slots) on two files.

    python benchmarks/bench_incremental.py [--interval 4] [--history 2] [--noise 0.05]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import solvers
import traces
from eplb import Topology
from eplb.commands.common import table
from evaluation.replay import replay

REPO = Path(__file__).resolve().parents[1]
BUNDLED = REPO / "traces" / "data" / "deepseek-v3-calibrated.npz"
REAL = REPO.parent / "shared" / "traces" / "deepseek-v3-sglang"
MODES: list[tuple[str, dict]] = [
    ("fresh + relabel", {}),
    ("tolerance 0.002", {"tolerance": 0.002}),
    ("tolerance 0.01", {"tolerance": 0.01}),
    ("budget 16", {"migration_budget": 16}),
    ("budget 48", {"migration_budget": 48}),
    ("tol 0.002 + budget 48", {"tolerance": 0.002, "migration_budget": 48}),
]


def bench_replay(topo: Topology, interval: int, history: int) -> None:
    trace = traces.read(BUNDLED)
    print(
        f"\n## replay {BUNDLED.name}: {trace.num_windows} windows x {trace.num_layers} layers, "
        f"{topo.num_nodes}x{topo.gpus_per_node} GPUs, {topo.num_slots} slots, every "
        f"{interval} windows from the last {history}"
    )
    rows = []
    for name, opts in MODES:
        f = replay(
            trace, topo, solver="greedy", interval=interval, history=history, solver_options=opts
        )
        rb = f[f["rebalanced"]]
        after = f[f["window"] >= rb["window"].min()]
        moved = rb["replicas_moved"].to_numpy()
        rows.append(
            (
                name,
                f"{f['step_max_over_mean'].mean():.4f}",
                f"{after['step_max_over_mean'].mean():.4f}",
                " / ".join(str(int(m)) for m in moved),
                f"{moved[1:].mean():.0f}",
                f"{rb['solve_seconds'].mean():.3f}",
            )
        )
    print(
        table(
            rows,
            [
                "mode",
                "max/mean all",
                "max/mean after 1st",
                "moved per rebalance",
                "moved (later)",
                "seconds/rebalance",
            ],
        )
    )


def bench_real(
    topo: Topology,
    noise: float,
    seed: int,
    *,
    files: int | None = None,
    changes: tuple[str, ...] = ("noise", "next file"),
) -> None:
    paths = sorted(REAL.glob("*.json"))[:files]
    if not paths:
        print(f"\n(real traces not found at {REAL}: skipped)")
        return
    loads = {p.stem: traces.read(p).load() for p in paths}
    names = list(loads)
    L = loads[names[0]].shape[0]
    for label in changes:
        if label == "noise":
            label = f"noise {noise}"
        print(
            f"\n## real DeepSeek-V3 counts, {label}: {topo.num_nodes}x{topo.gpus_per_node} GPUs, "
            f"{topo.num_slots} slots, {L} layers ({topo.num_slots * L} replicas)"
        )
        rows = []
        for i, name in enumerate(names):
            old = loads[name]
            if label.startswith("noise"):
                new = old * np.random.default_rng(seed).lognormal(0.0, noise, old.shape)
            else:
                new = loads[names[(i + 1) % len(names)]]
            live = solvers.solve("greedy", old, topo)
            fresh_max = None
            gl = live.gpu_load(new)
            rows.append(
                (
                    name,
                    "keep live (no move)",
                    0,
                    f"{(gl.max(1) / gl.mean(1)).mean():.5f}",
                    "",
                    "",
                    "",
                )
            )
            for mode, opts in MODES:
                t = time.perf_counter()
                p = solvers.solve("repair" if opts else "greedy", new, topo, previous=live, **opts)
                sec = time.perf_counter() - t
                gpu = p.gpu_load(new)
                mx = gpu.max(1)
                if fresh_max is None:
                    fresh_max = mx
                fb = len(p.meta["solver"].get("incremental", {}).get("fresh_layers", []))
                rows.append(
                    (
                        "",
                        mode,
                        p.meta["solver"]["replicas_moved_total"],
                        f"{(mx / gpu.mean(1)).mean():.5f}",
                        f"{(mx / fresh_max).max():.5f}",
                        fb,
                        f"{sec:.3f}",
                    )
                )
        print(
            table(
                rows,
                ["load", "mode", "moved", "max/mean", "worst vs fresh", "fresh layers", "seconds"],
            )
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--interval", type=int, default=4)
    ap.add_argument("--history", type=int, default=2)
    ap.add_argument("--noise", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    topo = Topology(4, 8, 9)
    bench_replay(topo, args.interval, args.history)
    bench_real(topo, args.noise, args.seed)
    # two slots per GPU: fresh greedy pairs exactly; single moves get stuck above it
    bench_real(Topology(18, 8, 2), args.noise, args.seed, files=2, changes=("noise",))


if __name__ == "__main__":
    main()
