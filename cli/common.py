"""Helpers shared by the CLI verbs: output checks, argument types, option parsing (the option
groups themselves: `eplb.cli.option_groups`)."""

from __future__ import annotations

import argparse
import json
import os
import textwrap
from collections.abc import Mapping, Sequence

from eplb.atomic import check_output_path, same_file
from eplb.errors import InputError
from eplb.topology import Topology

PathLike = str | os.PathLike


def check_outputs(
    inputs: Mapping[str, PathLike | Sequence[PathLike] | None],
    outputs: Mapping[str, PathLike | None],
    output_dirs: Mapping[str, PathLike | None] | None = None,
) -> None:
    """Refuse, before any work, output paths that would destroy an input or each other.

    ``inputs``/``outputs`` map a flag (as the user typed it, e.g. ``"-o"``, ``"LOAD"``) to a
    path (``None`` = not given; an input may be a list of paths). An output must be non-empty,
    not an existing directory, not an input file (symlinks, hard links and relative spellings
    included: compared with ``os.path.samefile`` and resolved paths), not inside an input
    directory, and not the same file as another output; a ``--plot`` file must have an image
    suffix matplotlib writes. ``output_dirs`` (e.g. ``--plot DIR``)
    must not be an input file or an existing non-directory, and must not hold an input (a
    command's own files in it would be overwritten).
    """
    ins: list[tuple[str, PathLike]] = []
    for flag, value in inputs.items():
        if value is None:
            continue
        for path in [value] if isinstance(value, (str, os.PathLike)) else value:
            ins.append((flag, path))
    seen: list[tuple[str, PathLike]] = []
    for flag, path in outputs.items():
        if path is None:
            continue
        check_output_path(path, flag)
        for in_flag, in_path in ins:
            if same_file(in_path, path):
                raise InputError(
                    f"{flag} {path} is the input {in_flag} {in_path}; writing it would destroy "
                    "the input file. Choose another output file"
                )
        for other_flag, other in seen:
            if same_file(other, path):
                raise InputError(f"{flag} {path} is the same file as {other_flag} {other}; "
                                 "give each output its own file")
        seen.append((flag, path))
    if outputs.get("--plot") is not None:  # an image matplotlib writes (after the aliasing)
        from eplb.evaluation.plots import check_plot_path  # lazy: matplotlib

        check_plot_path(outputs["--plot"], "--plot")
    for flag, path in (output_dirs or {}).items():
        if path is None:
            continue
        text = os.fspath(path)
        if not str(text).strip():
            raise InputError(f"{flag} is empty; give a directory name")
        if os.path.exists(text) and not os.path.isdir(text):
            raise InputError(f"{flag} {text} exists and is not a directory")
        for in_flag, in_path in ins:
            if same_file(in_path, path) or (os.path.isdir(text) and same_file(text, in_path)):
                raise InputError(f"{flag} {text} holds (or is) the input {in_flag} {in_path}; "
                                 "writing into it could overwrite the input. Choose another "
                                 "folder or move the input out")


def failed_gpus_arg(text: str | None) -> list[int] | None:
    """``--failed-gpus 3,17`` -> ``[3, 17]`` (None when absent)."""
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(
            f"--failed-gpus {text!r} is not a comma-separated list of GPU indices (e.g. 3,17)"
        ) from None


