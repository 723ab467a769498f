"""``eplb replay``: periodic rebalancing over a trace's windows, scored without peeking."""

from __future__ import annotations

import argparse
from pathlib import Path

from eplb.cli import option_groups as og
from eplb.cli.common import check_groups, check_outputs, check_solver_options, parse_options
from eplb.errors import InputError
from eplb.format import data_size, text_table


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "replay",
        help="replay periodic rebalancing over a trace's windows",
        description="Walk TRACE window by window. Every --interval windows, solve a new "
        "placement from the last --history windows (or an exponential average, --ema); score "
        "each window with the placement that was live before it, and count the replicas and "
        "bytes moved by each rebalance. Window 0 runs on the solver's placement for a uniform "
        "load (no statistics yet).",
        epilog="example: eplb replay trace.npz --solver greedy --interval 4 --history 8 "
        "--topology 4x8 --slots 288 -o replay.csv --plot replay.png",
    )
    p.add_argument("trace", metavar="TRACE", help="trace file or directory (>= 2 windows)")
    og.solver(p, default="greedy")
    p.add_argument("--interval", type=int, default=1, metavar="N",
                   help="rebalance every N windows (default 1)")
    p.add_argument("--history", type=int, default=1, metavar="M",
                   help="solve from the last M windows (default 1; 0 = all past windows)")
    og.ema(p, over="the --history windows")
    og.topology(p, default="4x8", slots_note="default: experts rounded up to the GPUs + one "
                "per GPU")
    og.bandwidths(p)
    og.groups(p, topk="the trace's", topk_note="used with --dispatch")
    p.add_argument("--expert-bytes", type=float, metavar="B",
                   help="bytes per expert replica moved (default 44040192: DeepSeek-V3, FP8)")
    og.dispatch(p, default=None, what="also model all-to-all traffic per window under this "
                "dispatch policy")
    p.add_argument("--oracle", action="store_true",
                   help="also score each window with a placement solved on it (peeks: reference)")
    og.time_limit(p)
    og.solver_options(p, example="--option tolerance=0.002 for greedy's low-migration repair")
    og.seed(p, "the solver")
    p.add_argument("-o", "--output", metavar="CSV", help="write the per-window table as CSV")
    p.add_argument("--plot", metavar="PNG", help="write the replay curve")
    og.quiet(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # lazy: the library loads only when the verb runs, which keeps eplb --help fast
    from eplb import solvers
    from eplb.cli.recognise import read_trace_as
    from eplb.dispatch import check_policy
    from eplb.evaluation.replay import EXPERT_BYTES, replay, replay_summary, replay_topology
    from eplb.evaluation.tables import write_csv

    check_outputs({"TRACE": args.trace}, {"-o": args.output, "--plot": args.plot})
    solvers.get(args.solver)
    options = parse_options(args.option)
    check_solver_options(args.solver, options, previous=True)  # replay passes previous=
    if args.interval < 1:
        raise InputError(f"--interval must be a positive integer, got {args.interval}")
    if args.expert_bytes is not None and not (0 <= args.expert_bytes < float("inf")):
        raise InputError(f"--expert-bytes must be a number of bytes >= 0, got {args.expert_bytes}")
    if args.dispatch is not None:
        check_policy(args.dispatch)
    if args.history < 0:
        raise InputError(f"--history must be >= 0 (0 = all past windows), got {args.history}")
    trace = read_trace_as(args.trace)
    topo = replay_topology(trace.num_experts, args.topology, args.slots,
                           nvlink_gbps=args.nvlink_gbps, rdma_gbps=args.rdma_gbps)
    groups = args.groups if args.groups is not None else trace.meta.get("num_groups")
    check_groups(args.groups, trace.num_experts)
    if args.topk_groups is not None:  # needs groups (--groups or the trace's), with or without
        check_groups(groups, trace.num_experts, args.topk_groups)  # --dispatch
    frame = replay(
        trace, topo, solver=args.solver, interval=args.interval,
        history=args.history or None, ema=args.ema, num_groups=args.groups,
        expert_bytes=EXPERT_BYTES if args.expert_bytes is None else args.expert_bytes,
        policy=args.dispatch, oracle=args.oracle, seed=args.seed, time_limit=args.time_limit,
        solver_options=options, progress=not args.quiet,
        **({"topk_groups": args.topk_groups} if args.topk_groups else {}),
    )
    if args.output is not None:
        write_csv(frame, args.output)
    if args.plot is not None:
        from eplb.evaluation.plots import replay_curve  # lazy: matplotlib only for --plot

        replay_curve({args.solver: frame}, args.plot,
                     title=f"{Path(args.trace).name}: {args.solver}, every {args.interval} "
                     f"windows from {'all' if not args.history else args.history} past")
    s = replay_summary(frame)
    rows = [
        ("trace", f"{args.trace}: {trace.num_windows} windows, {trace.num_layers} layers, "
                  f"{trace.num_experts} experts"),
        ("topology", f"{topo.num_nodes} nodes x {topo.gpus_per_node} GPUs x "
                     f"{topo.slots_per_gpu} slots = {topo.num_slots} slots"),
        ("schedule", f"{args.solver} every {args.interval} windows from the last "
                     f"{args.history or 'all'} windows"
                     + (f", ema {args.ema}" if args.ema else "")),
        ("step max/mean GPU load", f"mean {s['step_max_over_mean_mean']:.4f}  "
                                   f"worst {s['step_max_over_mean_worst']:.4f} over "
                                   f"{int(s['windows'])} windows, each scored with the "
                                   "placement solved before it (stale by design)"),
        ("rebalances", f"{int(s['rebalances'])}"),
        ("replicas moved", f"{int(s['replicas_moved']):,} in all "
                           f"({data_size(s['bytes_moved'])})"
                           + (f", {s['replicas_moved'] / s['rebalances']:,.0f} per rebalance of "
                              f"{trace.num_layers * topo.num_slots:,} slots"
                              if s["rebalances"] else "")),
    ]
    if "oracle_step_max_over_mean_mean" in s:
        rows.append(("oracle (peeks)", f"mean {s['oracle_step_max_over_mean_mean']:.4f} "
                                       "(each window solved on itself: the best a rebalancer "
                                       "could do with perfect foresight)"))
    if "dispatch_step_max_over_mean_mean" in s:
        rows.append(("dispatched max/mean", f"mean {s['dispatch_step_max_over_mean_mean']:.4f} "
                     f"(step max/mean of the GPU picks as {args.dispatch} dispatch routes each "
                     "window's expected counts)"))
    if "rdma_bytes_mean" in s:
        rows.append(("RDMA per window", f"mean {data_size(s['rdma_bytes_mean'])} (all layers, "
                                        "dispatch + combine)"))
    rows += [("wrote", path) for path in (args.output, args.plot) if path is not None]
    print(text_table(rows))
    return 0
