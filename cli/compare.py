"""``eplb compare``: solvers x traces x topologies -> CSV / Markdown tables and plots."""

from __future__ import annotations

import argparse

from eplb.cli.common import seconds_arg, seed_arg
from eplb.topology import NVLINK_GBPS, RDMA_GBPS


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="sweep solvers x traces x topologies and tabulate balance and traffic",
        description="Solve every TRACE on every topology with every solver, score balance and "
        "modelled all-to-all traffic, and write a tidy CSV (one row per run), Markdown tables "
        "and plots. Runs on a local process pool (--workers) or a Dask cluster (--scheduler). "
        "The printed tables are, per topology: max GPU load / lower bound (first: how far from "
        "provably optimal), step max/mean GPU load, RDMA bytes per token per layer, solve "
        "seconds. Every CSV column is defined below.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.lazy_epilog = _epilog
    p.add_argument("traces", nargs="+", metavar="TRACE", help="trace files or directories")
    p.add_argument("--solvers", metavar="A,B",
                   help="comma-separated solver names (default: every registered solver)")
    p.add_argument("--topologies", default="4x8:288", metavar="SPECS",
                   help="comma-separated NxG:SLOTS, NxGxSLOTS_PER_GPU, NxG+REDUNDANT or NxG "
                   "(default 4x8:288); several slot counts make a redundancy sweep")
    p.add_argument("--groups", type=int, metavar="G",
                   help="expert groups for group-limited routing (default: each trace's own)")
    p.add_argument("--topk-groups", type=int, metavar="T",
                   help="groups each token may use (DeepSeek-V3: 4; default: each trace's); with "
                   "--groups the traffic model assumes group-limited routing")
    p.add_argument("--dispatch", default="even", metavar="POLICY",
                   help="dispatch policy of the traffic model (default even)")
    p.add_argument("--holdout", type=float, default=0.0, metavar="F",
                   help="score on the last fraction F of windows, solve on the rest (default 0: "
                   "in-sample)")
    p.add_argument("--time-limit", type=seconds_arg, default=1.0, metavar="SEC",
                   help="time limit of search solvers (ilp), wall seconds (default 1)")
    p.add_argument("--option", action="append", metavar="[SOLVER.]KEY=VALUE",
                   help="solver option, for every solver or one (e.g. greedy.rdma_weight=0.1)")
    p.add_argument("--seed", type=seed_arg, default=0, help="solver seed (default 0)")
    p.add_argument("--nvlink-gbps", type=float, default=NVLINK_GBPS, metavar="GB/s")
    p.add_argument("--rdma-gbps", type=float, default=RDMA_GBPS, metavar="GB/s")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="local worker processes (default 1: run inline)")
    p.add_argument("--scheduler", metavar="ADDR",
                   help="Dask scheduler address (tcp://host:8786); needs the dask extra")
    p.add_argument("-o", "--output", metavar="CSV", help="summary CSV, one row per run")
    p.add_argument("--markdown", metavar="MD", help="Markdown tables (default: printed)")
    p.add_argument("--layers-csv", metavar="CSV", help="per-layer CSV of every run")
    p.add_argument("--plot", metavar="DIR", help="write plots into DIR")
    p.add_argument("--pareto", action="store_true",
                   help="also sweep rdma_weight per trace and topology (Pareto front plots and "
                   "pareto.csv in --plot DIR)")
    p.add_argument("--pareto-weights", default=None, metavar="W,W",
                   help="rdma_weight values of the sweep (default 0,0.03,0.1,0.3,1,3,10)")
    p.add_argument("--pareto-dispatch", default="local_first", metavar="POLICY",
                   help="dispatch policy of the sweep's traffic model (default local_first)")
    p.add_argument("--ilp-limit", type=float, default=10.0, metavar="SEC",
                   help="ilp time limit in the Pareto sweep (0 skips ilp; default 10)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _epilog() -> str:
    import textwrap

    from eplb.cli.common import solvers_epilog
    from eplb.evaluation.compare import SUMMARY_COLUMNS

    lines = ["summary columns (-o CSV; the printed tables use the first ones):"]
    for name, text in SUMMARY_COLUMNS.items():
        lines += textwrap.wrap(text, 78, initial_indent=f"  {name}: ", subsequent_indent="    ")
    lines.append("")
    lines.append(solvers_epilog(
        "example: eplb compare ../shared/traces/deepseek-v3-sglang/*.json --solvers "
        "deepseek,greedy --topologies 4x8:288,18x8:288 --groups 8 --workers 2 -o results.csv "
        "--plot plots/"))
    return "\n".join(lines)


def _options(items, names):
    from eplb.cli.common import check_solver_options, parse_options, solver_options
    from eplb.errors import InputError

    out: dict[str, dict] = {n: {} for n in names}
    for key, value in parse_options(items).items():
        solver, dot, opt = key.partition(".")
        if dot:
            if solver not in out:
                raise InputError(f"--option {key}: solver {solver!r} is not in --solvers")
            out[solver][opt] = value
            check_solver_options(solver, {opt: value})
        else:
            takers = [n for n in names if key in solver_options(n)]
            if not takers:
                check_solver_options(names[0], {key: value})  # raises, listing the options
            for n in takers:  # an option some solvers lack applies to the ones that have it
                check_solver_options(n, {key: value})
                out[n][key] = value
    return out


def _floats(text: str, flag: str) -> list[float]:
    from eplb.errors import InputError

    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"{flag} {text!r} is not a comma-separated list of numbers") from None


