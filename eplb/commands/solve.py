"""``eplb solve``: place a load matrix on a topology and write a placement file."""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

from eplb.commands.common import add_topology_args, parse_options, table, topology_from


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "solve",
        help="compute a placement for a load matrix",
        description="Compute a replicated expert placement for LOAD (a trace or load matrix: "
        ".npz, .npy, SGLang .json) on a cluster topology and write it as a placement file.",
        epilog="example: eplb solve traces/data/zipf-58x256.npz --topology 4x8 --slots 288 "
        "--groups 8 -o placement.json",
    )
    p.add_argument("load", metavar="LOAD", help="trace or load matrix file")
    add_topology_args(p)
    p.add_argument(
        "--groups",
        type=int,
        metavar="G",
        help="expert groups (group-limited routing); hierarchical policies use them",
    )
    p.add_argument("--solver", default="deepseek", help="placement policy (default deepseek)")
    p.add_argument("--seed", type=int, default=0, help="seed for randomised solvers")
    p.add_argument("--time-limit", type=float, metavar="SEC", help="time limit for search solvers")
    p.add_argument(
        "--option",
        action="append",
        metavar="KEY=VALUE",
        help="extra solver option, repeatable (value parsed as JSON if it can be)",
    )
    p.add_argument(
        "--format",
        choices=["native", "npz", "sglang", "trtllm"],
        help="output format (default: from the suffix of -o)",
    )
    p.add_argument("-o", "--output", metavar="FILE", help="placement file to write")
    p.set_defaults(func=run)


def _sha256(path: Path) -> str:
    """Hash of a load file, or of every file under a trace directory (sorted by path)."""
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        h.update(str(f.relative_to(path)).encode() if path.is_dir() else b"")
        h.update(f.read_bytes())
    return h.hexdigest()


def run(args: argparse.Namespace) -> int:
    import numpy as np

    import solvers
    import traces
    from eplb.io import format_for, write_placement
    from evaluation.metrics import balancedness, max_over_mean

    topology = topology_from(args)
    options = parse_options(args.option)
    fmt = format_for(args.output, args.format) if args.output else None
    trace = traces.read(args.load)
    load = trace.load()
    placement = solvers.solve(
        args.solver,
        load,
        topology,
        num_groups=args.groups,
        seed=args.seed,
        time_limit=args.time_limit,
        **options,
    )
    gpu = placement.gpu_load(load)
    bal, mom = balancedness(gpu), max_over_mean(gpu)
    digest = _sha256(Path(args.load))
    placement = type(placement)(
        placement.phy2log,
        placement.num_experts,
        topology,
        placement.replica_share,
        {
            **placement.meta,
            "source": {
                "path": str(args.load),
                "sha256": digest,
                "num_model_layers": trace.meta.get("num_model_layers"),
            },
            "metrics": {
                "balancedness_mean": float(bal.mean()),
                "balancedness_min": float(bal.min()),
                "max_over_mean_mean": float(mom.mean()),
                "max_over_mean_worst": float(mom.max()),
            },
        },
        trace.layer_ids,
    )
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
        ("balancedness mean/max GPU load", f"mean {bal.mean():.4f}  min {bal.min():.4f}"),
        ("max GPU load / mean", f"mean {mom.mean():.4f}  worst {mom.max():.4f}"),
        (
            "redundant slots",
            f"{topology.num_slots - placement.num_experts} per layer, "
            f"max replicas of one expert {int(np.max(placement.logcnt))}",
        ),
        ("solve time", f"{info['seconds'] * 1e3:.1f} ms"),
    ]
    if args.output:
        nml = trace.meta.get("num_model_layers")
        write_placement(
            placement, args.output, fmt, num_model_layers=nml if fmt == "sglang" else None
        )
        rows.append(("wrote", f"{args.output} ({fmt})"))
    print(table(rows))
    return 0
