"""``eplb execute``: run one MoE layer on a placement with the reference executor and check it."""

from __future__ import annotations

import argparse

from eplb.cli.common import add_topology_args, seed_arg
from eplb.format import text_table

POLICY_NAMES = ("even", "random", "local_first", "weighted", "lp")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "execute",
        help="run a MoE layer on a placement with the reference executor",
        description="Build a MoE layer matching PLACEMENT (experts; top-k and groups from the "
        "trace when given), run one placement layer expert-parallel on the simulated ranks, "
        "check the output against the dense single-device forward (exit 1 on mismatch) and "
        "print per-rank load and NVLink/RDMA traffic. With a token-level trace its topk_ids and "
        "token_rank are replayed; otherwise random activations go through the layer's router "
        "(biased towards the trace's expert popularity when a counts trace is given) and tokens "
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
    p.add_argument("--hidden", type=int, default=512, help="hidden size H (default 512)")
    p.add_argument("--ffn", type=int, metavar="F", help="expert FFN width (default hidden / 4)")
    p.add_argument("--top-k", type=int, metavar="K",
                   help="experts per token (default: the trace's top_k, else 8)")
    p.add_argument("--groups", type=int, metavar="G",
                   help="expert groups for group-limited routing (default: the trace's num_groups)")
    p.add_argument("--topk-groups", type=int, metavar="TG",
                   help="groups each token may use (default: the trace's topk_groups, else all)")
    p.add_argument("--scoring", choices=["softmax", "sigmoid"], default="softmax",
                   help="router scores (default softmax)")
    p.add_argument("--dispatch", choices=POLICY_NAMES, default="even",
                   help="replica choice per pick (default even)")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32",
                   help="compute dtype (tolerance 1e-5 for float32, 1e-9 for float64)")
    p.add_argument("--dispatch-bytes", type=float, default=1.0, metavar="B",
                   help="bytes per hidden element sent in dispatch (default 1, FP8)")
    p.add_argument("--combine-bytes", type=float, default=2.0, metavar="B",
                   help="bytes per hidden element sent in combine (default 2, BF16)")
    p.add_argument("--experts", type=int, metavar="E",
                   help="logical experts (SGLang/TensorRT-LLM files; default max id + 1)")
    p.add_argument("--seed", type=seed_arg, default=0,
                   help="seed for weights, activations, policy (default 0)")
    add_topology_args(p, required=False)
    p.set_defaults(func=run)


def _positive(name: str, value: int | None) -> None:
    from eplb.errors import InputError

    if value is not None and value < 1:
        raise InputError(f"{name} must be >= 1, got {value}")


def _default_row(placement, trace) -> int:
    """Row of the first MoE layer: the first the trace holds, else the first row of the
    placement that is not SGLang's default map ``slot % E`` (what dense layers get)."""
    import numpy as np

    if trace is not None:
        hit = np.flatnonzero(np.isin(placement.layer_ids, trace.layer_ids))
        if hit.size:
            return int(hit[0])
    dense = np.arange(placement.num_slots) % placement.num_experts
    moe = np.flatnonzero((placement.phy2log != dense).any(axis=1))
    return int(moe[0]) if moe.size else 0


def _row_of(placement, layer_id: int) -> int:
    import numpy as np

    from eplb.errors import InputError

    hit = np.flatnonzero(placement.layer_ids == layer_id)
    if hit.size == 0:
        ids = placement.layer_ids
        raise InputError(f"--layer {layer_id} is not a layer of the placement; its model layer ids "
                         f"are {int(ids.min())}..{int(ids.max())} ({len(ids)} layers)")
    return int(hit[0])


def _trace_row(placement, trace, row: int) -> int:
    import numpy as np

    from eplb.errors import InputError

    if trace.num_experts != placement.num_experts:
        raise InputError(
            f"the trace has {trace.num_experts} experts but the placement {placement.num_experts}; "
            "use a placement solved for this trace"
        )
    lid = int(placement.layer_ids[row])
    hit = np.flatnonzero(np.asarray(trace.layer_ids) == lid)
    if hit.size == 0:
        raise InputError(
            f"placement row {row} is model layer {lid}, which the trace does not hold "
            f"(trace layers {trace.layer_ids.min()}-{trace.layer_ids.max()}); pick one of those "
            "with --layer"
        )
    return int(hit[0])


