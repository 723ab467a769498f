"""``eplb execute``: run one MoE layer on a placement with the reference executor and check it."""

from __future__ import annotations

import argparse

import numpy as np

from eplb.cli import option_groups as og
from eplb.cli.common import check_topology_hint, topology_from, topology_hint
from eplb.errors import InputError
from eplb.format import text_table
from eplb.safeload import check_size


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "execute",
        help="run a MoE layer on a placement with the reference executor",
        description="Build a MoE layer matching PLACEMENT (experts; top-k and groups from the "
        "trace when given), run one placement layer expert-parallel on the simulated ranks, "
        "check the output against the dense single-device forward (exit 1 on mismatch) and "
        "print per-rank load and NVLink/RDMA traffic. With a token-level trace its topk_ids and "
        "token_rank are replayed; otherwise random activations go through the layer's router "
        "(drawn from the trace's expert popularity when a counts trace is given) and tokens "
        "are spread evenly over the ranks.",
        epilog="example: eplb execute placement.json --trace traces/data/deepseek-v3-tokens.npz "
        "--layer 3 --tokens 4096 --hidden 512 --dispatch local_first",
    )
    p.add_argument("placement", metavar="PLACEMENT", help="placement file (.json, .npz, ...)")
    p.add_argument("--trace", metavar="T", help="trace file giving top-k, groups and routing")
    p.add_argument("--layer", type=int, metavar="ID",
                   help="model layer id to run (as in the placement's layer_ids; default: the "
                   "first MoE layer, i.e. the first layer the trace holds, else the "
                   "placement's first layer that is not the default map of a dense layer)")
    p.add_argument("--tokens", type=int, default=4096, help="tokens in the batch (default 4096)")
    og.message_sizes(p, hidden="512, a toy size; DeepSeek-V3's is 7168",
                          dispatch_bytes=1.0, combine_bytes=2.0)
    p.add_argument("--ffn", type=int, metavar="F", help="expert FFN width (default hidden / 4)")
    og.top_k(p)
    og.groups(p, default="the trace's num_groups",
                   topk="the trace's topk_groups, else all")
    p.add_argument("--scoring", choices=["softmax", "sigmoid"], default="softmax",
                   help="router scores (default softmax)")
    og.dispatch(p, what="dispatch policy (the replica each pick goes to)",
                choices=og.DISPATCH_NAMES)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32",
                   help="compute dtype (tolerance 1e-5 for float32, 1e-9 for float64)")
    p.add_argument("--experts", type=int, metavar="E",
                   help="logical experts (SGLang/TensorRT-LLM files; default max id + 1)")
    og.seed(p, "weights, activations and the policy")
    og.topology(p)
    og.bandwidths(p)
    og.failed_gpus(p)
    p.set_defaults(func=run)