def topology_from(args: argparse.Namespace) -> Topology:
    return Topology.parse(
        args.topology,
        args.slots,
        nvlink_gbps=args.nvlink_gbps,
        rdma_gbps=args.rdma_gbps,
        failed_gpus=failed_gpus_arg(getattr(args, "failed_gpus", None)),
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


# ------------------------------------------------------------------ numbers and options
MAX_SEED = 2**31 - 1  # CP-SAT and most RNG front ends take a 32-bit seed


def say_dropped(lost: Sequence[str], fmt: str, lossless: str) -> None:
    """Print which fields the written format ``fmt`` could not hold (``lost``), if any."""
    if lost:
        print(f"note: {fmt} does not hold {', '.join(lost)}; use {lossless} to keep everything")


def seed_arg(text: str) -> int:
    """argparse type of ``--seed``: an integer in 0..2**31-1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seed {text!r} is not an integer") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"seed {value} is outside 0..{MAX_SEED}")
    return value


def _finite_positive(text: str, what: str, finite: str, zero: bool = False) -> float:
    """``text`` as a finite float > 0 (``zero``: >= 0), else argparse's error: "is not
    ``what``" or "must be ``finite``"."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if not ((value >= 0 if zero else value > 0) and value < float("inf")):
        raise argparse.ArgumentTypeError(f"{text} must be {finite}")
    return value


def gbps_arg(text: str) -> float:
    """argparse type of ``--nvlink-gbps`` / ``--rdma-gbps``: a finite bandwidth > 0 GB/s."""
    return _finite_positive(text, "a bandwidth in GB/s", "a finite bandwidth > 0 GB/s")


def seconds_arg(text: str) -> float:
    """argparse type of ``--time-limit``: a finite number of seconds > 0."""
    return _finite_positive(text, "a number of seconds", "a finite number of seconds > 0")


def seconds_or_zero_arg(text: str) -> float:
    """argparse type of a time limit where 0 means "skip" (``--ilp-limit``): finite seconds
    >= 0."""
    return _finite_positive(text, "a number of seconds", "a finite number of seconds >= 0",
                            zero=True)


def topology_hint(text: str | None, slots: int | None) -> Topology | str | None:
    """``--topology``/``--slots`` for reading a placement file: None without ``--topology``;
    ``"NODESxGPUS"`` as given when ``--slots`` is absent (a runtime file states its slots:
    `eplb.io.read_placement`); else the `Topology`."""
    if text is None:
        return None
    if slots is None and isinstance(text, str) and text.lower().count("x") == 1:
        return text
    return Topology.parse(text, slots)


def check_topology_hint(placement, hint, path) -> None:
    """Refuse ``--topology``/``--slots`` (``hint``, a `Topology`, ``"NODESxGPUS"`` or None)
    that contradict the topology the placement file ``path`` carries (native and npz files
    store theirs; the flags were silently ignored there)."""
    shape = lambda t: f"{t.num_nodes}x{t.gpus_per_node}x{t.slots_per_gpu}"  # noqa: E731
    if isinstance(hint, str):
        have = f"{placement.topology.num_nodes}x{placement.topology.gpus_per_node}"
        if hint.lower().replace(" ", "") != have:
            raise InputError(f"--topology {hint} contradicts {path}, which stores {have} "
                             f"(nodes x GPUs); drop --topology or fix it")
        return
    if hint is not None and shape(hint) != shape(placement.topology):
        raise InputError(f"--topology {shape(hint)} (nodes x GPUs x slots per GPU) contradicts "
                         f"{path}, which stores {shape(placement.topology)}; drop --topology "
                         "and --slots (they are for SGLang/TensorRT-LLM/vLLM files) or fix them")


def stop_tol_arg(text: str) -> float:
    """argparse type of ``--rel-tol``: a relative tolerance that ends a search, in
    [1e-12, 1) (`eplb.tolerance.check_stop_tol`: below float noise it would never end)."""
    from eplb.tolerance import check_stop_tol

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    try:
        return check_stop_tol("--rel-tol", value, flag="the tolerance")
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def fraction_arg(upper_open: bool = False):
    """argparse type of a fraction in (0, 1] (``upper_open``: (0, 1)), e.g. ``--goodput``."""
    interval = "(0, 1)" if upper_open else "(0, 1]"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (0 < value < 1 if upper_open else 0 < value <= 1):
            raise argparse.ArgumentTypeError(f"{text} must be a fraction in {interval}")
        return value

    return parse


def check_groups(groups, num_experts: int, topk_groups=None, *, flag: str = "--groups",
                 fallback: bool = False) -> None:
    """Refuse expert groups that do not divide the experts (unless ``fallback``: the solver
    places globally where groups do not apply, as DeepSeek's rule), and bad ``--topk-groups``."""
    if groups is not None:
        if groups < 1:
            raise InputError(f"{flag} must be >= 1, got {groups}")
        if num_experts % groups and not fallback:
            divisors = [d for d in range(1, min(num_experts, 64) + 1) if num_experts % d == 0]
            raise InputError(
                f"{flag} {groups} does not divide the {num_experts} experts (groups are equal "
                f"blocks of experts); use one of {', '.join(map(str, divisors))}"
            )
    if topk_groups is not None:
        if groups is None:
            raise InputError("--topk-groups needs expert groups (--groups G or a trace "
                             "that records num_groups)")
        if not 1 <= topk_groups <= groups:
            raise InputError(f"--topk-groups {topk_groups} must be in 1..{groups} (the groups)")


# solve() arguments that have their own flags; --option must not pass them again
RESERVED_OPTIONS = {"num_groups": "--groups", "seed": "--seed", "time_limit": "--time-limit",
                    "previous": None, "load": None, "topology": None}


def describe_options(name: str) -> str:
    """Solver ``name``'s ``--option`` keys, comma-separated (`solver_options.option_names`)."""
    from eplb.evaluation.solver_options import option_names  # lazy: keeps eplb --help fast

    return ", ".join(sorted(option_names(name))) or "none"


def check_reserved(key: str, flag: str = "--option") -> None:
    """Refuse an ``--option`` key that has its own flag (``seed``: ``--seed``, ...)."""
    if key in RESERVED_OPTIONS:
        own = RESERVED_OPTIONS[key]
        raise InputError(f"{flag} {key}=...: {key} is not a solver option"
                         + (f"; use {own}" if own else ""))


def check_solver_options(name: str, options: Mapping[str, object], flag: str = "--option",
                         *, previous: bool = False) -> None:
    """Refuse keys that have their own flags, unknown ``--option`` keys of solver ``name`` and
    values of the wrong kind (`solvers.resolve`: the solver package's own checks)."""
    from eplb import solvers  # lazy: keeps eplb --help fast

    for key in options:
        check_reserved(key, flag)
    solvers.resolve(name, dict(options), previous=previous)


def solvers_epilog(example: str) -> str:
    """``--help`` text listing each solver and its ``--option`` keys (imports solvers)."""
    from eplb import solvers  # lazy: only for --help

    lines = ["solvers and their --option keys (KEY=VALUE, value parsed as JSON):"]
    for name in solvers.available():
        lines += textwrap.wrap(describe_options(name), 78, initial_indent=f"  {name:<13} ",
                               subsequent_indent=" " * 16)
    lines += ["", example]
    return "\n".join(lines)


def windows_arg(spec: str | None, flag: str = "--windows"):
    """``--windows`` text -> a window selection for `Trace.load` (`traces.windows`)."""
    from eplb.traces.windows import parse_windows  # lazy: keeps eplb --help fast

    return parse_windows(spec, flag)


def read_trace(path, format: str | None = None, passes_per_window: int | None = None):
    """`traces.read` of ``path`` (a file of another kind, a placement or a request trace,
    named as such: `recognise.explain`) with every ``passes_per_window`` windows summed
    (`traces.group_passes`; ``--passes-per-window``)."""
    from eplb import traces  # lazy: keeps eplb --help fast
    from eplb.cli.recognise import read_trace_as

    trace = read_trace_as(path, format)
    if passes_per_window is not None:
        if passes_per_window < 1:
            raise InputError(f"--passes-per-window must be >= 1, got {passes_per_window}")
        trace = traces.group_passes(trace, passes_per_window)
    return trace


def print_notes(trace, file=None) -> None:
    """Print what the reader said about ``trace``'s file (``meta["notes"]``: records left out
    or skipped, recorder buffer rows dropped), one ``note:`` line each."""
    for note in trace.meta.get("notes") or ():
        print(f"note: {note}", file=file)


# ------------------------------------------------------------------ expert groups from a model
MODEL_ALIASES = {"deepseek_r1": "deepseek_v3"}  # same architecture (config.json n_group 8)
GROUPS_HINT = "pass --groups G (DeepSeek-V3: 8) or --model PRESET (deepseek_v3)"
TOPK_HINT = ("pass --groups G --topk-groups T (DeepSeek-V3: --groups 8 --topk-groups 4) or "
             "--model PRESET (deepseek_v3)")


def model_preset(name: str | None):
    """The model preset (`serving.config.model.MODELS`) a model name means: a preset name, or
    a runtime's model id such as ``deepseek-ai/DeepSeek-V3`` (organisation dropped, case and
    punctuation ignored, a suffix after the name allowed); None when no preset matches."""
    import re

    from eplb.evaluation.serving.config.model import MODELS  # lazy: keeps eplb --help fast

    if not isinstance(name, str) or not name.strip():
        return None
    key = re.sub(r"[^a-z0-9]+", "_", name.strip().lower().rsplit("/", 1)[-1]).strip("_")
    for preset in (*MODELS, *MODEL_ALIASES):
        if key == preset or key.startswith(preset + "_"):
            return MODELS[MODEL_ALIASES.get(preset, preset)]
    return None


def check_model_flag(name: str | None):
    """``--model PRESET``: the preset, or one `InputError` listing them."""
    if name is None:
        return None
    from eplb.evaluation.serving.config.model import get_model  # lazy

    return model_preset(name) or get_model(name)  # a preset, a runtime's id or a config.json


def with_model_groups(trace, model_flag: str | None = None):
    """``(trace, source)``: ``trace`` with ``meta["num_groups"]`` / ``["topk_groups"]`` filled
    from the model preset ``--model`` names, or else the one the trace's ``meta["model"]``
    names, where the trace records none (DeepSeek-V3: 8 groups, top 4); ``source`` says where
    the groups come from ("the trace's record", "model deepseek_v3 (--model)", ...) or is None
    when no groups are known."""
    from eplb.traces import Trace  # lazy: keeps eplb --help fast

    meta = dict(trace.meta)
    if model_flag is None and "num_groups" in meta and "topk_groups" in meta:
        return trace, "the trace's record"  # (no model preset is imported: keeps solve light)
    spec = check_model_flag(model_flag)
    how = "--model"
    if spec is None:
        spec, how = model_preset(meta.get("model")), f"named by the trace: {meta.get('model')!r}"
    source = "the trace's record" if "num_groups" in meta else None
    if spec is None or ("num_groups" in meta and "topk_groups" in meta):
        return trace, source
    if trace.num_experts != spec.num_experts:
        return trace, source  # another model's preset: its groups would not fit
    if "num_groups" not in meta:
        meta["num_groups"] = spec.num_groups
        source = f"model {spec.name} ({how})"
    if meta["num_groups"] == spec.num_groups:
        meta.setdefault("topk_groups", spec.topk_groups)
    return Trace(trace.counts, trace.layer_ids, trace.source_counts, trace.topk_ids,
                 trace.token_rank, meta), source


def model_defaults(args, *, routing: bool = False) -> None:
    """Fill ``args.groups`` (and with ``routing`` ``args.topk_groups``, ``args.top_k``,
    ``args.hidden``) that were not given from ``--model`` (a preset or a Hugging Face
    config.json): its expert groups (none when it has one), groups per token, top-k and hidden
    size. Nothing without ``--model``."""
    if getattr(args, "model", None) is None:
        return
    m = check_model_flag(args.model)
    if args.groups is None and m.num_groups > 1:
        args.groups = m.num_groups
    if not routing:
        return
    if args.topk_groups is None and m.topk_groups < m.num_groups:
        args.topk_groups = m.topk_groups
    if args.top_k is None:
        args.top_k = m.top_k
    if args.hidden is None:
        args.hidden = m.hidden
