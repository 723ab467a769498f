"""Option groups the verbs share: each builder adds one group of options to a parser, and each
option's help text is written here once. A verb passes only what is its own (a default, a note
on what the option means there); what a verb alone takes stays in its module."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from eplb.cli.common import gbps_arg, seconds_arg, seed_arg
from eplb.topology import NVLINK_GBPS, RDMA_GBPS

Parser = argparse.ArgumentParser | argparse._ArgumentGroup

# the per-pick dispatch policies --help names and `eplb execute` offers: the CLI's one copy of
# eplb.dispatch.POLICIES (importing eplb.dispatch at parse time loads ortools and slows every
# `eplb` start; tests/test_cli_option_groups.py checks the two are equal, in order)
DISPATCH_NAMES = ("even", "random", "local_first", "weighted", "lp")
# model and GPU presets --help names: the CLI's copy of config.model.MODELS and
# config.hardware.hardware_names() (importing them at parse time would slow every `eplb`
# start; tests/test_serving_hf_cli.py checks the copies are equal)
MODEL_PRESETS = ("deepseek_v3",)
MEASURED_GPUS = ("h800", "h100", "h200")
DATASHEET_GPUS = ("h20", "b200", "gb200", "mi300x", "mi355x",
                  "h800_roofline", "h100_roofline", "h200_roofline")
TRACE_FORMATS = ("npz", "parquet", "csv", "sglang")  # what `eplb trace` writes


def _with(text: str, note: str | None, sep: str = "; ") -> str:
    return text if not note else f"{text}{sep}{note}"


# ------------------------------------------------------------------ cluster
def topology(p: Parser, *, required: bool = False, slots_required: bool = False,
             default: str | None = None, note: str | None = None,
             slots_note: str | None = None) -> None:
    """``--topology``, ``--slots``: the cluster (`common.topology_from` builds it); ``default``
    only names the default the verb resolves."""
    text = "nodes x GPUs per node, e.g. 4x8 (or NxGxS with slots per GPU)"
    if default:
        text += f"; default {default}"
    p.add_argument("--topology", required=required, metavar="NxG", help=_with(text, note))
    p.add_argument("--slots", required=slots_required, type=int, metavar="P",
                   help=_with("physical expert slots per layer across all GPUs, e.g. 288",
                              slots_note and f"({slots_note})", " "))


def failed_gpus(p: Parser) -> None:
    """``--failed-gpus``: GPUs whose slots stay empty."""
    p.add_argument("--failed-gpus", metavar="G,G",
                   help="GPU indices that have failed: their slots stay empty (-1) and "
                   "experts are placed on the others (native output formats only)")


def bandwidths(p: Parser, *, override: bool = False) -> None:
    """``--nvlink-gbps``, ``--rdma-gbps``; ``override``: default None (the placement's)."""
    for flag, link, value in (("--nvlink-gbps", "NVLink", NVLINK_GBPS),
                              ("--rdma-gbps", "RDMA", RDMA_GBPS)):
        default = "the placement's" if override else f"{value:g}"
        p.add_argument(flag, type=gbps_arg, default=None if override else value, metavar="GB/s",
                       help=f"{link} bandwidth per GPU in GB/s (default {default})")


def groups(p: Parser, *, default: str | None = "the trace's", topk: str | None = None,
           topk_note: str | None = None, must_divide: bool = False) -> None:
    """``--groups`` (and ``--topk-groups`` when ``topk`` names its default)."""
    text = "expert groups for group-limited routing"
    if must_divide:
        text += "; must divide the experts; hierarchical policies use them"
    p.add_argument("--groups", type=int, metavar="G",
                   help=_with(text, default and f"(default: {default})", " "))
    if topk is not None:
        p.add_argument("--topk-groups", type=int, metavar="T",
                       help=_with(f"groups each token may use (DeepSeek-V3: 4; default: {topk}); "
                                  "with --groups the traffic model assumes group-limited routing",
                                  topk_note))


def model(p: Parser, *, default: str | None = None, note: str | None = None) -> None:
    """``--model``: a model preset or the path of a Hugging Face ``config.json``."""
    text = (f"the model: a preset ({', '.join(MODEL_PRESETS)}) or the path of its Hugging Face "
            "config.json (DeepSeek-V2/V3/V3.2/V4, Kimi K2, GLM-4.5/5, Qwen1.5/2/3/3.5 MoE, "
            "Qwen3-Next, gpt-oss, Mixtral)")
    if default:
        text += f" (default {default})"
    p.add_argument("--model", default=default, metavar="PRESET|CONFIG.JSON",
                   help=_with(text, note))


def hardware(p: Parser, *, default: str | None = None, note: str | None = None) -> None:
    """``--hardware``: a GPU preset or a TOML file of datasheet figures."""
    text = (f"the GPU: a preset with measured kernel tables ({', '.join(MEASURED_GPUS)}), a "
            f"datasheet preset whose curves are a roofline ({', '.join(DATASHEET_GPUS)}), or a "
            "TOML file of datasheet figures (docs/serving.md, \"Your model, your GPU\")")
    if default:
        text += f" (default {default})"
    p.add_argument("--hardware", default=default, metavar="PRESET|FILE.toml",
                   help=_with(text, note))


# ------------------------------------------------------------------ solvers
def solver(p: Parser, *, default: str, note: str | None = None,
           listed_below: bool = False) -> None:
    """``--solver``: the placement policy."""
    where = ("the list and each one's --option keys are below" if listed_below
             else "eplb solve --help lists the solvers and each one's --option keys")
    p.add_argument("--solver", default=default, metavar="NAME",
                   help=f"placement policy{note and ' ' + note or ''} (default {default}; "
                   f"{where})")


def solver_options(p: Parser, *, example: str, per_solver: bool = False) -> None:
    """``--option``: a solver option, repeatable (``per_solver``: ``SOLVER.KEY=VALUE`` too)."""
    which = "for every solver or one (SOLVER.KEY=VALUE), " if per_solver else ""
    p.add_argument("--option", action="append",
                   metavar="[SOLVER.]KEY=VALUE" if per_solver else "KEY=VALUE",
                   help=f"solver option, {which}repeatable (value parsed as JSON if it can be, "
                   f"e.g. {example})")


def plugin(p: Parser) -> None:
    """``--plugin``: modules registering their own policies."""
    p.add_argument("--plugin", action="append", metavar="MODULE",
                   help="import MODULE first (repeatable): a module registering its own "
                   "policies with eplb.solvers.register; installed packages can instead "
                   "declare an 'eplb.solvers' entry point")


def time_limit(p: Parser, *, default: float | None = None) -> None:
    """``--time-limit``: seconds per solve of search solvers (third-party policies that run
    past it are stopped: `eplb.solvers.plugins`)."""
    p.add_argument("--time-limit", type=seconds_arg, default=default, metavar="SEC",
                   help=_with("time limit of search solvers (ilp) per solve, wall seconds; a "
                              "plugin or installed policy still running at 1.5x it + 2 s is "
                              "stopped and reported",
                              default is not None and f"(default {default:g})" or None, " "))


def seed(p: Parser, what: str, *, any_int: bool = False) -> None:
    """``--seed``; ``any_int``: any integer (the library checks), else 0..2**31-1 here."""
    p.add_argument("--seed", type=int if any_int else seed_arg, default=0,
                   help=f"seed of {what}{'' if any_int else ', 0..2**31-1'} (default 0)")


# ------------------------------------------------------------------ loads and traffic
def windows(p: Parser, *, what: str = "sum") -> None:
    """``--windows``: which windows of a trace to use."""
    p.add_argument("--windows", metavar="SPEC",
                   help=f"windows to {what}: an index, a slice 'a:b' or a list '0,3,5' "
                   "(default all)")


def passes_per_window(p: Parser) -> None:
    """``--passes-per-window``: sum N consecutive windows (forward passes) into one."""
    p.add_argument("--passes-per-window", type=int, metavar="N",
                   help="sum every N consecutive windows into one (vLLM stats records and "
                   "SGLang recorder dumps hold one window per forward pass, a few dozen picks "
                   "per layer each; default 1)")


def ema(p: Parser, *, over: str = "the windows") -> None:
    """``--ema``: an exponential average instead of a sum."""
    p.add_argument("--ema", type=float, metavar="ALPHA",
                   help=f"exponential moving average over {over} (latest weighted ALPHA) "
                   "instead of the sum")


def dispatch(p: Parser, *, default: str | None = "even", what: str = "dispatch policy",
             choices: Sequence[str] | None = None) -> None:
    """``--dispatch``: the dispatch policy, ``what`` it is for (``choices``: refused by
    argparse, else by the library)."""
    text = f"{what}: {', '.join(DISPATCH_NAMES)}" + (f" (default {default})" if default else "")
    p.add_argument("--dispatch", default=default, choices=choices,
                   metavar=None if choices else "POLICY", help=text)


def top_k(p: Parser, *, default: str | None = "the trace's top_k, else 8",
          note: str | None = None) -> None:
    """``--top-k``: experts per token."""
    p.add_argument("--top-k", type=int, metavar="K",
                   help=_with(_with("experts per token", default and f"(default: {default})", " "),
                              note))


def message_sizes(p: Parser, *, hidden: str, dispatch_bytes: float = 1,
                  combine_bytes: float = 2) -> None:
    """``--hidden``, ``--dispatch-bytes``, ``--combine-bytes``: what a token sends."""
    p.add_argument("--hidden", type=int, metavar="H",
                   help=f"hidden size in elements per token vector (default {hidden})")
    p.add_argument("--dispatch-bytes", type=float, default=dispatch_bytes, metavar="B",
                   help="bytes per hidden element sent in dispatch (default 1, FP8)")
    p.add_argument("--combine-bytes", type=float, default=combine_bytes, metavar="B",
                   help="bytes per hidden element sent in combine (default 2, BF16)")


# ------------------------------------------------------------------ runs and output
def runner(p: Parser, *, note: str | None = None) -> None:
    """``--workers``, ``--scheduler``: where the independent runs go."""
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help=_with("local worker processes (default 1: run inline)", note))
    p.add_argument("--scheduler", metavar="ADDR",
                   help=_with("Dask scheduler address (tcp://host:8786); needs the dask extra",
                              note))


