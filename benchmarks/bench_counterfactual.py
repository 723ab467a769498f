"""Benchmark (issue 20 target): a 3-seed, 3-policy counterfactual comparison on the Day-6
preset in <= 5 minutes on 2 cores, with 95% intervals that separate ``trivial`` (no EPLB:
slot p holds expert p mod E), ``deepseek`` (DeepSeek's EPLB solved on the 10 minutes before)
and ``balanced`` (the perfectly balanced reference, `counterfactual.balanced_step`).

The Day-6 preset (one prefill unit EP32 + one decode unit EP144, H800) under the
``balanced_units`` Day-6 mix at 0.9 x Day-6 per-node prefill load (as scripts/simulate_day6.py
``worth`` uses), ``--minutes`` simulated per seed; every seed is one closed-loop run of the
baseline plus three replays. Prints the table (mean and 95% interval over seeds, paired
difference to ``trivial``) and the wall time.

    python benchmarks/bench_counterfactual.py [--minutes 5] [--workers 2] [--seeds 0,1,2]
        [--biased]   # also ROCm ATOM's biased baseline
"""

from __future__ import annotations

import argparse
import time

from eplb.evaluation import serving
from eplb.evaluation.serving.config import EplbConfig
from eplb.evaluation.serving.intervals import ci_table
from eplb.evaluation.serving.workload import day6
from eplb.format import text_table

METRICS = ("prefill_step_s", "decode_step_s", "prefill_ep_wait_s", "decode_ep_wait_s",
           "decode_comm_exposed_s", "prefill_gpu_load_max_over_mean",
           "decode_gpu_load_max_over_mean")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--biased", action="store_true",
                    help="add the biased policy (top-K fully replicated, solved on history)")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    base = serving.ClusterConfig.deepseek_day6()
    stats = day6.mix_stats(day6.day6_workload(20_000, 100.0, mix="balanced_units", seed=0))
    rate = 0.9 * day6.DAY6["prefill_input_tok_s_per_node"] * base.prefill.nodes / stats[
        "input_mean"]
    span = 60.0 * args.minutes
    wl = day6.day6_workload(int(rate * span) + 100, rate, mix="balanced_units", seed=7)
    cfgs = {
        "trivial": base.replace(eplb=EplbConfig(solver="static", initial="trivial"),
                                name="trivial"),
        "deepseek": base.replace(name="deepseek"),
        "balanced": base.replace(eplb=EplbConfig(solver="balanced"), name="balanced"),
    }
    if args.biased:
        cfgs["biased"] = base.replace(
            eplb=EplbConfig(solver="biased", rebalance_interval_s=600.0, history_s=600.0,
                            initial="history"),
            name="biased")
    start = time.perf_counter()
    frame = serving.compare(cfgs, wl, seeds, mode="counterfactual", duration_s=span,
                            workers=args.workers, progress=True)
    wall = time.perf_counter() - start
    table = ci_table(frame, METRICS)
    rows = []
    for m in METRICS:
        for name in table.index:
            r = table.loc[name, m]
            rows.append((m, name, f"{r['mean']:.5g}", f"[{r['lo']:.5g}, {r['hi']:.5g}]",
                         f"{r['d_mean']:+.4g}", f"[{r['d_lo']:+.4g}, {r['d_hi']:+.4g}]"))
    print(text_table(rows, header=("metric (s or ratio)", "config", "mean", "95% CI",
                                   "d vs trivial", "95% CI of d")))
    # the target: do the 95% intervals separate every pair of policies, per phase? The
    # means' intervals (disjoint or not) and the paired differences (seed by seed; excludes 0)
    names = list(cfgs)
    for m in ("prefill_step_s", "decode_step_s"):
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                ra, rb = table.loc[a, m], table.loc[b, m]
                disjoint = ra["hi"] < rb["lo"] or rb["hi"] < ra["lo"]
                d = ci_table(frame, [m], baseline=a).loc[b, m]
                zero = "excludes" if d["d_lo"] > 0 or d["d_hi"] < 0 else "INCLUDES"
                print(f"{m} {b} - {a}: paired {d['d_mean']:+.4g} s [{d['d_lo']:+.4g}, "
                      f"{d['d_hi']:+.4g}] ({zero} 0); means' intervals "
                      f"{'disjoint' if disjoint else 'OVERLAP'}")
    steps = frame.attrs["steps"]
    print(f"\n{len(steps):,} replayed steps; {len(seeds)} seeds x {len(cfgs)} policies, "
          f"{args.minutes:g} simulated min each, rate {rate:.1f} req/s, workers "
          f"{args.workers}: wall {wall:.1f} s")


if __name__ == "__main__":
    main()
