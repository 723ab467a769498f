"""``eplb simulate``: run the serving simulator on a cluster config and a workload.

Writes an output folder all at once (built in a hidden temporary folder beside it, renamed at
the end): ``summary.json`` (summary and run metadata), ``requests.parquet``, ``steps.parquet``,
``rebalances.csv``, ``faults.csv``, ``utilisation.parquet``, ``config.toml`` (the config as
run) and ``plots/`` (TTFT/TPOT CDFs, tokens/s per node over time, per-rank utilisation,
step-time breakdown).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from eplb.atomic import atomic_directory
from eplb.errors import InputError

PRESETS = ("deepseek_day6", "sglang_96xh100")  # named in --help; the library checks


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="simulate a PD-disaggregated serving cluster (TTFT, TPOT, tok/s per node)",
        description="Simulate a prefill/decode-disaggregated MoE serving cluster: DP balancers, "
        "KV store and transfers, expert placement with EPLB rebalancing in the loop, GPU "
        "failures. Prints a summary table and writes OUTDIR (summary.json, requests.parquet, "
        "steps.parquet, rebalances.csv, faults.csv, utilisation.parquet, config.toml, plots/).",
        epilog="examples: eplb simulate cluster.toml --workload "
        "../shared/requests/mooncake_conversation.jsonl --rate 20 --duration 600 -o run1; "
        "eplb simulate deepseek_day6 --workload synth:n=20000,rate=60,hit_rate=0.563 -o run2",
    )
    p.add_argument(
        "config",
        metavar="CONFIG",
        help="cluster config TOML file (ClusterConfig), or a preset name: " + ", ".join(PRESETS),
    )
    p.add_argument(
        "--workload",
        required=True,
        metavar="PATH|synth:KEY=VALUE,...",
        help="a workload file (Mooncake .jsonl, Azure .csv, .csv/.parquet) or a synthetic "
        "spec 'synth:n=N,rate=R,...' with the keys of `eplb workload synth`",
    )
    scale = p.add_mutually_exclusive_group()
    scale.add_argument(
        "--rate", type=float, metavar="REQ/S", help="replay the workload at this mean rate"
    )
    scale.add_argument(
        "--speedup", type=float, metavar="X", help="replay the workload X times faster"
    )
    p.add_argument("--head", type=int, metavar="N", help="use the first N requests only")
    p.add_argument(
        "--duration",
        type=float,
        metavar="S",
        help="stop after S simulated seconds (default: run until every request has finished)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument(
        "--window",
        metavar="T0:T1",
        help="summarise over simulated seconds [T0, T1) (default: the whole run)",
    )
    p.add_argument("-o", "--output", required=True, metavar="OUTDIR", help="output folder")
    p.add_argument("--force", action="store_true", help="replace OUTDIR if it exists (atomically)")
    p.add_argument("--no-plots", action="store_true", help="skip the plots")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def load_workload(args: argparse.Namespace, block_size: int):
    from eplb.evaluation.serving import workload as W  # lazy: keeps eplb --help fast

    wl = W.from_spec(args.workload, block_size=block_size)
    if args.head is not None:
        if args.head < 1:
            raise InputError(f"--head must be >= 1, got {args.head}")
        wl = wl.head(args.head)
    if args.rate is not None or args.speedup is not None:
        wl = W.rescale(wl, rate=args.rate, speedup=args.speedup)
    return wl


def _window(text: str | None):
    if text is None:
        return None
    a, sep, b = text.partition(":")
    try:
        t0, t1 = float(a), float(b)
    except ValueError:
        raise InputError(f"--window {text!r} is not T0:T1 in seconds (e.g. 600:3600)") from None
    if not sep or not (t1 > t0 >= 0):
        raise InputError(f"--window {text!r} needs 0 <= T0 < T1 (seconds)")
    return (t0, t1)


def _check_output(out: Path, force: bool) -> None:
    if out.exists():
        if not out.is_dir():
            raise InputError(f"-o {out} exists and is not a folder; choose another path")
        if any(out.iterdir()) and not force:
            raise InputError(
                f"-o {out} exists and is not empty; choose a new folder or pass --force"
            )
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"cannot write {out}: folder {parent} does not exist")


def run(args: argparse.Namespace) -> int:
    from eplb.evaluation.serving import ClusterConfig, simulate  # lazy: keeps --help fast

    out = Path(args.output)
    _check_output(out, args.force)
    window = _window(args.window)
    config = ClusterConfig.load(args.config)
    if args.duration is not None and not (args.duration > 0 and math.isfinite(args.duration)):
        raise InputError(f"--duration must be seconds > 0, got {args.duration}")
    workload = load_workload(args, config.kv.block_size)
    result = simulate(
        config,
        workload,
        seed=args.seed,
        duration_s=args.duration,
        progress=not args.no_progress,
    )
    with atomic_directory(out) as tmp:  # OUTDIR appears all at once, or not at all
        result.save(tmp, config, window=window, plots=not args.no_plots)
    print(result.summary_table(window))
    print(
        f"\nwrote {out}/ ({len(result.requests):,} requests, {len(result.steps):,} steps, "
        f"{len(result.rebalances)} rebalance rows: scheduled, skipped and emergency)"
    )
    return 0
