"""``eplb trace``: inspect (``info``), generate (``synth``), convert (``convert``) and stack
(``stack``) traces."""

from __future__ import annotations

import argparse
from pathlib import Path

from eplb.cli import option_groups as og
from eplb.cli.common import (
    check_outputs,
    parse_options,
    print_notes,
    read_trace,
    say_dropped,
    windows_arg,
)
from eplb.errors import InputError
from eplb.format import text_table

KINDS = ("zipf", "lognormal", "uniform", "drift", "bursty", "calibrated", "tokens")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "trace",
        help="inspect, generate and convert expert-load traces",
        description="Inspect, generate and convert expert-load traces (native .npz, SGLang "
        ".json/.pt dumps, long .csv/.parquet, per-rank CSV directories).",
    )
    tsub = p.add_subparsers(dest="trace_command", metavar="SUBCOMMAND")

    info = tsub.add_parser(
        "info", help="shape, windows and per-layer skew of a trace",
        description="Print a trace's shape, metadata and per-layer skew table "
        "(max/mean, CV, Gini, share of the top 1% / 10% of experts).",
        epilog="example: eplb trace info traces/data/deepseek-v3-calibrated.npz "
        "--plot heatmap.png",
    )
    info.add_argument("file", metavar="FILE", help="trace file or per-rank directory")
    og.formats(info, out=False)
    og.passes_per_window(info)
    og.windows(info)
    og.ema(info)
    info.add_argument("--plot", metavar="PNG", help="write a layer x expert load heatmap")
    info.set_defaults(func=run_info)

    synth = tsub.add_parser(
        "synth", help="generate a synthetic or calibrated trace",
        description="Generate a seeded trace. KIND: zipf, lognormal, uniform, drift, bursty, "
        "calibrated (DeepSeek-V3 statistics), tokens (token-level group-limited routing "
        "matching --target). Generator-specific options go in --param KEY=VALUE (values are "
        "JSON), e.g. --param skew=[0.8,1.2], --param rate=0.2, --param phase=prefill.",
        epilog="examples: eplb trace synth calibrated --windows 32 -o cal.npz; "
        "eplb trace synth tokens --target cal.npz --tokens 2048 -o tok.npz",
    )
    synth.add_argument("kind", metavar="KIND", choices=KINDS, help=", ".join(KINDS))
    synth.add_argument("-o", "--output", required=True, metavar="FILE",
                       help="output file (.npz, .parquet, .csv, .json)")
    og.formats(synth)
    synth.add_argument("--layers", type=int, metavar="L", help="MoE layers")
    synth.add_argument("--experts", type=int, metavar="E", help="experts per layer")
    synth.add_argument("--windows", type=int, metavar="T", help="time windows")
    synth.add_argument("--tokens", type=int, metavar="N",
                       help="tokens per window (tokens: number of tokens to route)")
    og.top_k(synth, default=None)
    synth.add_argument("--first-layer", type=int, metavar="ID",
                       help="model layer id of the first layer (e.g. 3 for DeepSeek-V3)")
    synth.add_argument("--target", metavar="TRACE", help="tokens: trace whose load to match")
    og.seed(synth, "the generator", any_int=True)
    synth.add_argument("--param", action="append", metavar="KEY=VALUE",
                       help="generator parameter, repeatable (value parsed as JSON if it can be)")
    og.quiet(synth, note="tokens: one per layer routed, on stderr")
    synth.set_defaults(func=run_synth)

    conv = tsub.add_parser(
        "convert", help="convert a trace between formats",
        description="Read IN in any supported format and write OUT (.npz lossless, .parquet, "
        ".csv, SGLang .json). Parts the output format cannot hold are named.",
        epilog="example: eplb trace convert dump.pt trace.npz",
    )
    conv.add_argument("input", metavar="IN")
    conv.add_argument("output", metavar="OUT")
    og.formats(conv, names=og.TRACE_FORMATS)
    og.formats(conv, out=False, flag="--in-format")
    og.passes_per_window(conv)
    conv.set_defaults(func=run_convert)

    stk = tsub.add_parser(
        "stack", help="stack several traces as the windows of one",
        description="Read each FILE (any supported format, e.g. SGLang dumps taken at "
        "different times) and write one trace whose windows are theirs, in order: input for "
        "replay, the windowed policies and advise. Layers are matched by model layer id.",
        epilog="example: eplb trace stack dump_0900.json dump_1000.json dump_1100.json "
        "-o windows.npz",
    )
    stk.add_argument("files", nargs="+", metavar="FILE", help="traces, oldest first")
    stk.add_argument("-o", "--output", required=True, metavar="OUT",
                     help="output trace (.npz lossless, .parquet, .csv, SGLang .json)")
    og.formats(stk, names=og.TRACE_FORMATS)
    stk.set_defaults(func=run_stack)

    p.set_defaults(func=lambda args: _no_sub(p))


