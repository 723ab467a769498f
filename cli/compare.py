"""``eplb compare``: solvers x traces x topologies -> CSV / Markdown tables and plots."""

from __future__ import annotations

import argparse
import sys
import textwrap
import time
from pathlib import Path

from eplb.atomic import staged_outputs
from eplb.cli import option_groups as og
from eplb.cli.common import (
    TOPK_HINT,
    check_groups,
    check_outputs,
    check_reserved,
    parse_options,
    read_trace,
    seconds_or_zero_arg,
    solvers_epilog,
    with_model_groups,
)
from eplb.errors import EplbError, InputError


def fallback_lines(summary) -> list[str]:
    """One line per solver and topology whose runs fell back to the global policy (the
    ``fallback`` column: its group contract cannot hold there)."""
    if "fallback" not in summary:
        return []
    fell = summary[summary["fallback"].fillna("").astype(str) != ""]
    out = []
    for (solver, topo), rows in fell.groupby(["solver", "topology"], sort=False):
        out.append(f"{solver} on {topo}: fell back to the global policy in {len(rows)} of "
                   f"{int(((summary['solver'] == solver) & (summary['topology'] == topo)).sum())}"
                   f" runs (DeepSeek's rule): {rows['fallback'].iloc[0]}")
    return out


def routing_notes(path, groups: int | None, topk_groups: int | None) -> list[str]:
    """One line when the traffic model must assume routing the trace does not state: no
    expert groups (unrestricted top-k routing; group-aware policies left out), or groups
    without the groups each token may use (any of them)."""
    if groups is None:
        return [f"{path}: no expert groups known (the trace records none and names no model "
                f"preset): traffic assumes unrestricted top-k routing and policies that need "
                f"groups are left out; {TOPK_HINT}"]
    if topk_groups is None:
        return [f"{path}: traffic assumes each token may use any of the {groups} expert groups "
                f"(no --topk-groups, none recorded); {TOPK_HINT}"]
    return []


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
                   help="comma-separated solver names (default: every registered solver that runs "
                   "without a live placement, i.e. all but repair; lplb with a replica graph "
                   "that fits each topology, and a policy that cannot run on a trace and "
                   "topology, lplb where no graph fits or one that needs groups where none are "
                   "known, is left out there with one line saying so)")
    p.add_argument("--topologies", default="4x8:288", metavar="SPECS",
                   help="comma-separated NxG:SLOTS, NxGxSLOTS_PER_GPU, NxG+REDUNDANT or NxG "
                   "(default 4x8:288); several slot counts make a redundancy sweep")
    og.groups(p, default="each trace's own, else its model's", topk="each trace's, else its "
              "model's")
    og.model(p, note="its expert groups and routing groups (--topk-groups) apply where the "
             "trace records none")
    og.dispatch(p, what="dispatch policy of the traffic model")
    p.add_argument("--holdout", type=float, default=0.0, metavar="F",
                   help="score on the last fraction F of windows, solve on the rest (default 0: "
                   "in-sample)")
    og.time_limit(p, default=1.0)
    og.solver_options(p, example="greedy.rdma_weight=0.1", per_solver=True)
    og.plugin(p)
    og.seed(p, "the solvers")
    og.bandwidths(p)
    og.runner(p)
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
                   help="dispatch policy of the sweep's traffic model: "
                   f"{', '.join(og.DISPATCH_NAMES)} (default local_first)")
    p.add_argument("--ilp-limit", type=seconds_or_zero_arg, default=10.0, metavar="SEC",
                   help="ilp time limit in the Pareto sweep (0 skips ilp; default 10)")
    og.quiet(p)
    p.set_defaults(func=run)


def _epilog() -> str:
    from eplb.evaluation.compare import SUMMARY_COLUMNS  # lazy: only for --help

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
    """``--option`` items split per solver (`evaluation.solver_options.split_options`), after
    the flags' own checks (keys that have their own flags, solvers not in --solvers)."""
    from eplb.evaluation.solver_options import split_options  # lazy: keeps eplb --help fast

    options = parse_options(items)
    for key in options:
        solver, dot, opt = key.partition(".")
        if dot and solver not in names:
            raise InputError(f"--option {key}: solver {solver!r} is not in --solvers")
        check_reserved(opt if dot else key)
    return split_options(options, names)


def _floats(text: str, flag: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"{flag} {text!r} is not a comma-separated list of numbers") from None


