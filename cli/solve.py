"""``eplb solve``: place a load matrix on a topology and write a placement file."""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

from eplb.cli import option_groups as og
from eplb.cli.common import (
    GROUPS_HINT,
    check_groups,
    check_outputs,
    check_solver_options,
    failed_gpus_arg,
    parse_options,
    print_notes,
    read_trace,
    solvers_epilog,
    windows_arg,
    with_model_groups,
)
from eplb.errors import InputError
from eplb.format import text_table
from eplb.topology import Topology

EXAMPLE = ("example: eplb solve traces/data/deepseek-v3-calibrated.npz --topology 4x8 "
           "--slots 288 --groups 8 --solver greedy -o placement.json")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "solve",
        help="compute a placement for a load matrix",
        description="Compute a replicated expert placement for LOAD (a trace or load matrix: "
        ".npz, .npy, SGLang .json/.pt, CSV/Parquet, per-rank directory) on a cluster topology "
        "and write it as a placement file. The placement rows carry LOAD's model layer ids, so "
        "SGLang and TensorRT-LLM exports line up with the model's layers. --format vllm "
        "writes the eplb_initial_mapping record vLLM's offline EPLB loads (PR #41141, not yet "
        "in a release: revisions A 63727bfc and B 8f4722ce; the later revision C reads a "
        "stats file, not a mapping; docs/deployment.md).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.lazy_epilog = lambda: solvers_epilog(EXAMPLE)
    p.add_argument("load", metavar="LOAD", help="trace or load matrix file")
    og.topology(p, required=True)
    og.bandwidths(p)
    og.failed_gpus(p)
    og.groups(p, default="the trace's, else its model's", must_divide=True)
    og.model(p, note="its expert groups apply where the trace records none")
    og.windows(p)
    og.ema(p)
    og.solver(p, default="deepseek", listed_below=True)
    og.plugin(p)
    og.seed(p, "randomised solvers")
    og.time_limit(p)
    og.solver_options(p, example="--option weighted=true --option budget=2000")
    og.formats(p, choices=["native", "npz", "sglang", "trtllm", "vllm"])
    p.add_argument("--previous", metavar="PLACEMENT",
                   help="the live placement file (any format eplb reads): policies that take "
                   "it place for the fewest moved replicas from it; any other's result is "
                   "relabeled to keep replicas where they are; repair needs it")
    p.add_argument("-o", "--output", metavar="FILE", help="placement file to write")
    p.set_defaults(func=run)


def describe_load(chosen, num_windows: int, ema: float | None) -> str:
    """``sum over all 3 windows``, ``window 2 of 8``, ``EMA alpha=0.5 over 4 of 8 windows``."""
    how = f"EMA alpha={ema:g}" if ema else "sum"
    n, T = len(chosen), num_windows
    if n == T:
        what = "the only window" if T == 1 else f"all {T} windows"
    elif n == 1:
        what = f"window {int(chosen[0])} of {T}"
    else:
        what = f"{n} of {T} windows"
    return f"{how} over {what}" if n > 1 or ema else what


def summary_rows(placement, balance) -> list[tuple[str, str]]:
    """Balance rows of a solve summary (``balance``: `SolveResult.balance`); every figure says
    what it runs over."""
    from eplb.evaluation.balance import BOUND_NAME  # lazy: keeps eplb --help fast

    s = balance
    L = placement.num_layers
    rows = []
    if np.isfinite(s.get("max_over_bound_mean", np.nan)):
        rows.append(("max GPU load / lower bound",
                     f"mean {s['max_over_bound_mean']:.4f}  worst {s['max_over_bound_worst']:.4f}"
                     f" over {L} layers (1 = provably optimal; {BOUND_NAME}, any placement)"))
    if np.isfinite(s.get("max_over_group_bound_mean", np.nan)):
        rows.append(("max GPU load / group bound",
                     f"mean {s['max_over_group_bound_mean']:.4f}  worst "
                     f"{s['max_over_group_bound_worst']:.4f} (bound for placements keeping "
                     "each expert group on one node)"))
    rows += [
        ("max / mean GPU load", f"mean {s['max_over_mean_mean']:.4f}  worst "
                                f"{s['max_over_mean_worst']:.4f} over {L} layers"),
        ("balancedness mean/max GPU load", f"mean {s['balancedness_mean']:.4f}  min "
                                           f"{s['balancedness_min']:.4f} over {L} layers"),
        ("step max/mean GPU load", f"{s['step_max_over_mean']:.4f} (sum over layers of the "
                                   "max GPU load / sum of the mean)"),
    ]
    info = placement.meta.get("solver") or {}
    if info.get("bound") is not None and info.get("objective") is not None:
        bits = []
        if info.get("optimal_layers") is not None:
            bits.append(f"proven optimal on {int(info['optimal_layers'])} of {L} layers")
        if info.get("gap_max") is not None:
            bits.append(f"max gap {float(info['gap_max']):.2e}")
        elif info.get("gap") is not None:
            gap = np.asarray(info["gap"], dtype=float)
            bits.append(f"max gap {float(np.nanmax(gap)):.2e}")
        if bits:
            rows.append((f"{info.get('name', 'solver')} bound", ", ".join(bits)))
    return rows


