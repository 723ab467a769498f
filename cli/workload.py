"""``eplb workload``: inspect (``info``), generate (``synth``) and convert (``convert``) request
workloads for the serving layer."""

from __future__ import annotations

import argparse
import math

from eplb.cli import option_groups as og
from eplb.cli.common import check_outputs, say_dropped
from eplb.cli.recognise import read_workload_as
from eplb.errors import InputError
from eplb.format import json_text, text_table

READ_FORMATS = ("mooncake", "azure", "csv", "parquet")
WRITE_FORMATS = ("mooncake", "csv", "parquet")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "workload",
        help="inspect, generate and convert request workloads (serving)",
        description="Inspect, generate and convert request workloads: Mooncake JSON lines, "
        "the Azure LLM inference CSV, plain CSV/Parquet with the Workload columns.",
    )
    wsub = p.add_subparsers(dest="workload_command", metavar="SUBCOMMAND")

    info = wsub.add_parser(
        "info",
        help="count, rate, length percentiles and prefix-hit rate of a workload",
        description="Print a workload's request count, span, rate, input/output length "
        "percentiles and the token-weighted prefix-hit rate an unbounded cache would give.",
        epilog="example: eplb workload info ../shared/requests/mooncake_conversation.jsonl",
    )
    info.add_argument("file", metavar="FILE")
    og.formats(info, out=False, choices=READ_FORMATS)
    og.block_size(info)
    og.as_json(info, what="the summary")
    info.set_defaults(func=run_info)

    synth = wsub.add_parser(
        "synth",
        help="generate a seeded synthetic workload",
        description="Generate requests with Poisson/gamma/constant arrivals, lognormal (or "
        "resampled) lengths, multi-turn sessions and shared system prompts. --hit-rate solves "
        "for the session continuation probability that gives that token-weighted prefix-hit "
        "rate with an unbounded cache.",
        epilog="example: eplb workload synth -n 5000 --rate 8 --hit-rate 0.56 "
        "--system-prompts 4 --system-prompt-tokens 1024 -o day6.parquet",
    )
    synth.add_argument(
        "-o", "--output", required=True, metavar="FILE", help="output file (.parquet, .csv, .jsonl)"
    )
    og.formats(synth, choices=WRITE_FORMATS)
    synth.add_argument(
        "-n",
        "--requests",
        type=int,
        default=1000,
        metavar="N",
        help="number of requests (default 1000)",
    )
    synth.add_argument(
        "--rate",
        type=float,
        default=1.0,
        metavar="REQ/S",
        help="mean arrival rate in requests/s (default 1)",
    )
    synth.add_argument(
        "--arrival",
        choices=("poisson", "gamma", "constant"),
        default="poisson",
        help="arrival process (default poisson)",
    )
    synth.add_argument(
        "--cv",
        type=float,
        default=1.0,
        help="gamma arrivals: coefficient of variation of the gaps (default 1)",
    )
    synth.add_argument(
        "--input-mean",
        type=float,
        default=2048.0,
        metavar="TOKENS",
        help="mean new prompt tokens per request (default 2048)",
    )
    synth.add_argument(
        "--input-sigma",
        type=float,
        default=1.0,
        help="log-space sigma of the prompt lengths, 0..10 (default 1)",
    )
    synth.add_argument(
        "--output-mean",
        type=float,
        default=256.0,
        metavar="TOKENS",
        help="mean output tokens (default 256)",
    )
    synth.add_argument(
        "--output-sigma",
        type=float,
        default=1.0,
        help="log-space sigma of the output lengths, 0..10 (default 1)",
    )
    synth.add_argument(
        "--lengths-from",
        metavar="FILE",
        help="resample (input, output) lengths from this workload instead",
    )
    share = synth.add_mutually_exclusive_group()
    share.add_argument(
        "--hit-rate",
        type=float,
        metavar="H",
        help="target prefix-hit rate of an unbounded cache, in [0, 1)",
    )
    share.add_argument(
        "--session-prob",
        type=float,
        metavar="P",
        help="probability that a request continues an open session",
    )
    synth.add_argument(
        "--system-prompts",
        type=int,
        default=0,
        metavar="K",
        help="distinct shared system prompts (default 0)",
    )
    synth.add_argument(
        "--system-prompt-tokens",
        type=int,
        default=0,
        metavar="TOKENS",
        help="length of each system prompt (default 0)",
    )
    synth.add_argument(
        "--open-sessions",
        type=int,
        default=32,
        metavar="K",
        help="sessions a continuation picks from (default 32)",
    )
    synth.add_argument(
        "--max-input-tokens",
        type=int,
        default=131072,
        metavar="TOKENS",
        help="context limit; a session that outgrows it ends (default 131072)",
    )
    og.block_size(synth, default=512)
    og.seed(synth, "the generator", any_int=True)
    synth.set_defaults(func=run_synth)

    conv = wsub.add_parser(
        "convert",
        help="convert a workload between formats, optionally rescaling its rate",
        description="Read IN in any supported format and write OUT (.parquet lossless, .csv, "
        "Mooncake .jsonl). --rate/--speedup replay it at another load (gaps scaled, or Poisson "
        "arrivals redrawn with --poisson); --head keeps the first N requests.",
        epilog="example: eplb workload convert azure_code_2023.csv azure.parquet --speedup 4",
    )
    conv.add_argument("input", metavar="IN")
    conv.add_argument("output", metavar="OUT")
    og.formats(conv, choices=WRITE_FORMATS)
    og.formats(conv, out=False, flag="--in-format", choices=READ_FORMATS)
    og.block_size(conv, note="of the input")
    og.rescale(conv)
    conv.add_argument(
        "--poisson",
        action="store_true",
        help="with --rate/--speedup: redraw Poisson arrivals in the original "
        "order instead of scaling the gaps",
    )
    og.seed(conv, "--poisson", any_int=True)
    conv.set_defaults(func=run_convert)

    p.set_defaults(func=lambda args: _no_sub(p))


