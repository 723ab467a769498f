"""A GPU failure on the Day-6 preset under each emergency mode (issue 24, part 6): what the
emergency placement moves and stalls, the balance it leaves until the next scheduled
rebalance, and what that rebalance then moves.

    python scripts/serving_failures.py                 # print the table
    python scripts/serving_failures.py --write-docs    # replace the block in docs/serving.md
    python scripts/serving_failures.py --workers 3     # the three modes side by side

The scenario: the Day-6 preset as it is (rebalancing every 600 s from the last 600 s,
starting from a placement of the 600 s before), the published Day-6 traffic mix at
``--rate`` req/s, prefill GPU 3 and decode GPU 5 failing at ``--fail-at`` seconds, run until
120 s after the first scheduled rebalance.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

from docblock import update_doc

from eplb import runners
from eplb.evaluation import serving
from eplb.evaluation.serving.workload import day6

DOC = Path(__file__).resolve().parents[1] / "docs" / "serving.md"
MODES = ("resolve", "patch", "repair")


def run_mode(task: dict) -> dict:
    """One simulation of the scenario with ``eplb.emergency = task["mode"]``."""
    base = serving.ClusterConfig.deepseek_day6()
    t_fail, rate = task["fail_at"], task["rate"]
    interval = base.eplb.rebalance_interval_s
    cfg = base.replace(
        eplb=replace(base.eplb, emergency=task["mode"]),
        faults=[
            serving.GpuFailure(t_fail, ("prefill", 0), gpu=3),
            serving.GpuFailure(t_fail, ("decode", 0), gpu=5),
        ],
    )
    end = interval + 120.0
    wl = day6.day6_workload(int(rate * end * 1.05) + 100, rate=rate, seed=0)
    start = time.perf_counter()
    res = serving.simulate(cfg, wl, seed=0, duration_s=end, progress=False)
    topo = {ph: cfg.topology(ph) for ph in ("prefill", "decode")}
    layers = cfg.model_spec.moe_layers
    return {
        "mode": task["mode"],
        "faults": res.faults,
        "rebalances": res.rebalances,
        "replicas": {ph: (t.num_slots - t.slots_per_gpu) * layers for ph, t in topo.items()},
        "between": res.summary(window=(t_fail, interval)),
        "after": res.summary(window=(interval, end)),
        "interval": interval,
        "wall_s": time.perf_counter() - start,
    }


def table(results: list[dict], rate: float, fail_at: float, wall: float) -> str:
    interval = results[0]["interval"]
    lines = [
        f"Day-6 preset (`deepseek` EPLB every {interval:.0f} s from the last {interval:.0f} s, "
        f"overlapped copies at 50 GB/s per GPU), published traffic mix at {rate:g} req/s, "
        f"prefill GPU 3 and decode GPU 5 failing at {fail_at:g} s, seed 0. *Moved* counts "
        "replicas loaded onto a GPU that did not hold them, out of the unit's surviving "
        "replicas (slots x 58 layers); balance is the mean over layers of max / mean GPU load "
        "on the load the placement was made from (the recorded last 600 s).",
        "",
        "| emergency | phase | orphaned (expert-layers) | emergency: moved | stall (s) | "
        f"balance after | scheduled rebalance at {interval:.0f} s: moved | "
        "kind, gain, balance before -> after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rb = r["rebalances"]
        for phase in ("prefill", "decode"):
            f = r["faults"][r["faults"]["phase"] == phase].iloc[0]
            em = rb[(rb["phase"] == phase) & (rb["kind"] == "emergency")]
            nxt = rb[(rb["phase"] == phase) & (rb["kind"] != "emergency")
                     & (rb["time_s"] > fail_at)]
            total = r["replicas"][phase]
            moved = int(f["emergency_replicas_moved"])
            bal = em["expected_balance_after"].iloc[0] if len(em) else float("nan")
            if len(nxt):
                n = nxt.iloc[0]
                later = (f"{int(n['replicas_moved']):,} ({n['replicas_moved'] / total:.1%})",
                         f"{n['kind']}, predicted gain {n['predicted_gain']:+.2%}: "
                         f"{n['expected_balance_before']:.3f} -> {n['expected_balance_after']:.3f}")
            else:
                later = ("-", "-")
            lines.append(
                f"| {r['mode']} | {phase} | {int(f['orphaned_experts']):,} | {moved:,} "
                f"({moved / total:.1%}) | {f['stall_s']:.3f} | {bal:.3f} | {later[0]} | "
                f"{later[1]} |"
            )
    lines += [
        "",
        "(*balance before -> after* of the scheduled rebalance is on the coming 600 s of "
        "expected load, `expected_balance_*`; its *gain* is predicted on the recorded load.)",
        "",
        f"| emergency | TPOT p50 (ms), {fail_at:g}-{interval:.0f} s | TTFT p50 (s), same | "
        f"goodput, same | decode max/mean GPU load, same | TPOT p50 (ms), after {interval:.0f} s "
        "| stall (s), whole run |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        b, a = r["between"], r["after"]
        lines.append(
            f"| {r['mode']} | {b['tpot_p50_s'] * 1e3:.1f} | {b['ttft_p50_s']:.2f} | "
            f"{b['goodput']:.3f} | {b['decode_gpu_load_max_over_mean']:.3f} | "
            f"{a['tpot_p50_s'] * 1e3:.1f} | {b['stall_s'] + a['stall_s']:.3f} |"
        )
    lines += ["", f"(`python scripts/serving_failures.py`: {wall / 60:.1f} min wall.)"]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=40.0, help="req/s (default 40)")
    ap.add_argument("--fail-at", type=float, default=120.0, help="seconds (default 120)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    start = time.perf_counter()
    tasks = [{"mode": m, "rate": args.rate, "fail_at": args.fail_at} for m in MODES]
    results = runners.run(run_mode, tasks, workers=args.workers, progress=True,
                          desc="failures", unit="run")
    text = table(results, args.rate, args.fail_at, time.perf_counter() - start)
    print(text)
    if args.write_docs:
        update_doc(DOC, {"sim-failures": text}, check=False,
                   script="serving_failures.py --write-docs")


if __name__ == "__main__":
    main()
