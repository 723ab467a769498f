"""The ``eplb`` command: thin argument parsing over the library; one module per verb.

Errors the toolkit raises on purpose (`EplbError`) print one line and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from eplb import __version__
from eplb.errors import EplbError

# verb modules under eplb.commands, each with add_parser(subparsers)
COMMANDS = ("solve", "trace", "evaluate", "compare", "replay", "execute", "workload", "simulate")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eplb",
        description="Expert-parallel load balancing for MoE inference: solve placements, "
        "read and synthesise traces, evaluate, compare and execute placements.",
    )
    parser.add_argument("--version", action="version", version=f"eplb {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"eplb.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"eplb.commands.{name}":
                continue  # verb not built yet
            raise
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except EplbError as exc:
        print(f"eplb: error: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"eplb: error: {exc.filename or exc}: no such file", file=sys.stderr)
        return 2
    except PermissionError as exc:
        print(f"eplb: error: {exc.filename or exc}: permission denied", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("eplb: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and closed early: not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