def _no_sub(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _num(x, digits: int = 0) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return "nan"
    return f"{x:,.{digits}f}"


# ------------------------------------------------------------------ info
def run_info(args: argparse.Namespace) -> int:

    wl = read_workload_as(args.file, format=args.format, block_size=args.block_size)
    s = wl.summary()
    if args.json:
        print(json_text({"file": args.file, **s, "meta": wl.meta}, indent=1))
        return 0
    fmt = wl.meta.get("provenance", {}).get("format", "?")
    rows = [
        ("file", f"{args.file} ({fmt})"),
        ("requests", f"{s['count']:,}"),
        ("span", f"{_num(s['span_s'], 1)} s"),
        ("rate", f"{_num(s['rate_rps'], 3)} req/s (1 / mean gap)"),
        ("input tokens", f"total {s['input_tokens_total']:,}"),
        ("output tokens", f"total {s['output_tokens_total']:,}"),
    ]
    if s["sessions"] is not None:
        rows.append(("sessions", f"{s['sessions']:,}"))
    hit = (
        "no block hashes (no prefix hits can be derived)"
        if not s["has_block_hashes"]
        else f"{s['prefix_hit_rate']:.4f} of input tokens (unbounded cache, "
        f"{s['block_size']}-token blocks, arrival order)"
    )
    rows.append(("prefix-hit rate", hit))
    gen = wl.meta.get("generator")
    if isinstance(gen, dict) and gen.get("hit_rate_target") is not None:
        rows.append(
            (
                "generator",
                f"hit-rate target {gen['hit_rate_target']}, session "
                f"continuation probability {gen['session_prob']:.4f}",
            )
        )
    for note in wl.meta.get("notes", []):
        rows.append(("note", note))
    print(text_table(rows))
    print()
    header = ["tokens per request", "mean", "p50", "p90", "p99", "max"]
    body = [
        [
            k,
            *(
                _num(s[f"{k}_{q}"], 1 if q == "mean" else 0)
                for q in ("mean", "p50", "p90", "p99", "max")
            ),
        ]
        for k in ("input", "output")
    ]
    print(text_table(body, header))
    return 0


# ------------------------------------------------------------------ synth
def run_synth(args: argparse.Namespace) -> int:
    from eplb.evaluation.serving import workload as W  # lazy: keeps eplb --help fast

    check_outputs({"--lengths-from": args.lengths_from}, {"-o": args.output})
    fmt = W.write_format(args.output, args.format)
    lengths = read_workload_as(args.lengths_from) if args.lengths_from else None
    wl = W.synthesize(
        args.requests,
        rate=args.rate,
        arrival=args.arrival,
        cv=args.cv,
        input_mean=args.input_mean,
        input_sigma=args.input_sigma,
        output_mean=args.output_mean,
        output_sigma=args.output_sigma,
        lengths_from=lengths,
        hit_rate=args.hit_rate,
        session_prob=args.session_prob,
        system_prompts=args.system_prompts,
        system_prompt_tokens=args.system_prompt_tokens,
        open_sessions=args.open_sessions,
        max_input_tokens=args.max_input_tokens,
        block_size=args.block_size,
        seed=args.seed,
    )
    W.write(wl, args.output, fmt)
    gen = wl.meta["generator"]
    print(f"wrote {args.output} ({fmt}): {wl}")
    print(
        f"prefix-hit rate (unbounded cache): {gen['hit_rate_realised']:.4f}"
        + (f" (target {gen['hit_rate_target']})" if gen["hit_rate_target"] is not None else "")
    )
    _say_dropped(wl, fmt)
    return 0


# ------------------------------------------------------------------ convert
def run_convert(args: argparse.Namespace) -> int:
    from eplb.evaluation.serving import workload as W  # lazy: keeps eplb --help fast

    check_outputs({"IN": args.input}, {"OUT": args.output})
    fmt = W.write_format(args.output, args.format)
    if args.poisson and args.rate is None and args.speedup is None:
        raise InputError("--poisson needs --rate or --speedup")
    if args.head is not None and args.head < 1:
        raise InputError(f"--head must be >= 1, got {args.head}")
    wl = read_workload_as(args.input, format=args.in_format, block_size=args.block_size)
    if args.head is not None:
        wl = wl.head(args.head)
    if args.rate is not None or args.speedup is not None:
        wl = W.rescale(
            wl,
            rate=args.rate,
            speedup=args.speedup,
            how="poisson" if args.poisson else "scale",
            seed=args.seed,
        )
    W.write(wl, args.output, fmt)
    print(f"wrote {args.output} ({fmt}): {wl}")
    for note in wl.meta.get("notes", []):
        print(f"note: {note}")
    _say_dropped(wl, fmt)
    return 0


def _say_dropped(wl, fmt: str) -> None:
    from eplb.evaluation.serving import workload as W  # lazy: keeps eplb --help fast

    say_dropped(W.dropped(wl, fmt), fmt, ".parquet")
