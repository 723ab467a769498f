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
3. Chain repair at two slots per GPU (18 x 8 GPUs, 288 slots, issue 14), on the two real
   decode files: the live placement is greedy's for one file's counts; the new load is (a)
   those counts times lognormal noise (sigma 0.05 and 0.1, seeded) and (b) the file's traffic
   mix drifted a share ``alpha`` toward the other decode workload (per layer, shares
   ``(1 - alpha) * own + alpha * other``, scaled to the file's tokens; ``alpha = 1`` is a full
   workload switch). ``repair`` with ``tolerance=0.005`` (every layer within 0.5% of a fresh
   greedy solve), with and without ``chains``, against fresh greedy relabeled with
   ``previous=``. Target (issue 14): at most 20% of the fresh solve's moves.

    python benchmarks/bench_incremental.py [--interval 4] [--history 2] [--noise 0.05]
                                           [--only replay real chains]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from eplb import Topology, solvers, traces
from eplb.data_dirs import traces_dir
from eplb.evaluation.replay import replay
from eplb.format import text_table

REPO = Path(__file__).resolve().parents[1]
BUNDLED = REPO / "traces" / "data" / "deepseek-v3-calibrated.npz"
REAL = traces_dir() / "deepseek-v3-sglang"
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
        text_table(
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
            text_table(
                rows,
                ["load", "mode", "moved", "max/mean", "worst vs fresh", "fresh layers", "seconds"],
            )
        )


def drifted(own: np.ndarray, other: np.ndarray, alpha: float) -> np.ndarray:
    """``own`` with a share ``alpha`` of each layer's traffic following ``other``'s mix."""
    mix = (1 - alpha) * own / own.sum(1, keepdims=True) + alpha * other / other.sum(
        1, keepdims=True
    )
    return mix * own.sum(1, keepdims=True)


CHAIN_TOLERANCE = 0.005
CHAIN_TARGET = 0.20


def bench_chains(seed: int) -> None:
    """Section 3 of the module docstring."""
    topo = Topology(18, 8, 2)
    paths = sorted(REAL.glob("decode_*.json"))
    if len(paths) < 2:
        print(f"\n(real decode traces not found at {REAL}: skipped)")
        return
    loads = {p.stem: traces.read(p).load() for p in paths}
    names = list(loads)
    L = loads[names[0]].shape[0]
    print(
        f"\n## chain repair, {topo.num_nodes}x{topo.gpus_per_node} GPUs, {topo.num_slots} slots "
        f"(2 per GPU), {L} layers ({topo.num_slots * L} replicas), tolerance "
        f"{CHAIN_TOLERANCE}: replicas moved, and as a share of fresh greedy + relabel's"
    )
    rows = []
    for i, name in enumerate(names):
        old = loads[name]
        other = loads[names[(i + 1) % len(names)]]
        cases = [
            (f"noise {s}", old * np.random.default_rng(seed).lognormal(0, s, old.shape))
            for s in (0.05, 0.1)
        ]
        cases += [(f"drift {a}", drifted(old, other, a)) for a in (0.1, 0.25, 0.5, 1.0)]
        live = solvers.solve("greedy", old, topo)
        for label, new in cases:
            fresh = solvers.solve("greedy", new, topo, previous=live)
            n_fresh = fresh.meta["solver"]["replicas_moved_total"]
            fresh_max = fresh.gpu_load(new).max(1)
            out = [name if label == cases[0][0] else "", label, n_fresh]
            for chains in (False, True):
                t = time.perf_counter()
                p = solvers.solve(
                    "repair", new, topo, previous=live, tolerance=CHAIN_TOLERANCE, chains=chains
                )
                sec = time.perf_counter() - t
                n = p.meta["solver"]["replicas_moved_total"]
                worst = (p.gpu_load(new).max(1) / fresh_max).max()
                inc = p.meta["solver"]["incremental"]
                out += [n, f"{n / n_fresh:.3f}"]
                if chains:
                    out += [
                        f"{worst:.4f}",
                        len(inc["chain_layers"]),
                        len(inc["fresh_layers"]),
                        f"{sec:.2f}",
                        "yes"
                        if n <= CHAIN_TARGET * n_fresh and worst <= 1 + CHAIN_TOLERANCE + 1e-9
                        else "no",
                    ]
            rows.append(tuple(out))
    print(
        text_table(
            rows,
            [
                "live load",
                "new load",
                "fresh moved",
                "single moved",
                "share",
                "chains moved",
                "share",
                "worst vs fresh",
                "chain layers",
                "fresh layers",
                "seconds",
                "target",
            ],
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--interval", type=int, default=4)
    ap.add_argument("--history", type=int, default=2)
    ap.add_argument("--noise", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--only",
        nargs="+",
        choices=["replay", "real", "chains"],
        default=["replay", "real", "chains"],
    )
    args = ap.parse_args()
    topo = Topology(4, 8, 9)
    if "replay" in args.only:
        bench_replay(topo, args.interval, args.history)
    if "real" in args.only:
        bench_real(topo, args.noise, args.seed)
        # two slots per GPU: fresh greedy pairs exactly; repair adds chain repair there
        bench_real(Topology(18, 8, 2), args.noise, args.seed, files=2, changes=("noise",))
    if "chains" in args.only:
        bench_chains(args.seed)


if __name__ == "__main__":
    main()
