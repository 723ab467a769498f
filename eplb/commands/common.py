"""Helpers shared by the CLI verbs: topology options, option parsing, table printing."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from eplb.errors import InputError
from eplb.topology import Topology


def add_topology_args(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    p.add_argument(
        "--topology",
        required=required,
        metavar="NxG",
        help="nodes x GPUs per node, e.g. 4x8 (or NxGxS with slots per GPU)",
    )
    p.add_argument(
        "--slots",
        type=int,
        metavar="P",
        help="physical expert slots per layer across all GPUs, e.g. 288",
    )
    p.add_argument(
        "--nvlink-gbps",
        type=float,
        default=160.0,
        metavar="GB/s",
        help="NVLink bandwidth per GPU in GB/s (default 160)",
    )
    p.add_argument(
        "--rdma-gbps",
        type=float,
        default=50.0,
        metavar="GB/s",
        help="RDMA bandwidth per GPU in GB/s (default 50)",
    )


def topology_from(args: argparse.Namespace) -> Topology:
    return Topology.parse(
        args.topology, args.slots, nvlink_gbps=args.nvlink_gbps, rdma_gbps=args.rdma_gbps
    )


def parse_options(items: Sequence[str] | None) -> dict:
    """``["key=value", ...]`` -> dict; values parsed as JSON when they parse, else strings."""
    out: dict = {}
    for item in items or ():
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise InputError(f"--option {item!r} is not KEY=VALUE (e.g. --option budget=2000)")
        try:
            out[key.replace("-", "_")] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.replace("-", "_")] = raw
    return out


def table(rows: Sequence[Sequence[object]], header: Sequence[str] | None = None) -> str:
    """Plain aligned text table."""
    cells = [[str(c) for c in row] for row in ([header] if header else []) + list(rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    if header:
        lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