def run(args: argparse.Namespace) -> int:
    # lazy: the library loads only when the verb runs, which keeps eplb --help fast
    from dataclasses import replace

    from eplb import solvers
    from eplb.evaluation.compare import CompareSpec, compare

    solvers.load_plugins(args.plugin or ())  # first: no output may replace their modules
    check_outputs({"TRACE": args.traces},
                  {"-o": args.output, "--markdown": args.markdown, "--layers-csv": args.layers_csv},
                  {"--plot": args.plot})
    names = [s.strip() for s in args.solvers.split(",") if s.strip()] if args.solvers else \
        [n for n in solvers.available() if not solvers.needs_previous(n)]
    for name in names:
        solvers.get(name)
    options = _options(args.option, names)
    if args.groups is not None:  # their ranges by their flags (each trace's experts: below)
        check_groups(args.groups, 0, args.topk_groups, fallback=True)
    # every setting (dispatch policies, topologies, holdout...) is checked once, by the specs,
    # before any trace is read; the Pareto sweep's differs in its dispatch policy only
    spec = CompareSpec(
        solvers=tuple(names) if args.solvers else None, topologies=args.topologies,
        num_groups=args.groups,
        topk_groups=args.topk_groups, policy=args.dispatch, holdout=args.holdout, seed=args.seed,
        time_limit=args.time_limit, solver_options=options, nvlink_gbps=args.nvlink_gbps,
        rdma_gbps=args.rdma_gbps,
    )
    sweep_spec = replace(spec, policy=args.pareto_dispatch)
    if args.pareto and args.plot is None:
        raise InputError("--pareto writes its plots and table into --plot DIR; give --plot")
    weights = _floats(args.pareto_weights, "--pareto-weights") if args.pareto_weights else None
    loaded, notes = {}, []
    for path in args.traces:
        name = Path(path).stem or Path(path).name
        trace, _ = with_model_groups(read_trace(path), args.model)
        loaded[name if name not in loaded else str(path)] = trace
        groups = args.groups if args.groups is not None else trace.meta.get("num_groups")
        if args.groups is not None or args.topk_groups is not None:
            check_groups(groups, trace.num_experts, args.topk_groups)
        notes += routing_notes(path, groups, args.topk_groups or trace.meta.get("topk_groups"))
    start = time.perf_counter()
    result = compare(loaded, spec, workers=args.workers, scheduler=args.scheduler,
                     progress=not args.quiet)
    seconds = time.perf_counter() - start
    ok = int((result.summary["status"] == "ok").sum())
    if ok == 0:
        raise EplbError(f"every run failed; first: {result.summary['status'].iloc[0]}")
    _refuse_failed_policies(result.summary)
    tables = result.tables()
    # every output is staged and moved into place at the end, or none is (eplb.atomic)
    with staged_outputs() as stage:
        written = _write(args, result, tables, loaded, sweep_spec, weights, stage)
    if args.markdown is None:
        print(tables)
    for line in [*notes, *result.skipped_lines(), *fallback_lines(result.summary)]:
        print(line, file=sys.stderr)
    print(f"{ok}/{len(result.summary)} runs ok in {seconds:.1f} s", file=sys.stderr)
    for path in [args.output, args.markdown, args.layers_csv] + written:
        if path is not None:
            print(f"wrote {path}", file=sys.stderr)
    return 0


# a run whose policy failed (raised, returned no valid placement, overran --time-limit),
# unlike a policy's refusal (InfeasibleError: the failed tasks table lists it), fails the
# command
_POLICY_FAILURES = ("PolicyError:", "SolverTimeout:")


def _refuse_failed_policies(summary) -> None:
    """Raise (exit 2, nothing written) when some run's policy failed rather than refused."""
    from eplb.solvers.plugins import RETURNED

    status = summary["status"].astype(str)
    failed = summary[status.str.startswith(_POLICY_FAILURES) | status.str.contains(RETURNED)]
    if len(failed):
        first = failed.iloc[0]
        raise EplbError(f"{len(failed)} of {len(summary)} runs failed, nothing written; first: "
                        f"{first['solver']} on {first['trace']} {first['topology']}: "
                        f"{first['status']}")


def _write(args, result, tables, loaded, sweep_spec, weights, stage) -> list[str]:
    """Write the CSVs, Markdown and plots into ``stage`` (`eplb.atomic.Stage`), and with
    ``--pareto`` the sweep of ``sweep_spec`` (a `CompareSpec`); returns the plot files as the
    user will see them."""
    import pandas as pd  # lazy: the library loads only when the verb runs

    from eplb.atomic import atomic_write_text
    from eplb.evaluation.tables import write_csv

    output, layers = stage.file(args.output), stage.file(args.layers_csv)
    markdown, plot_dir = stage.file(args.markdown), stage.folder(args.plot)
    if output is not None:
        result.write(output, layers_path=layers)
    elif layers is not None:
        write_csv(result.layers, layers)
    if markdown is not None:
        atomic_write_text(markdown, tables)
    written = result.plot(plot_dir) if plot_dir is not None else []
    if args.pareto:
        from eplb.evaluation import plots  # lazy: only with --pareto
        from eplb.evaluation.pareto import sweep_traces
        from eplb.evaluation.tables import slug

        sweeps = sweep_traces(loaded, sweep_spec, weights=weights, ilp_time_limit=args.ilp_limit,
                              progress=not args.quiet)
        for df in sweeps:
            tname, topology = df["trace"].iloc[0], df["topology"].iloc[0]
            stem = slug(f"{tname}_{topology}")
            written.append(plots.pareto_front(df.drop(columns=["trace", "topology"]),
                                              plot_dir / f"pareto_{stem}.png",
                                              title=f"{tname} on {topology}"))
        write_csv(pd.concat(sweeps, ignore_index=True), plot_dir / "pareto.csv")
        written.append(plot_dir / "pareto.csv")
    return [str(Path(args.plot) / Path(w).relative_to(plot_dir)) for w in written]