def run(args: argparse.Namespace) -> int:
    import time

    import numpy as np

    from eplb.cli.common import topology_from
    from eplb.errors import InputError
    from eplb.executor import MoELayer, ReferenceExecutor, even_token_rank
    from eplb.io import read_placement
    from eplb.safeload import check_size

    for name in ("tokens", "hidden", "ffn", "top_k", "groups", "topk_groups", "experts"):
        _positive(f"--{name.replace('_', '-')}", getattr(args, name))
    K = args.top_k or 8
    itemsize = np.dtype(args.dtype).itemsize
    # activations, receive buffers (<= K rows a token) and expert outputs (K rows a token)
    check_size(f"--tokens {args.tokens} --hidden {args.hidden}",
               (args.tokens, 2 * K + 4, args.hidden), itemsize,
               fix="use fewer --tokens or a smaller --hidden")
    F = args.ffn or max(args.hidden // 4, 1)
    topology = topology_from(args) if args.topology else None
    placement = read_placement(args.placement, topology=topology, num_experts=args.experts)
    topo = placement.topology
    E, G = placement.num_experts, topo.num_gpus
    check_size(f"expert weights (--hidden {args.hidden}, FFN {F}, {topo.num_slots} slots)",
               (topo.num_slots + E, 3, args.hidden, F), itemsize,
               fix="use a smaller --hidden or --ffn")

    trace, trow = None, None
    if args.trace:
        from eplb import traces
        trace = traces.read(args.trace)
    row = _row_of(placement, args.layer) if args.layer is not None else \
        _default_row(placement, trace)
    if trace is not None:
        trow = _trace_row(placement, trace, row)
    meta = trace.meta if trace is not None else {}
    token_level = trace is not None and trace.topk_ids is not None
    top_k = args.top_k or (trace.topk_ids.shape[2] if token_level else meta.get("top_k")) or 8
    groups, topk_groups = args.groups, args.topk_groups
    if groups is None:
        groups = meta.get("num_groups")
        if topk_groups is None and groups is not None:
            topk_groups = meta.get("topk_groups")
    if token_level and args.top_k and args.top_k != trace.topk_ids.shape[2]:
        raise InputError(
            f"--top-k {args.top_k} disagrees with the trace's token-level "
            f"top-{trace.topk_ids.shape[2]}; leave --top-k out"
        )
    layer = MoELayer(
        E, args.hidden, F, int(top_k),
        num_groups=groups, topk_groups=topk_groups, seed=args.seed,
        dtype=np.dtype(args.dtype), scoring=args.scoring,
    )
    rng = np.random.default_rng([args.seed, 1])
    if token_level:
        n = min(args.tokens, trace.topk_ids.shape[0])
        ids = trace.topk_ids[:n, trow, :].astype(np.int64)
        token_rank = trace.token_rank[:n].astype(np.int64)
        if n and token_rank.max() >= G:
            raise InputError(
                f"the trace's tokens come from rank {int(token_rank.max())} but the placement has "
                f"{G} GPUs; use a placement for at least {int(token_rank.max()) + 1} GPUs"
            )
        x = rng.standard_normal((n, args.hidden)).astype(layer.dtype)
        s = np.take_along_axis(layer.scores(x), ids, axis=1)  # router scores of the given picks
        w = (s / s.sum(axis=1, keepdims=True)).astype(layer.dtype)
        source = f"trace {args.trace} tokens (layer {int(trace.layer_ids[trow])}), " \
                 f"router weights of those picks"
    else:
        n = args.tokens
        if trace is not None:
            load = trace.load()[trow]
            share = load / max(load.sum(), 1e-300)
            layer.router_bias = np.log(np.maximum(share, 1e-12)).astype(layer.dtype)
            source = (f"router on random activations, biased by trace {args.trace} layer "
                      f"{int(trace.layer_ids[trow])} expert popularity")
        else:
            source = "router on random activations"
        x = rng.standard_normal((n, args.hidden)).astype(layer.dtype)
        ids, w = layer.route(x)
        token_rank = even_token_rank(n, G)

    executor = ReferenceExecutor(
        layer, placement, args.dispatch, args.seed,
        dispatch_bytes=args.dispatch_bytes, combine_bytes=args.combine_bytes,
    )
    t0 = time.perf_counter()
    out, stats = executor.forward(x, ids, w, token_rank, layer_index=row)
    t1 = time.perf_counter()
    ref = layer.dense_forward(x, ids, w)
    t2 = time.perf_counter()

    err = float(np.abs(out - ref).max()) if out.size else 0.0
    scale = max(1.0, float(np.abs(ref).max())) if ref.size else 1.0
    tol = (1e-5 if layer.dtype == np.float32 else 1e-9) * scale
    ok = bool(err <= tol)

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
         f"{stats.nvlink_bytes:,.0f}  ({stats.nvlink_transfers} copies per phase)"),
        ("RDMA bytes (dispatch + combine)",
         f"{stats.rdma_bytes:,.0f}  ({stats.rdma_transfers} copies per phase)"),
        ("bytes per element", f"dispatch {args.dispatch_bytes:g}, combine {args.combine_bytes:g}"),
        ("time", f"executor {t1 - t0:.3f} s, dense forward {t2 - t1:.3f} s"),
        ("max abs error vs dense", f"{err:.3e} (tolerance {tol:.1e})"),
        ("check", "PASS" if ok else "FAIL"),
    ]
    print(text_table(summary))
    return 0 if ok else 1
