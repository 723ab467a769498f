"""``eplb advise``: what each balancing lever buys on a runtime dump's loads (docs/advise.md)."""

from __future__ import annotations

import argparse
import sys

from eplb.cli import option_groups as og
from eplb.cli.common import (
    check_outputs,
    check_solver_options,
    parse_options,
    seconds_or_zero_arg,
)
from eplb.errors import InputError


def _ints(text: str, flag: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"{flag} {text!r} is not a comma-separated list of integers") from None
    if not out:
        raise InputError(f"{flag} is empty; give integers like 0,32,64")
    return out


def _names(text: str, flag: str) -> list[str]:
    out = [x.strip() for x in text.split(",") if x.strip()]
    if not out:
        raise InputError(f"{flag} is empty; give names like rebalance,craft")
    return out


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "advise",
        help="is expert balancing worth it here? each lever's step time and tokens/s/node",
        description="From a runtime dump (SGLang expert-distribution JSON/.pt, a native trace "
        "or a stacked windows file) and a deployment, print what each lever buys: a rebalance "
        "from today's placement (weights moved, copy time, stall), N redundant experts (and the "
        "KV cache they cost), per-layer replica budgets at the same memory (craft: empty slots "
        "free KV cache), per-batch dispatch balancing (lp, with its overhead), and the "
        "break-even tokens per rank below which each does not pay. The loads are measured; "
        "every time is modelled by the step-time model. Each column is explained below the "
        "table.",
    )
    p.add_argument("dump", metavar="DUMP", nargs="+",
                   help="expert-load dump or trace file; several are stacked as windows "
                   "(as eplb trace stack) and summed")
    og.topology(p, required=True, slots_required=True, note="for one EP unit",
                slots_note="today: 288 = 256 + 32 redundant")
    p.add_argument("--phase", default="decode", choices=("prefill", "decode"))
    p.add_argument("--tokens-per-rank", type=int, metavar="N",
                   help="prefill: tokens per rank per step (default 16384); decode: running "
                   "requests per rank (default 128)")
    og.hardware(p, default="h800")
    og.model(p, default="deepseek_v3", note="the dump must have its MoE layers x experts")
    p.add_argument("--previous", metavar="PLACEMENT",
                   help="today's placement file (default: trivial, slot p holds expert p mod E)")
    p.add_argument("--redundant", default="0,32,64", metavar="N,N",
                   help="redundant experts to try (default 0,32,64; N whose E+N slots do not "
                   "split over the GPUs are skipped with a note); the craft rows spend N per "
                   "layer on average within today's slots")
    p.add_argument("--levers", metavar="NAME,NAME",
                   help="levers to run (default all: today, rebalance, redundant, craft, "
                   "dispatch_lp, waterfill, dispatch_duplicate, bound; today always runs)")
    og.solver(p, default="deepseek", note="of every row that solves: rebalance, redundant and "
              "the rebalanced rows of dispatch_lp, waterfill and dispatch_duplicate")
    og.solver_options(p, example="--solver lplb --option graph=torus")
    og.time_limit(p)
    p.add_argument("--kv-tokens", type=int, default=4096, metavar="N",
                   help="decode: context per request, tokens (default 4096)")
    p.add_argument("--input-tokens", type=int, default=4096, metavar="N",
                   help="prefill: prompt length, tokens (default 4096)")
    p.add_argument("--migration", default="stall", choices=("stall", "overlap"),
                   help="a rebalance stops the unit for the copy (stall, default) or overlaps it")
    p.add_argument("--migration-gbps", type=float, default=50.0, metavar="GB/s",
                   help="weight-copy bandwidth per GPU (default 50, RDMA)")
    p.add_argument("--interval", type=float, default=600.0, metavar="SEC",
                   help="seconds between rebalances, over which a stall is amortised (default 600)")
    p.add_argument("--lp-overhead", type=seconds_or_zero_arg, metavar="SEC",
                   help="lp dispatch: seconds on the critical path per MoE layer and "
                   "micro-batch for the all-reduce of expert counts and the solve (default "
                   "1e-4, DeepSeek LPLB's published ~100 us; 0: the split's gain before "
                   "overheads)")
    p.add_argument("--from-summary", metavar="RUN",
                   help="take the operating point (tokens or running requests per rank, the "
                   "context) a simulation measured: its output folder (eplb simulate -o RUN) or "
                   "RUN/summary.json; instead of --tokens-per-rank, --kv-tokens, --input-tokens")
    p.add_argument("--replicas", default="even", choices=("even", "sglang"),
                   help="how the runtime splits an expert's tokens over its replicas: even "
                   "(default) or sglang (the trivial layout without a dispatch algorithm serves "
                   "expert e from slot e only; other placements by SGLang's static per-GPU map)")
    p.add_argument("--max-tokens", type=int, metavar="N",
                   help="top of the break-even search, tokens per rank")
    og.seed(p, "the solver")
    og.as_json(p)
    p.add_argument("-o", "--output", metavar="FILE",
                   help="also write the result: .json as JSON, .csv the table, else the text")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from eplb.atomic import atomic_write_text
    from eplb.evaluation.serving.advise import advise
    from eplb.evaluation.serving.config.hardware import LP_OVERHEAD_S
    from eplb.format import json_text

    check_outputs({"DUMP": args.dump, "--previous": args.previous, "--model": args.model,
                   "--hardware": args.hardware}, {"-o": args.output})
    if args.from_summary is not None and args.tokens_per_rank is not None:
        raise InputError("give --from-summary or --tokens-per-rank, not both: the summary's "
                         "run sets the operating point")
    options = parse_options(args.option)
    check_solver_options(args.solver, options)  # as eplb solve: before reading the dump
    result = advise(
        args.dump if len(args.dump) > 1 else args.dump[0], args.topology, args.slots,
        phase=args.phase,
        tokens_per_rank=args.tokens_per_rank, hardware=args.hardware, model=args.model,
        previous=args.previous, redundant=_ints(args.redundant, "--redundant"),
        levers=None if args.levers is None else _names(args.levers, "--levers"),
        solver=args.solver, solver_options=options, kv_tokens=args.kv_tokens,
        input_tokens=args.input_tokens,
        migration=args.migration, migration_gbps=args.migration_gbps,
        rebalance_interval_s=args.interval, max_tokens=args.max_tokens, seed=args.seed,
        replicas=args.replicas, from_summary=args.from_summary,
        lp_overhead_s=LP_OVERHEAD_S if args.lp_overhead is None else args.lp_overhead,
        time_limit=args.time_limit,
    )
    as_json = json_text(result.to_dict(), indent=1, default=float)  # NaN as null
    text = result.to_text()
    print(as_json if args.json else text)
    if args.output:
        out = str(args.output)
        if out.endswith(".json"):
            atomic_write_text(out, as_json + "\n")
        elif out.endswith(".csv"):
            atomic_write_text(out, result.table.to_csv(index=False))
        else:
            atomic_write_text(out, text + "\n")
        print(f"wrote {out}", file=sys.stderr)
    return 0