def _positive(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise InputError(f"{name} must be >= 1, got {value}")


def _check_layer(placement, trace, layer_id: int) -> None:
    """``--layer``'s own messages (the layer given, or the default one): a layer of the
    placement, and of the trace if one is given."""
    hit = np.flatnonzero(placement.layer_ids == layer_id)
    if hit.size == 0:
        ids = placement.layer_ids
        raise InputError(f"--layer {layer_id} is not a layer of the placement; its model layer ids "
                         f"are {int(ids.min())}..{int(ids.max())} ({len(ids)} layers)")
    if trace is not None and trace.num_experts == placement.num_experts and \
            layer_id not in np.asarray(trace.layer_ids):
        raise InputError(
            f"placement row {int(hit[0])} is model layer {layer_id}, which the trace does not hold "
            f"(trace layers {trace.layer_ids.min()}-{trace.layer_ids.max()}); pick one of those "
            "with --layer"
        )


def run(args: argparse.Namespace) -> int:
    # lazy: the library loads only when the verb runs, which keeps eplb --help fast
    from eplb.cli.recognise import read_placement_as, read_trace_as
    from eplb.evaluation.execute import execute_trace

    # the flags' own messages, before any work; execute_trace() checks the same by parameter
    hidden_assumed = args.hidden is None
    if hidden_assumed:
        args.hidden = 512
    for name in ("tokens", "hidden", "ffn", "top_k", "groups", "topk_groups", "experts"):
        _positive(f"--{name.replace('_', '-')}", getattr(args, name))
    K = args.top_k or 8
    itemsize = np.dtype(args.dtype).itemsize
    # activations, receive buffers (<= K rows a token) and expert outputs (K rows a token)
    check_size(f"--tokens {args.tokens} --hidden {args.hidden}",
               (args.tokens, 2 * K + 4, args.hidden), itemsize,
               fix="use fewer --tokens or a smaller --hidden")
    F = args.ffn or max(args.hidden // 4, 1)
    topology = None
    if args.topology and args.slots is None and not args.failed_gpus:
        topology = topology_hint(args.topology, None)  # a runtime file's slots are its own
    elif args.topology:
        topology = topology_from(args)
    placement = read_placement_as(args.placement, topology=topology, num_experts=args.experts)
    check_topology_hint(placement, topology, args.placement)
    topo = placement.topology
    E, G = placement.num_experts, topo.num_gpus
    check_size(f"expert weights (--hidden {args.hidden}, FFN {F}, {topo.num_slots} slots)",
               (topo.num_slots + E, 3, args.hidden, F), itemsize,
               fix="use a smaller --hidden or --ffn")
    trace = None
    if args.trace:
        from eplb.evaluation.align import moe_rows

        trace = read_trace_as(args.trace)
        # a vLLM file is keyed by MoE-layer index: its rows take the trace's model layer ids
        placement = moe_rows(placement, trace)
    if args.layer is not None or trace is not None:
        from eplb.executor.run import default_row  # lazy: keeps eplb --help fast

        layer_id = args.layer if args.layer is not None else \
            int(placement.layer_ids[default_row(placement, trace.layer_ids)])
        _check_layer(placement, trace, layer_id)
    if trace is not None and trace.topk_ids is not None and args.top_k and \
            args.top_k != trace.topk_ids.shape[2]:
        raise InputError(
            f"--top-k {args.top_k} disagrees with the trace's token-level "
            f"top-{trace.topk_ids.shape[2]}; leave --top-k out"
        )
    report = execute_trace(
        placement, trace, layer=args.layer, num_tokens=args.tokens, hidden=args.hidden,
        ffn=args.ffn, top_k=args.top_k, num_groups=args.groups, topk_groups=args.topk_groups,
        scoring=args.scoring, policy=args.dispatch, dtype=args.dtype,
        dispatch_bytes=args.dispatch_bytes, combine_bytes=args.combine_bytes, seed=args.seed,
    )
    layer, stats, row, n = report.layer, report.stats, report.row, report.num_tokens
    source = {
        "picks": f"trace {args.trace} tokens (layer {report.layer_id}), router weights of "
                 "those picks",
        "biased": f"picks drawn from trace {args.trace} layer {report.layer_id}'s expert "
                  "popularity (each expert's expected share of the picks is its share of the "
                  "load), router weights biased by it",
        "router": "router on random activations",
    }[report.routing]

    mb = 1e6
    mean = stats.gpu_tokens.mean()
    rows = []
    for g in range(G):
        rows.append((
            g, int(topo.node_of_gpu[g]), int(stats.gpu_tokens[g]),
            f"{stats.gpu_tokens[g] / mean:.3f}" if mean > 0 else "-",
            int(stats.recv_tokens[g]), f"{stats.flops[g] / 1e9:.3f}",
            f"{stats.nvlink_out[g] / mb:.3f}", f"{stats.nvlink_in[g] / mb:.3f}",
            f"{stats.rdma_out[g] / mb:.3f}", f"{stats.rdma_in[g] / mb:.3f}",
        ))
    print(f"placement {args.placement}: {placement!r}; model layer "
          f"{int(placement.layer_ids[row])} (row {row})")
    print(f"layer: {layer!r}")
    print(f"tokens: {n} from {source}; dispatch {args.dispatch}, seed {args.seed}")
    print()
    print(text_table(rows, ["gpu", "node", "picks", "/mean", "tokens in", "GFLOP",
                       "NVL out MB", "NVL in MB", "RDMA out MB", "RDMA in MB"]))
    print("(link columns: dispatch phase; combine sends the same copies back, x "
          f"{args.combine_bytes:g}/{args.dispatch_bytes:g} bytes)")
    print()
    summary = [
        ("max / mean GPU picks", f"{stats.max_over_mean:.4f}"),
        ("NVLink bytes (dispatch + combine)",
         f"{stats.nvlink_bytes:,.0f}  ({stats.nvlink_transfers:,} copies per phase)"),
        ("RDMA bytes (dispatch + combine)",
         f"{stats.rdma_bytes:,.0f}  ({stats.rdma_transfers:,} copies per phase)"),
        ("bytes per element", f"dispatch {args.dispatch_bytes:g}, combine {args.combine_bytes:g}, "
                              f"hidden {args.hidden}"
                              + (" (assumed: the default toy size; DeepSeek-V3's is 7168, pass "
                                 "--hidden H; bytes scale with it)" if hidden_assumed else "")),
        ("time", f"executor {report.executor_seconds:.3f} s, dense forward "
                 f"{report.dense_seconds:.3f} s"),
        ("max abs error vs dense", f"{report.max_abs_error:.3e} (tolerance "
                                   f"{report.tolerance:.1e})"),
        ("check", "PASS" if report.passed else "FAIL"),
    ]
    print(text_table(summary))
    return 0 if report.passed else 1
