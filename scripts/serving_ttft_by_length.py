"""TTFT by prompt length at light load (issue 24 part 3: why the 90%-goodput rate is so low on
long-prompt traces): the shared Mooncake conversation trace replayed at ``--rate`` req/s on a
preset, per input-length band the requests, the TTFT p50, the share missing the TTFT SLO and
the prefill p50 (prefill start to end), with ``scheduler.prefill_chunking`` as given.

    python scripts/serving_ttft_by_length.py [--rate 0.4] [--duration 1000] [--warmup 100]
        [--chunking attention|tokens|context_parallel] [--config deepseek_day6]
"""

from __future__ import annotations

import argparse
import dataclasses

from eplb.data_dirs import requests_dir
from eplb.evaluation.serving import ClusterConfig, rescale, simulate, workload

TRACE = requests_dir()
BANDS = ((0, 4_000), (4_000, 8_000), (8_000, 16_000), (16_000, 32_000), (32_000, 10**9))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--config", default="deepseek_day6", choices=["deepseek_day6", "sglang_96xh100"]
    )
    ap.add_argument("--rate", type=float, default=0.4)
    ap.add_argument("--duration", type=float, default=1000.0)
    ap.add_argument("--warmup", type=float, default=100.0)
    ap.add_argument(
        "--chunking", default="attention", choices=["attention", "tokens", "context_parallel"]
    )
    args = ap.parse_args(argv)
    cfg = getattr(ClusterConfig, args.config)()
    cfg = cfg.replace(scheduler=dataclasses.replace(cfg.scheduler, prefill_chunking=args.chunking))
    wl = rescale(workload.read(TRACE / "mooncake_conversation.jsonl"), rate=args.rate)
    res = simulate(cfg, wl, duration_s=args.duration, progress=False)
    s = res.summary(window=(args.warmup, args.duration))
    r = res.requests
    r = r[(r.arrival_s >= args.warmup) & (r.arrival_s < args.duration)]
    slo = cfg.slo.ttft_s
    print(
        f"{args.config}, Mooncake conversation at {args.rate:g} req/s, chunking {args.chunking}: "
        f"goodput {s['goodput']:.2f}, TTFT p50 {s['ttft_p50_s']:.2f} s, "
        f"{len(r)} requests, TTFT > {slo:g} s: {(r.ttft_s > slo).mean():.0%}"
    )
    print("| input tokens | requests | TTFT p50 | TTFT > SLO | prefill p50 |")
    print("|---|---|---|---|---|")
    for lo, hi in BANDS:
        m = (r.input_tokens >= lo) & (r.input_tokens < hi)
        band = f"{lo:,}+" if hi == 10**9 else f"{lo:,}-{hi:,}"
        pre = (r.prefill_end_s - r.prefill_start_s)[m].median()
        print(
            f"| {band} | {int(m.sum())} | {r.ttft_s[m].median():.2f} s | "
            f"{(r.ttft_s[m] > slo).mean():.0%} | {pre:.2f} s |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