def _no_sub(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _fmt(x: float, digits: int = 3) -> str:
    return "nan" if x != x else f"{x:.{digits}f}"


# ------------------------------------------------------------------ info
def run_info(args: argparse.Namespace) -> int:
    # lazy: the library loads only when the verb runs, which keeps eplb --help fast
    from eplb import traces
    from eplb.traces.summary import picks_spread, skew_overview, skew_table
    check_outputs({"FILE": args.file}, {"--plot": args.plot})
    trace = read_trace(args.file, args.format, args.passes_per_window)
    fmt = args.format or (traces.sniff(args.file) if Path(args.file).exists() else "sglang")
    windows = windows_arg(args.windows)
    chosen = trace.window_index(windows)
    load = trace.load(windows, ema=args.ema)
    meta = trace.meta
    ids = trace.layer_ids
    rows = [("file", f"{args.file} ({fmt})")]
    if meta.get("model"):
        rows.append(("model", str(meta["model"])))
    nml = meta.get("num_model_layers")
    kind = "vLLM MoE-layer indices" if (meta.get("provenance") or {}).get("format") == \
        "vllm" else "model layers"
    rows.append(("shape", f"{trace.num_windows} windows x {trace.num_layers} layers x "
                 f"{trace.num_experts} experts ({kind} {ids.min()}..{ids.max()}"
                 + (f" of {nml}" if nml else "") + ")"))
    per = picks_spread(trace.counts)
    rows.append(("picks per window-layer",
                 f"min {per['min']:.0f}  median {per['median']:.0f}  max {per['max']:.0f}"))
    routing = [f"{k} {meta[k]}" for k in ("top_k", "num_groups", "topk_groups") if k in meta]
    if routing:
        rows.append(("routing", ", ".join(routing)))
    if trace.source_counts is not None:
        rows.append(("source ranks", str(trace.source_counts.shape[2])))
    if trace.topk_ids is not None:
        N, _, K = trace.topk_ids.shape
        rows.append(("token level", f"{N} tokens x top-{K} from "
                     f"{int(trace.token_rank.max()) + 1} source ranks"))
    prov = meta.get("provenance")
    if isinstance(prov, dict):
        keep = {k: v for k, v in prov.items() if isinstance(v, (str, int, float))}
        rows.append(("provenance", " ".join(f"{k}={v}" for k, v in keep.items())))
    how = f"EMA alpha={args.ema}" if args.ema else "sum"
    rows.append(("load", f"{how} over {len(chosen)} of {trace.num_windows} windows"))
    print(text_table(rows))
    print_notes(trace)

    df = skew_table(load, ids)
    header = ["layer", "load", "max/mean", "cv", "gini", "top1%", "top10%"]
    body = [[int(r.layer), f"{r.tokens:.0f}", _fmt(r.max_over_mean, 2), _fmt(r.cv),
             _fmt(r.gini), _fmt(r.top1pct_share), _fmt(r.top10pct_share)]
            for r in df.itertuples()]
    for name, agg in skew_overview(df).iterrows():
        body.append([name, "", _fmt(agg.iloc[0], 2), *(_fmt(v) for v in agg.iloc[1:])])
    print()
    print(text_table(body, header))
    if args.plot is not None:
        span = (f"window {int(chosen[0])}" if len(chosen) == 1 else
                f"{how} over {len(chosen)} windows")
        from eplb.evaluation.plots import load_heatmap  # lazy: matplotlib only for --plot

        load_heatmap(load, ids, args.plot, title=f"{Path(args.file).name}: {span}",
                     what="--plot")
        print(f"\nwrote {args.plot}")
    return 0


# ------------------------------------------------------------------ synth
def run_synth(args: argparse.Namespace) -> int:
    # lazy: the library loads only when the verb runs, which keeps eplb --help fast
    from eplb import traces
    from eplb.traces.generate import generate, parameters

    check_outputs({"--target": args.target}, {"-o": args.output})
    fmt = traces.writers.write_format(args.output, args.format)
    kind = args.kind
    kw = parse_options(args.param)
    given = {"num_layers": args.layers, "num_experts": args.experts, "windows": args.windows,
             "tokens": args.tokens, "top_k": args.top_k}
    if kind == "tokens":
        if args.target is None:
            raise InputError("synth tokens needs --target TRACE (a trace whose load the "
                             "tokens should match, e.g. traces/data/deepseek-v3-calibrated.npz)")
        kw["target"] = traces.read(args.target)
        given = {"num_tokens": args.tokens, "top_k": args.top_k}
        kw.setdefault("progress", not args.quiet)
    elif args.target is not None:
        raise InputError(f"--target is only for KIND tokens, not {kind}")
    kw.update({k: v for k, v in given.items() if v is not None})
    kw["seed"] = args.seed
    if args.first_layer is not None and "layer_ids" not in parameters(kind):
        raise InputError(f"--first-layer does not apply to {kind} (its layers are fixed)")
    trace = generate(kind, first_layer=args.first_layer, **kw)
    traces.write(trace, args.output, fmt)
    print(f"wrote {args.output} ({fmt}): {trace}")
    _say_dropped(trace, fmt)
    return 0


# ------------------------------------------------------------------ convert
def run_convert(args: argparse.Namespace) -> int:
    from eplb import traces  # lazy: keeps eplb --help fast
    check_outputs({"IN": args.input}, {"OUT": args.output})
    fmt = traces.writers.write_format(args.output, args.format)
    trace = read_trace(args.input, args.in_format, args.passes_per_window)
    print_notes(trace)
    traces.write(trace, args.output, fmt)
    print(f"wrote {args.output} ({fmt}): {trace}")
    _say_dropped(trace, fmt)
    return 0


# ------------------------------------------------------------------ stack
def run_stack(args: argparse.Namespace) -> int:
    from eplb import traces  # lazy: keeps eplb --help fast
    check_outputs({"FILE": args.files}, {"-o": args.output})
    fmt = traces.writers.write_format(args.output, args.format)
    trace = traces.stack(args.files)
    traces.write(trace, args.output, fmt)
    counts = ", ".join(str(p["windows"]) for p in trace.meta["provenance"]["parts"])
    print(f"wrote {args.output} ({fmt}): {trace.num_windows:,} windows ({counts} from "
          f"{len(args.files)} files) x {trace.num_layers} layers x {trace.num_experts} experts")
    lost = trace.meta["provenance"].get("dropped_token_level")
    if lost:
        print(f"note: token-level routing of {', '.join(lost)} is not stacked (counts are)")
    _say_dropped(trace, fmt)
    return 0


def _say_dropped(trace, fmt: str) -> None:
    from eplb import traces  # lazy: keeps eplb --help fast
    say_dropped(traces.dropped(trace, fmt), fmt, ".npz")
