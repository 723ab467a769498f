"""Benchmark: what ``lp`` dispatch (the exact per-batch min-max split over replicas) costs the
serving simulator, against ``even`` dispatch in the same process (issue 21 target: <= 2x).

The Day-6 preset (one prefill EP32 + one decode EP144 unit, `deepseek` EPLB) under Day-6-like
traffic at Day-6 per-node load (as `bench_simulator.py`'s headline), a few simulated minutes
per dispatch rule. Prints wall and CPU seconds, steps and the ratios lp / even, plus TTFT /
TPOT p50 and per-node throughput of each run (``lp_overhead_s`` at its default and at 0), and
the load average (on a shared machine the CPU ratio moves less than the wall ratio). The issue's
benchmark is one simulated hour (``--minutes 60``).

    python benchmarks/bench_dispatch_lp.py [--minutes 3]
"""

from __future__ import annotations

import argparse
import os
import time

from eplb.evaluation import serving
from eplb.evaluation.serving.workload import day6


def run(cfg, rate: float, seconds: float) -> dict:
    wl = day6.day6_workload(int(rate * seconds * 1.02) + 50, rate, mix="balanced_units", seed=0)
    start, cpu = time.perf_counter(), time.process_time()
    res = serving.simulate(cfg, wl, seed=0, duration_s=seconds, progress=False)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    s = res.summary(window=(seconds / 3, seconds))
    steps = res.steps["phase"].value_counts().to_dict()
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "steps": sum(steps.values()),
        "ttft_p50_s": s["ttft_p50_s"],
        "tpot_p50_s": s["tpot_p50_s"],
        "output_tok_s_per_node": s["output_tok_s_per_node"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=3.0, help="simulated minutes per run")
    args = ap.parse_args()
    seconds = 60.0 * args.minutes
    base = serving.ClusterConfig.deepseek_day6()
    wl = day6.day6_workload(2000, 1.0, mix="balanced_units", seed=0)
    mean_in = float(wl.requests["input_tokens"].mean())
    rate = day6.DAY6["prefill_input_tok_s_per_node"] * 4 / mean_in
    print(f"Day-6 preset, {rate:.1f} req/s, {args.minutes:g} simulated min per run; "
          f"load average {os.getloadavg()[0]:.2f}")
    run(base, rate, 10.0)  # warm-up (imports, tables built on first use), not timed
    rows = {}
    for name, cfg in (
        ("even", base.replace(dispatch="even")),
        ("lp", base.replace(dispatch="lp")),
        ("lp, no overhead", base.replace(dispatch="lp", lp_overhead_s=0.0)),
    ):
        rows[name] = r = run(cfg, rate, seconds)
        print(
            f"{name:16s} wall {r['wall_s']:7.1f} s  CPU {r['cpu_s']:7.1f} s  "
            f"steps {r['steps']:6d}  "
            f"TTFT p50 {r['ttft_p50_s']:.3f} s  TPOT p50 {1e3 * r['tpot_p50_s']:.1f} ms  "
            f"output {r['output_tok_s_per_node']:,.0f} tok/s/node"
        )
    ratio = rows["lp"]["wall_s"] / rows["even"]["wall_s"]
    cpu = rows["lp"]["cpu_s"] / rows["even"]["cpu_s"]
    print(f"lp / even: wall {ratio:.2f}x, CPU {cpu:.2f}x (target <= 2x); "
          f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