def quiet(p: Parser, *, note: str | None = None) -> None:
    """``--quiet``: no progress bar."""
    p.add_argument("--quiet", action="store_true",
                   help=_with("no progress bar", note and f"({note})", " "))


def as_json(p: Parser, *, what: str = "the table") -> None:
    """``--json``: print JSON instead of the text."""
    p.add_argument("--json", action="store_true", help=f"print JSON instead of {what}")


def formats(p: Parser, *, out: bool = True, flag: str = "--format",
            choices: Sequence[str] | None = None, names: Sequence[str] | None = None) -> None:
    """``--format`` (output, or input when ``out`` is False; ``flag`` e.g. ``--in-format``);
    ``choices`` are enforced, ``names`` only listed."""
    text = f"{'output' if out else 'input'} format" + (f": {', '.join(names)}" if names else "")
    text += (" (default: from the output file's suffix)" if out
             else " (default: sniffed from content and suffix)")
    p.add_argument(flag, choices=choices, help=text)


def rescale(p: Parser) -> None:
    """``--rate`` / ``--speedup`` (one of them) and ``--head``: a workload at another load."""
    scale = p.add_mutually_exclusive_group()
    scale.add_argument("--rate", type=float, metavar="REQ/S",
                       help="replay the workload at this mean rate (requests/s)")
    scale.add_argument("--speedup", type=float, metavar="X",
                       help="replay the workload X times faster")
    p.add_argument("--head", type=int, metavar="N", help="keep the first N requests only")


def block_size(p: Parser, *, default: int | None = None, note: str | None = None) -> None:
    """``--block-size``: tokens per hashed prefix block."""
    p.add_argument("--block-size", type=int, default=default, metavar="TOKENS",
                   help=_with("tokens per hashed block", note, " ") + " (default 512)")