def contract_rows(info: dict, groups: int | None, topology, num_experts: int) -> list:
    """A ``groups`` row when a policy given expert groups placed globally (DeepSeek's rule:
    hierarchical only when the groups divide the experts and are a multiple of the nodes)."""
    if info.get("fallback"):
        to = f" ({info['fallback_to']})" if info.get("fallback_to") else ""
        return [("groups", f"fell back to the global policy{to}, DeepSeek's rule: "
                           f"{info['fallback']}")]
    if groups is None or info.get("policy") != "global":
        return []
    if num_experts % groups == 0 and groups % topology.num_nodes == 0:  # the groups fit
        return [("groups", f"{info.get('name', 'this policy')} places globally: the {groups} "
                           f"groups fit the {topology.num_nodes} nodes, but keeping each on one "
                           "node is not a contract it keeps; --solver hierarchical keeps it")]
    why = (f"{groups} does not divide the {num_experts} experts" if num_experts % groups else
           f"{groups} groups are not a multiple of the {topology.num_nodes} nodes")
    return [("groups", f"{why}: placed by the global policy (DeepSeek's rule), so expert groups "
                       "are not kept on one node")]


def groups_rows(args, groups: int | None, source: str | None) -> list:
    """An ``expert groups`` row saying where the groups came from (``--groups``, the trace's
    record, its model's preset), or, when a policy that uses groups got none and so ran its
    global variant, that it did and how to give them."""
    from eplb import solvers  # lazy: keeps eplb --help fast

    if args.groups is not None:
        return []
    if groups is not None:
        return [("expert groups", f"{groups} from {source}; --groups overrides")]
    if solvers.group_fallback(args.solver):  # places by groups when given them (deepseek)
        return [("expert groups", f"none known (the trace records none and names no model "
                                  f"preset): {args.solver} ran the global policy; "
                                  f"{GROUPS_HINT}")]
    return []


def live_slots(topology) -> int:
    """Slots per layer on the GPUs that have not failed."""
    return (topology.num_gpus - len(topology.failed_gpus)) * topology.slots_per_gpu


def failed_rows(topology, num_experts: int) -> list[tuple[str, str]]:
    """A ``failed GPUs`` row when some have failed: which, and the slots that are left."""
    if not topology.failed_gpus:
        return []
    gpus = ", ".join(map(str, topology.failed_gpus))
    n = len(topology.failed_gpus)
    return [("failed GPUs", f"{gpus} ({n} of {topology.num_gpus}; their "
                            f"{n * topology.slots_per_gpu} slots stay empty, "
                            f"{live_slots(topology)} slots left for {num_experts} experts)")]


def _empty_note(placement, topology) -> str:
    """``; N used per layer on average, M slots left empty`` when live slots hold no expert
    (a replica budget such as ``craft``), else ``""``."""
    live = placement.phy2log[:, topology.slot_alive]
    empty = int((live < 0).sum())
    if not empty:
        return ""
    L, E = placement.num_layers, placement.num_experts
    used = (live >= 0).sum() / L - E
    return f"; {used:.1f} used per layer on average, {empty:,} slots left empty over {L} layers"


