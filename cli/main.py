"""The ``eplb`` command: thin argument parsing over the library; one module per verb.

Errors the toolkit raises on purpose (`EplbError`) print one line and exit 2; so do the OS
errors of files named on the command line and memory exhaustion. SIGTERM (SIGINT) becomes a
`eplb.atomic.Terminated` (`KeyboardInterrupt`) exception while a verb runs, so unfinished atomic
writes remove their temporary files, and is recorded (`eplb.atomic.note_signal`) so that a
swallowed exception still stops every later commit; the exit status is 128 + the signal.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence

from eplb import __version__
from eplb.atomic import Terminated, clear_signals, guard_inputs, note_signal, signalled
from eplb.errors import EplbError

# verb modules under eplb.cli, each with add_parser(subparsers); add a verb by name here
COMMANDS = (
    "solve", "trace", "evaluate", "compare", "replay", "execute", "workload", "simulate", "advise",
)


def _raise_terminated(signum, frame) -> None:
    note_signal(signum)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(signum)


@contextlib.contextmanager
def sigterm_as_exception() -> Iterator[None]:
    """While inside, SIGTERM raises `Terminated` and SIGINT `KeyboardInterrupt` in the main
    thread (cleanups run); both are recorded (`eplb.atomic.note_signal`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    clear_signals()
    previous = {sig: signal.signal(sig, _raise_terminated)
                for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class Parser(argparse.ArgumentParser):
    """argparse with the toolkit's error format: one ``eplb: error:`` line, exit 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"eplb: error: {self.prog}: {message} (see {self.prog} --help)\n")

    def format_help(self) -> str:
        # a verb may set ``lazy_epilog`` (a function) to list things that need heavy imports
        # (the solvers and their options) only when --help is asked for
        lazy = getattr(self, "lazy_epilog", None)
        if lazy is not None:
            self.epilog = lazy()
            self.lazy_epilog = None
        return super().format_help()


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="eplb",
        description="Expert-parallel load balancing for MoE inference: solve placements, "
        "read and synthesise traces, evaluate, compare and execute placements.",
    )
    parser.add_argument("--version", action="version", version=f"eplb {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"eplb.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"eplb.cli.{name}":
                continue  # verb not built yet
            raise
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        # from the start: a signal during imports exits 128 + N; no output replaces a file
        # the command read or a module a plugin imported (eplb.atomic.guard_inputs)
        with sigterm_as_exception(), guard_inputs():
            parser = build_parser()
            args = parser.parse_args(argv)
            if not getattr(args, "func", None):
                parser.print_help()
                return 2
            code = int(args.func(args) or 0)
            if signalled() is not None:  # the signal's exception was swallowed somewhere
                raise Terminated(signalled())
            return code
    except EplbError as exc:
        print(f"eplb: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"eplb: error: {exc.filename or exc}: no such file", file=sys.stderr)
        return 2
    except PermissionError as exc:
        print(f"eplb: error: {exc.filename or exc}: permission denied", file=sys.stderr)
        return 2
    except IsADirectoryError as exc:
        print(f"eplb: error: {exc.filename or exc}: is a directory; give a file",
              file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and closed early: not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except OSError as exc:  # a full disk, a name too long, a busy folder...
        where = exc.filename or "a file"
        print(f"eplb: error: {where}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except RecursionError:
        print("eplb: error: an input is nested too deeply (thousands of levels); check the "
              "files given", file=sys.stderr)
        return 2
    except MemoryError:
        print("eplb: error: out of memory; the input or the requested sizes are too large "
              "for this machine (use fewer windows, tokens or layers)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if signalled() not in (None, signal.SIGINT):
            print("eplb: terminated", file=sys.stderr)
            return 128 + int(signalled())
        print("eplb: interrupted", file=sys.stderr)
        return 130
    except Terminated as exc:
        print("eplb: terminated", file=sys.stderr)
        return 128 + int(getattr(exc, "signum", signal.SIGTERM))
    finally:
        clear_signals()


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split("\n")).strip() or type(exc).__name__


if __name__ == "__main__":
    sys.exit(main())