def run(args: argparse.Namespace) -> int:
    import sys
    import time
    from pathlib import Path

    import pandas as pd

    from eplb import solvers, traces
    from eplb.atomic import atomic_write_text
    from eplb.cli.common import check_groups, check_outputs
    from eplb.errors import EplbError, InputError
    from eplb.evaluation.compare import compare, parse_topologies
    from eplb.evaluation.tables import write_csv
    from eplb.executor.routing import check_policy

    check_outputs({"TRACE": args.traces},
                  {"-o": args.output, "--markdown": args.markdown, "--layers-csv": args.layers_csv},
                  {"--plot": args.plot})
    check_policy(args.dispatch)
    check_policy(args.pareto_dispatch)
    names = [s.strip() for s in args.solvers.split(",") if s.strip()] if args.solvers else \
        solvers.available()
    for name in names:
        solvers.get(name)
    options = _options(args.option, names)
    specs = parse_topologies(args.topologies)
    if args.pareto and args.plot is None:
        raise InputError("--pareto writes its plots and table into --plot DIR; give --plot")
    weights = _floats(args.pareto_weights, "--pareto-weights") if args.pareto_weights else None
    loaded = {}
    for path in args.traces:
        name = Path(path).stem or Path(path).name
        loaded[name if name not in loaded else str(path)] = trace = traces.read(path)
        if args.groups is not None or args.topk_groups is not None:
            groups = args.groups if args.groups is not None else trace.meta.get("num_groups")
            check_groups(groups, trace.num_experts, args.topk_groups)
    start = time.perf_counter()
    result = compare(
        loaded, solvers=names, topologies=[s.text for s in specs], num_groups=args.groups,
        topk_groups=args.topk_groups,
        policy=args.dispatch, holdout=args.holdout, seed=args.seed, time_limit=args.time_limit,
        solver_options=options, nvlink_gbps=args.nvlink_gbps,
        rdma_gbps=args.rdma_gbps, workers=args.workers, scheduler=args.scheduler,
        progress=not args.quiet,
    )
    seconds = time.perf_counter() - start
    ok = int((result.summary["status"] == "ok").sum())
    if ok == 0:
        raise EplbError(f"every run failed; first: {result.summary['status'].iloc[0]}")
    tables = result.tables()
    if args.output is not None:
        result.write(args.output, layers_path=args.layers_csv)
    elif args.layers_csv is not None:
        write_csv(result.layers, args.layers_csv)
    if args.markdown is not None:
        atomic_write_text(args.markdown, tables)
    written = result.plot(args.plot) if args.plot is not None else []
    if args.pareto:
        from eplb.evaluation import plots
        from eplb.evaluation.pareto import WEIGHTS, sweep
        from eplb.evaluation.tables import slug

        frames = []
        for tname, trace in loaded.items():
            groups = args.groups if args.groups is not None else trace.meta.get("num_groups")
            for spec in specs:
                topo = spec.resolve(trace.num_experts, nvlink_gbps=args.nvlink_gbps,
                                    rdma_gbps=args.rdma_gbps)
                src = trace.source_counts.sum(0) if trace.source_counts is not None and \
                    topo.num_gpus % trace.source_counts.shape[2] == 0 else None
                kw = {"top_k": int(trace.meta["top_k"])} if trace.meta.get("top_k") else {}
                tg = args.topk_groups or trace.meta.get("topk_groups")
                df = sweep(trace.load(), topo, weights=weights or WEIGHTS, num_groups=groups,
                           topk_groups=tg,
                           source_counts=src, policy=args.pareto_dispatch,
                           ilp_time_limit=args.ilp_limit or None, seed=args.seed,
                           progress=not args.quiet, **kw)
                stem = slug(f"{tname}_{spec.text}")
                written.append(plots.pareto_front(df, Path(args.plot) / f"pareto_{stem}.png",
                                                  title=f"{tname} on {spec.text}"))
                frames.append(df.assign(trace=tname, topology=spec.text))
        pareto = pd.concat(frames, ignore_index=True)
        write_csv(pareto, Path(args.plot) / "pareto.csv")
        written.append(Path(args.plot) / "pareto.csv")
    if args.markdown is None:
        print(tables)
    print(f"{ok}/{len(result.summary)} runs ok in {seconds:.1f} s", file=sys.stderr)
    for path in [args.output, args.markdown, args.layers_csv] + [str(w) for w in written]:
        if path is not None:
            print(f"wrote {path}", file=sys.stderr)
    return 0