def run(args: argparse.Namespace) -> int:
    # lazy: the library loads only when the verb runs, which keeps eplb --help fast
    from eplb import solvers
    from eplb.cli.recognise import read_placement_as
    from eplb.evaluation.solve import solve_trace
    from eplb.io import VLLM_LOADED_BY, format_for, write_placement

    solvers.load_plugins(args.plugin or ())  # first: no output may replace their modules
    check_outputs({"LOAD": args.load, "--previous": args.previous, "--model": args.model},
                  {"-o": args.output})
    options = parse_options(args.option)
    fmt = format_for(args.output, args.format) if args.output is not None else None
    solvers.get(args.solver)  # unknown names fail before reading anything
    check_solver_options(args.solver, options, previous=args.previous is not None)
    trace, groups_source = with_model_groups(read_trace(args.load), args.model)
    groups = args.groups if args.groups is not None else trace.meta.get("num_groups")
    windows = windows_arg(args.windows)
    trace.load(windows, ema=args.ema)  # a bad selection or ema fails here, before the topology
    if solvers.takes_windows(args.solver) and args.ema:
        raise InputError(f"solver {args.solver} weights the windows itself; drop --ema")
    E = trace.num_experts
    topology = Topology.parse(args.topology, args.slots, nvlink_gbps=args.nvlink_gbps,
                              rdma_gbps=args.rdma_gbps, min_slots=E,
                              failed_gpus=failed_gpus_arg(args.failed_gpus))
    check_groups(groups, E, fallback=solvers.group_fallback(args.solver))
    previous = None
    if args.previous is not None:
        vllm = format_for(args.previous) == "vllm"
        # runtime files carry no topology: the cluster before any GPU failed
        previous = read_placement_as(args.previous, topology=replace(topology, failed_gpus=()),
                                  num_experts=E, layer_ids=trace.layer_ids if vllm else None)
    result = solve_trace(args.solver, trace, topology, windows=args.windows, ema=args.ema,
                         num_groups=groups, seed=args.seed, time_limit=args.time_limit,
                         path=args.load, previous=previous, **options)
    placement, load = result.placement, result.load
    info = placement.meta["solver"]
    policy = f" ({info['policy']})" if "policy" in info else ""
    ids = trace.layer_ids
    rows = [
        ("solver", f"{args.solver}{policy}"),
        (
            "topology",
            f"{topology.num_nodes} nodes x {topology.gpus_per_node} GPUs x "
            f"{topology.slots_per_gpu} slots = {topology.num_slots} slots",
        ),
        (
            "layers",
            f"{placement.num_layers} (model layers {ids.min()}-{ids.max()}), "
            f"{placement.num_experts} experts",
        ),
        ("load", f"{describe_load(result.windows, result.num_windows, result.ema)}; "
                 f"{load.sum() / len(load):,.0f} expert picks per layer"),
        *([("placed for", "the next window, forecast from these windows (the figures below "
                          "score their sum)")] if result.forecast else []),
        *groups_rows(args, groups, groups_source),
        *contract_rows(info, groups, topology, E),
        *summary_rows(placement, result.balance),
        *failed_rows(topology, placement.num_experts),
        (
            "redundant slots",
            f"{live_slots(topology) - placement.num_experts} per layer on the live GPUs, "
            f"max replicas of one expert {int(np.max(placement.logcnt))}"
            + _empty_note(placement, topology),
        ),
        *([("replicas moved", f"{int(info['replicas_moved_total']):,} from {args.previous} "
                              f"(over {placement.num_layers} layers)")]
          if previous is not None and "replicas_moved_total" in info else []),
        ("solve time", f"{info['seconds'] * 1e3:.1f} ms (wall)"),
    ]
    if args.output is not None:
        if fmt in ("sglang", "trtllm") and \
                (trace.meta.get("provenance") or {}).get("format") == "vllm":
            raise InputError(f"{args.load} is vLLM's record: its rows are MoE-layer indices, "
                             f"not the model layer ids {fmt} files need; export --format vllm")
        nml = trace.meta.get("num_model_layers")
        write_placement(
            placement, args.output, fmt, num_model_layers=nml if fmt == "sglang" else None,
            layer_ids_are_model_ids=True,  # they come from LOAD (its rows or its layer column)
        )
        what = f"{fmt}: the mapping {VLLM_LOADED_BY} load" if fmt == "vllm" else fmt
        rows.append(("wrote", f"{args.output} ({what})"))
    print(text_table(rows))
    print_notes(trace)
    return 0
