"""``eplb evaluate``: balance and all-to-all traffic of a placement on a trace."""

from __future__ import annotations

import argparse
import dataclasses
import io
from pathlib import Path

import numpy as np

from eplb.atomic import atomic_write_bytes
from eplb.cli import option_groups as og
from eplb.cli.common import (
    check_groups,
    check_outputs,
    check_topology_hint,
    model_defaults,
    read_trace,
    topology_hint,
    windows_arg,
    with_model_groups,
)
from eplb.errors import InputError
from eplb.format import data_size, json_text, number, text_table
from eplb.placement import Placement


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "evaluate",
        help="score a placement on a trace: balance and NVLink/RDMA traffic",
        description="Score PLACEMENT on TRACE: per-layer GPU load balance (max/mean, "
        "balancedness, imbalance, ratio to the lower bound, node balance) and the modelled "
        "all-to-all traffic (tokens per GPU, NVLink and RDMA bytes, seconds). Token-level "
        "traces give exact counts; count traces give expectations (see evaluation.traffic).",
        epilog="example: eplb evaluate placement.json traces/data/zipf-58x256.npz "
        "--dispatch local_first --json",
    )
    p.add_argument("placement", metavar="PLACEMENT", help="placement file (.json/.npz/.yaml)")
    p.add_argument("trace", metavar="TRACE", help="trace file or directory")
    og.dispatch(p)
    p.add_argument("--source", default="auto", metavar="SRC",
                   help="routing source: auto, tokens, source_counts, load (default auto: the "
                   "most exact one the trace has)")
    og.windows(p, what="score (counts modes)")
    og.topology(p, note="for SGLang/TensorRT-LLM/vLLM placement files, which do not "
                     "store it")
    og.bandwidths(p, override=True)
    og.groups(p, default="--model's, else the trace's", topk="--model's, else the trace's")
    og.model(p, note="its expert groups, groups per token, top-k and hidden size are the "
             "defaults of --groups, --topk-groups, --top-k and --hidden")
    og.message_sizes(p, hidden="7168, DeepSeek-V3's; the output says when it is assumed")
    og.top_k(p, note="counts mode")
    og.seed(p, "the random and weighted policies")
    og.as_json(p)
    og.quiet(p, note="on stderr: token-level traffic, --dispatch lp")
    p.add_argument("-o", "--output", metavar="CSV", help="write the per-layer table as CSV")
    p.add_argument("--save-slots", metavar="NPY",
                   help="token-level input: save the slot of every pick, int[N, L, K] (.npy)")
    p.add_argument("--plot", metavar="PNG", help="write a per-layer GPU-load heatmap")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # lazy: the library loads only when the verb runs, which keeps eplb --help fast
    from eplb.cli.recognise import check_not_swapped, read_placement_as
    from eplb.dispatch import check_policy
    from eplb.evaluation.evaluate import SOURCES, evaluate
    from eplb.evaluation.tables import write_csv

    check_outputs({"PLACEMENT": args.placement, "TRACE": args.trace, "--model": args.model},
                  {"-o": args.output, "--save-slots": args.save_slots, "--plot": args.plot})
    model_defaults(args, routing=True)  # groups, top-k, hidden from --model
    for flag, value in (("--hidden", args.hidden), ("--top-k", args.top_k)):
        if value is not None and value < 1:
            raise InputError(f"{flag} must be >= 1, got {value}")
    for flag, value in (("--dispatch-bytes", args.dispatch_bytes),
                        ("--combine-bytes", args.combine_bytes)):
        if not (0 < value < float("inf")):
            raise InputError(f"{flag} must be a positive number of bytes, got {value}")
    check_policy(args.dispatch)
    if args.source not in SOURCES:
        raise InputError(f"--source {args.source!r}: use auto, tokens, source_counts or load")
    check_not_swapped(args.placement, args.trace)
    topo_hint = topology_hint(args.topology, args.slots)
    placement = read_placement_as(args.placement, topology=topo_hint)
    check_topology_hint(placement, topo_hint, args.placement)
    over = {k: v for k, v in (("nvlink_gbps", args.nvlink_gbps), ("rdma_gbps", args.rdma_gbps))
            if v is not None}
    if over:
        topo = dataclasses.replace(placement.topology, **over)  # validates the bandwidths
        placement = Placement(placement.phy2log, placement.num_experts, topo,
                              placement.replica_share, placement.meta, placement.layer_ids)
    trace, _ = with_model_groups(read_trace(args.trace))  # groups of a model it names
    windows = windows_arg(args.windows)
    if windows is not None:
        trace.window_index(windows)  # an out-of-range selection fails here, by name
    # the flags' own messages; evaluate() checks the same under its parameter names
    check_groups(args.groups if args.groups is not None else trace.meta.get("num_groups"),
                 trace.num_experts, args.topk_groups,
                 flag="--groups" if args.groups is not None else "the trace's num_groups")
    if args.source == "tokens" and windows is not None:
        raise InputError("--windows applies to counts; token-level traffic uses every token")
    ev = evaluate(placement, trace, policy=args.dispatch, source=args.source, windows=windows,
                  num_groups=args.groups, topk_groups=args.topk_groups, hidden=args.hidden,
                  dispatch_bytes=args.dispatch_bytes, combine_bytes=args.combine_bytes,
                  top_k=args.top_k, seed=args.seed, progress=not args.quiet)
    placement, report, balance = ev.placement, ev.traffic, ev.balance
    from eplb.evaluation.traffic import trace_ranks  # lazy: the library loads with the verb

    ranks, gpus = trace_ranks(trace), placement.topology.num_gpus  # a trace's source ranks
    if args.save_slots is not None:
        if report.slots is None:
            if trace.topk_ids is not None and ranks and gpus % ranks:
                raise InputError(
                    f"--save-slots: the trace's {ranks} source ranks do not divide the {gpus} "
                    "GPUs, so its tokens were not replayed; evaluate on a multiple of "
                    f"{ranks} GPUs")
            if trace.topk_ids is not None:
                raise InputError("--save-slots needs the token-level replay: drop --windows "
                                 "and --source (or give --source tokens)")
            raise InputError("--save-slots needs token-level input (a trace with topk_ids)")
        buf = io.BytesIO()
        np.save(buf, report.slots, allow_pickle=False)
        atomic_write_bytes(args.save_slots, buf.getvalue())
    if args.output is not None:
        write_csv(ev.layers, args.output)
    if args.plot is not None:
        from eplb.evaluation.plots import gpu_heatmap  # lazy: matplotlib only for --plot

        gpu_heatmap({"GPU tokens": report.gpu_tokens}, args.plot, layer_ids=trace.layer_ids,
                    title=f"{Path(args.placement).name} on {Path(args.trace).name}, "
                    f"{args.dispatch} dispatch",
                    gpus_per_node=placement.topology.gpus_per_node)
    assumed, hidden = ev.assumed, int(report.meta["hidden"])
    if args.json:
        doc = {"placement": str(args.placement), "trace": str(args.trace), **ev.to_dict()}
        print(json_text(doc, indent=1))  # strict JSON: NaN/inf as null
        return 0
    from eplb.evaluation.balance import BOUND_NAME  # lazy: keeps eplb --help fast

    topo = placement.topology
    totals, per, layer_tokens = ev.totals, ev.per_token_layer, ev.layer_tokens
    mode = {"tokens": "exact (token-level)", "source_counts": "expected (per-rank counts)",
            "load": "expected (sources spread evenly)"}[report.mode]
    if report.mode == "load" and ranks and gpus % ranks:  # per-rank data the model cannot use
        mode += (f"; the trace's {ranks} source ranks do not divide the {gpus} GPUs, so its "
                 f"per-rank counts are unused (evaluate on a multiple of {ranks} GPUs to use them)")
    bound = balance["max_over_bound_mean"]
    rows = [
        ("placement", f"{args.placement} ({topo.num_nodes} nodes x {topo.gpus_per_node} GPUs x "
                      f"{topo.slots_per_gpu} slots)"),
        ("trace", f"{args.trace}: {trace.num_windows} windows, {trace.num_layers} layers, "
                  f"{trace.num_experts} experts"),
        ("load", f"{'all windows' if windows is None else args.windows}: "
                 f"{layer_tokens.mean():,.0f} tokens per layer (mean over "
                 f"{len(layer_tokens)} layers), top-{report.meta['top_k']}"
                 + (" (assumed: the trace records no top_k; pass --top-k K)"
                    if "top_k" in assumed else "")),
        ("max GPU load / lower bound", "n/a (solvers.analysis.bounds not available)"
         if np.isnan(bound) else f"mean {bound:.4f}  worst "
         f"{balance['max_over_bound_worst']:.4f} over layers (1 = provably optimal; "
         f"{BOUND_NAME}, any placement)"),
        *([("max GPU load / group bound",
            f"mean {balance['max_over_group_bound_mean']:.4f}  worst "
            f"{balance['max_over_group_bound_worst']:.4f} (bound for placements keeping each "
            "expert group on one node)")] if "max_over_group_bound_mean" in balance else []),
        ("step max/mean GPU load", f"{balance['step_max_over_mean']:.4f} (sum over layers of "
                                   "the max GPU load / sum of the mean)"),
        ("max/mean GPU load", f"mean {balance['max_over_mean_mean']:.4f}  "
                              f"worst {balance['max_over_mean_worst']:.4f} over layers"),
        ("balancedness mean/max", f"mean {balance['balancedness_mean']:.4f}  "
                                  f"min {balance['balancedness_min']:.4f} over layers"),
        ("imbalance (max-mean)/mean", f"mean {balance['imbalance_mean']:.4f} over layers"),
        ("node max/mean", f"mean {balance['node_max_over_mean_mean']:.4f} over layers"),
        *([("routing groups", "none: the trace records no expert groups (SGLang dumps carry "
                              "none), so traffic assumes unrestricted top-k routing; for "
                              "DeepSeek-V3 pass --groups 8 --topk-groups 4")]
          if not report.meta.get("groups") and args.groups is None
          and report.mode != "tokens" else []),  # token-level: the recorded picks decide
        ("traffic", f"{mode}, dispatch {args.dispatch}, top-{report.meta['top_k']}"
                    + (f", groups {report.meta['groups'][1]} of {report.meta['groups'][0]}"
                       if report.meta.get("groups") else "")
                    + f", {hidden} x {args.dispatch_bytes:g} B dispatch / "
                      f"{args.combine_bytes:g} B combine per element"
                    + (f" (hidden {hidden} assumed: DeepSeek-V3's; pass --hidden H for "
                       "another model)" if "hidden" in assumed else "")),
        ("GPU picks as dispatched", f"step max/mean {ev.dispatched_max_over_mean:.4f} "
                                    f"({args.dispatch} dispatch; the rows above use the "
                                    "placement's even split)"),
        ("NVLink bytes", f"{per['nvlink_bytes']:,.0f} B per token per layer; "
                         f"{data_size(totals['nvlink_bytes'])} in all (dispatch + combine, "
                         f"{len(layer_tokens)} layers)"),
        ("RDMA bytes", f"{per['rdma_bytes']:,.0f} B per token per layer; "
                       f"{data_size(totals['rdma_bytes'])} in all (dispatch + combine, "
                       f"{len(layer_tokens)} layers)"),
        ("all-to-all time", f"{number(per['alltoall_seconds'] * 1e9)} us per 1k tokens per "
                            f"layer; {number(totals['alltoall_seconds'] * 1e3)} ms in all "
                            f"(dispatch {number(totals['dispatch_seconds'] * 1e3)} + combine "
                            f"{number(totals['combine_seconds'] * 1e3)}, {len(layer_tokens)} "
                            "layers, modelled bandwidth bound)"),
    ]
    rows += [("wrote", path) for path in (args.output, args.save_slots, args.plot)
             if path is not None]
    print(text_table(rows))
    return 0
