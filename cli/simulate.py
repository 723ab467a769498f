"""``eplb simulate``: run the serving simulator on a cluster config and a workload.

One config and one seed: writes an output folder all at once (built in a hidden temporary
folder beside it, renamed at the end): ``summary.json`` (summary and run metadata),
``requests.parquet``, ``steps.parquet``, ``rebalances.csv``, ``faults.csv``,
``utilisation.parquet``, ``config.toml`` (the config as run) and ``plots/`` (TTFT/TPOT CDFs,
tokens/s per node over time, per-rank utilisation, step-time breakdown).

Several configs, ``--variant`` override sets or ``--seeds``: one comparison table
(`serving.compare`, ``--mode closed_loop`` or ``counterfactual``); ``--rates``: a rate sweep
(`sweep.rate_sweep`); ``--capacity``: the largest rate within the goodput target
(`serving.capacity`); ``--print-config PRESET``: the preset as TOML. ``-o`` is optional for
these and gets ``results.csv``, ``table.txt`` (and the sweep's ``rate_sweep.png``).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from eplb.atomic import atomic_directory, check_output_dir
from eplb.cli import option_groups as og
from eplb.cli.common import fraction_arg, stop_tol_arg
from eplb.cli.recognise import load_cluster_as, workload_spec_as
from eplb.errors import InputError

PRESETS = ("deepseek_day6", "sglang_96xh100")  # named in --help; the library checks


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="simulate a PD-disaggregated serving cluster (TTFT, TPOT, tok/s per node)",
        description="Simulate a prefill/decode-disaggregated MoE serving cluster: DP balancers, "
        "KV store and transfers, expert placement with EPLB rebalancing in the loop, GPU "
        "failures. Prints a summary table and writes OUTDIR (summary.json, requests.parquet, "
        "steps.parquet, rebalances.csv, faults.csv, utilisation.parquet, config.toml, plots/).",
        epilog="examples: eplb simulate cluster.toml --workload "
        "../shared/requests/mooncake_conversation.jsonl --rate 20 --duration 600 -o run1; "
        "eplb simulate deepseek_day6 --workload synth:n=20000,rate=60,hit_rate=0.563 -o run2",
    )
    p.add_argument(
        "config",
        metavar="CONFIG",
        nargs="*",
        help="cluster config TOML file(s) (ClusterConfig), or preset names: "
        + ", ".join(PRESETS) + "; several are compared",
    )
    p.add_argument(
        "--print-config",
        metavar="PRESET",
        help="print the preset (or config file) as TOML, to start a config from, and exit",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field for every config, e.g. --set eplb.solver=greedy "
        "--set decode.count=2 (repeatable; values read as TOML)",
    )
    og.model(p, note="replaces every config's model (as --set model=...)")
    og.hardware(p, note="replaces every config's hardware (as --set hardware=...)")
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE[,KEY=VALUE]",
        help="compare the (first) config with these overrides, named NAME, e.g. "
        "'greedy:eplb.solver=greedy' (repeatable)",
    )
    p.add_argument(
        "--seeds",
        metavar="S1,S2,...",
        help="paired seeds of a comparison (e.g. 0,1,2; overrides --seed)",
    )
    p.add_argument(
        "--mode",
        choices=("closed_loop", "counterfactual"),
        default="closed_loop",
        help="comparison mode: closed_loop (each config its own run; default) or "
        "counterfactual (one step sequence replayed under each placement policy)",
    )
    p.add_argument("--baseline", metavar="NAME", help="config the deltas are against "
                   "(default the first)")
    p.add_argument(
        "--rates",
        metavar="R1,R2,...",
        help="rate sweep: replay the workload at each offered rate (req/s)",
    )
    p.add_argument(
        "--capacity",
        action="store_true",
        help="search the largest rate (req/s) at which --goodput of requests meet the SLO",
    )
    p.add_argument("--goodput", type=fraction_arg(), default=0.9, metavar="F",
                   help="goodput target of --capacity, in (0, 1] (default 0.9)")
    p.add_argument("--rel-tol", type=stop_tol_arg, default=0.05, metavar="F",
                   help="--capacity stops when hi / lo <= 1 + F, F in [1e-12, 1) (default 0.05)")
    og.runner(p, note="for comparisons and sweeps")
    p.add_argument(
        "--workload",
        metavar="PATH|synth:KEY=VALUE,...",
        help="a workload file (Mooncake .jsonl, Azure .csv, .csv/.parquet) or a synthetic "
        "spec 'synth:n=N,rate=R,...' with the keys of `eplb workload synth`",
    )
    og.rescale(p)
    p.add_argument(
        "--duration",
        type=float,
        metavar="S",
        help="requests arrive for S simulated seconds; the run then finishes what was admitted "
        "(at most --drain seconds more) and reports what could not finish apart (censored) "
        "(default: the whole workload, run until every request has finished)",
    )
    p.add_argument(
        "--drain",
        type=float,
        metavar="S",
        help="seconds the run may go on after arrivals stop to finish what was admitted "
        "(default: as long as --duration, at least 600; 0 stops at --duration)",
    )
    og.seed(p, "the run's arrivals, balancers and noise", any_int=True)
    p.add_argument(
        "--window",
        metavar="T0:T1",
        help="summarise over simulated seconds [T0, T1) (default: the whole run)",
    )
    p.add_argument(
        "--measure-from",
        type=float,
        metavar="S",
        help="leave the first S simulated seconds out of the summary (warm-up)",
    )
    p.add_argument("-o", "--output", metavar="OUTDIR",
                   help="output folder (required for a single run)")
    p.add_argument("--force", action="store_true", help="replace OUTDIR if it exists (atomically)")
    p.add_argument("--no-plots", action="store_true", help="skip the plots")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def load_workload(args: argparse.Namespace, block_size: int):
    from eplb.evaluation.serving import workload as W  # lazy: keeps eplb --help fast

    wl = workload_spec_as(args.workload, block_size=block_size)
    if args.head is not None:
        if args.head < 1:
            raise InputError(f"--head must be >= 1, got {args.head}")
        wl = wl.head(args.head)
    if args.rate is not None or args.speedup is not None:
        wl = W.rescale(wl, rate=args.rate, speedup=args.speedup)
    return wl


def _window(text: str | None):
    if text is None:
        return None
    a, sep, b = text.partition(":")
    try:
        t0, t1 = float(a), float(b)
    except ValueError:
        raise InputError(f"--window {text!r} is not T0:T1 in seconds (e.g. 600:3600)") from None
    if not sep or not (t1 > t0 >= 0):
        raise InputError(f"--window {text!r} needs 0 <= T0 < T1 (seconds)")
    return (t0, t1)


def _inputs(args: argparse.Namespace, configs) -> dict:
    """The files this run reads (configs, workload, routing traces), by the flag that names
    them (``configs``: the run's `ClusterConfig` objects)."""
    spec = str(args.workload)
    return {"CONFIG": [t for t in args.config_texts if Path(t).exists()],
            "--workload": None if spec.startswith("synth:") else spec,
            "routing.path": [c.routing.path for c in configs if c.routing.path],
            "model": [c.model for c in configs if Path(c.model).is_file()],
            "hardware": [c.hardware for c in configs
                         if isinstance(c.hardware, str) and Path(c.hardware).is_file()]}


def _overrides(args: argparse.Namespace) -> list[str]:
    """--model and --hardware as ``--set`` items, then the --set items (applied at once)."""
    return [f"{k}={_toml_string(v)}" for k, v in (("model", args.model),
                                                  ("hardware", args.hardware))
            if v is not None] + list(args.overrides)


def _toml_string(text: str) -> str:
    import json

    return json.dumps(str(text))


def curves_lines(named: dict, *, roofline: bool = True) -> list[str]:
    """One line per config saying what its kernel figures rest on: those built on roofline
    curves (``roofline``; printed first), else the others (printed after the result)."""
    from eplb.evaluation.serving.steptime import kernels  # lazy: keeps --help fast

    out = []
    for name, cfg in named.items():
        hw, model = cfg.hardware_spec, cfg.model_spec
        if ("roofline" in kernels.labels(hw, model).values()) == roofline:
            out.append(f"{name}: {kernels.describe(hw, model)}")
    return out


def _ints(text: str, what: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"{what} {text!r} is not whole numbers separated by commas") from None
    if not out or min(out) < 0:
        raise InputError(f"{what} {text!r} needs whole numbers >= 0 (e.g. 0,1,2)")
    return out


def _floats(text: str, what: str) -> list[float]:
    try:
        out = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"{what} {text!r} is not numbers separated by commas") from None
    if not out or not all(x > 0 and math.isfinite(x) for x in out):
        raise InputError(f"{what} {text!r} needs numbers > 0 (req/s, e.g. 10,20,40)")
    return out


def _configs(args: argparse.Namespace) -> dict:
    """``{name: ClusterConfig}``: each CONFIG with --set applied, then each --variant."""
    from eplb.evaluation.serving.config import overrides  # lazy: keeps --help fast

    if not args.config:
        raise InputError("give a CONFIG (a TOML file or a preset: " + ", ".join(PRESETS) + ")")
    named: dict = {}
    for text in args.config:
        cfg = overrides.apply(load_cluster_as(text), _overrides(args))
        name, k = cfg.name, 2
        while name in named:
            name, k = f"{cfg.name}#{k}", k + 1
        named[name] = cfg
    first = next(iter(named.values()))
    for text in args.variant:
        name, items = overrides.parse_variant(text)
        if name in named:
            raise InputError(f"--variant {name!r}: a config of that name exists already")
        named[name] = overrides.apply(first, items).replace(name=name)
    if args.baseline is not None:
        if args.baseline not in named:
            raise InputError(f"--baseline {args.baseline!r} is not one of: {', '.join(named)}")
        named = {args.baseline: named[args.baseline],
                 **{k: v for k, v in named.items() if k != args.baseline}}
    return named


def run(args: argparse.Namespace) -> int:
    if args.print_config is not None:
        from eplb.evaluation.serving.config import overrides  # lazy: keeps --help fast

        cfg = overrides.apply(load_cluster_as(args.print_config), _overrides(args))
        print(cfg.to_toml(), end="")
        return 0
    if args.workload is None:
        raise InputError("--workload is required (a file or synth:KEY=VALUE,...)")
    named = _configs(args)
    args.config_texts = list(args.config)
    seeds = _ints(args.seeds, "--seeds") if args.seeds is not None else [args.seed]
    if len(set(seeds)) < len(seeds):
        raise InputError(f"--seeds {args.seeds!r} repeats a seed; paired seeds must differ "
                         "(e.g. 0,1,2)")
    many = len(named) > 1 or len(seeds) > 1 or args.mode == "counterfactual"
    if args.capacity and args.rates is not None:
        raise InputError("--capacity searches the rate itself; drop --rates (or drop "
                         "--capacity for a sweep over the rates given)")
    if args.capacity or args.rates is not None or many:
        return _study(args, named, seeds)
    if args.output is None:
        raise InputError("-o OUTDIR is required for a single run")
    args.config = next(iter(named.values()))
    return _single(args)


def _study(args: argparse.Namespace, named: dict, seeds: list[int]) -> int:
    """A comparison, a rate sweep or a capacity search: one table, optionally -o OUTDIR."""
    from eplb.evaluation import serving  # lazy: keeps --help fast
    from eplb.evaluation.serving import sweep  # lazy: keeps --help fast

    out = None
    if args.output is not None:
        out = check_output_dir(args.output, force=args.force,
                               inputs=_inputs(args, list(named.values())))
    if args.workers < 1:
        raise InputError(f"--workers must be >= 1, got {args.workers}")
    _check_times(args)
    window = _window(args.window)
    first = next(iter(named.values()))
    workload = load_workload(args, first.kv.block_size)
    run_kw = dict(workers=args.workers, scheduler=args.scheduler,
                  progress=not args.no_progress)
    plot = None
    if args.capacity:
        frame = serving.capacity_table(named, workload, goodput=args.goodput, seeds=seeds,
                                       rel_tol=args.rel_tol, duration_s=args.duration,
                                       drain_s=args.drain, log=_log, **run_kw)
        text = capacity_text(frame)
    elif args.rates is not None:
        spec = sweep.SweepSpec(tuple(_floats(args.rates, "--rates")), tuple(seeds),
                               duration_s=args.duration, window=window, drain_s=args.drain)
        frame = sweep.rate_sweep(named, workload, spec, **run_kw)
        text = sweep.sweep_table(frame)
        if args.duration is not None:  # a time window holds other requests at each rate
            text += ("\nnote: --duration ends arrivals at the same seconds at every rate, so "
                     "each rate measures a different slice of the workload's requests; for the "
                     "same requests at every rate give --head N and no --duration")
        plot = sweep.plot_rate_sweep
    else:
        frame = serving.compare(named, workload, seeds, duration_s=args.duration,
                                window=window, mode=args.mode, drain_s=args.drain, **run_kw)
        text = sweep.comparison_text(frame, sweep.compared_columns(frame), next(iter(named)))
        points = frame.attrs.get("operating_point")
        if points:  # counterfactual: every config ran the driver's batches
            from eplb.evaluation.serving.operating_point import describe

            seed, ops = next(iter(points.items()))
            text += (f"\nevery config replays the batches of {frame.attrs['driver']!r} (seed "
                     f"{seed}); TTFT, TPOT and tok/s re-timed with each config's steps:\n"
                     + "\n".join(describe(op) for op in ops.values()))
    if args.overrides:  # the names are the configs' own: say what --set changed in each
        text = f"every config with --set {' --set '.join(args.overrides)}\n\n" + text
    roof = curves_lines(named)
    if roof:  # a result built on roofline curves says so first
        text = "\n".join(roof) + "\n\n" + text
    text += "".join(f"\n{line}" for line in curves_lines(named, roofline=False))
    print(text)
    if out is not None:  # OUTDIR appears all at once, or not at all; claimed without --force
        with atomic_directory(out, replace=args.force) as tmp:
            frame.to_csv(tmp / "results.csv", index=False)
            (tmp / "table.txt").write_text(text + "\n", encoding="utf-8")
            if plot is not None and not args.no_plots:
                plot(frame, tmp / "rate_sweep.png")
        print(f"\nwrote {out}/")
    return 0


def _check_times(args: argparse.Namespace) -> None:
    if args.duration is not None and not (args.duration > 0 and math.isfinite(args.duration)):
        raise InputError(f"--duration must be seconds > 0, got {args.duration}")
    if args.drain is not None and not (args.drain >= 0 and math.isfinite(args.drain)):
        raise InputError(f"--drain must be seconds >= 0, got {args.drain}")


def _log(line: str) -> None:
    """A progress line of a capacity search (stderr, so the table stays alone on stdout)."""
    print(line, file=sys.stderr, flush=True)


def capacity_text(frame) -> str:
    """The capacity table, then one line per config where no rate met the target: why."""
    from eplb.evaluation.serving import sweep  # lazy: keeps --help fast

    shown = frame.drop(columns=[c for c in ("reason",) if c in frame])
    text = sweep.frame_text(shown)
    for name, reason in zip(frame["config"], frame.get("reason", ()), strict=False):
        if isinstance(reason, str) and reason:
            text += f"\n{name}: {reason}"
    return text


def _single(args: argparse.Namespace) -> int:
    from eplb.evaluation.serving import simulate  # lazy: keeps --help fast
    from eplb.evaluation.serving.config.schema import admission_text

    window = _window(args.window)
    mfrom = args.measure_from
    if mfrom is not None and not (mfrom >= 0 and math.isfinite(mfrom)):
        raise InputError(f"--measure-from must be seconds >= 0, got {mfrom}")
    config = args.config
    out = check_output_dir(args.output, force=args.force, inputs=_inputs(args, [config]))
    _check_times(args)
    workload = load_workload(args, config.kv.block_size)
    result = simulate(
        config,
        workload,
        seed=args.seed,
        duration_s=args.duration,
        drain_s=args.drain,
        progress=not args.no_progress,
    )
    # OUTDIR appears all at once, or not at all; without --force the run claims it (refused
    # if another run wrote it meanwhile)
    with atomic_directory(out, replace=args.force) as tmp:
        result.save(tmp, config, window=window, plots=not args.no_plots, measure_from_s=mfrom)
    for line in curves_lines({config.name: config}):  # roofline curves: said first
        print(line)
    print(admission_text(result.meta["admission"]))  # which rule and balancers ran
    print(result.summary_table(window, measure_from_s=mfrom))
    for line in curves_lines({config.name: config}, roofline=False):
        print(line)
    from eplb.evaluation.serving.operating_point import describe, measured

    for op in measured(result.steps, result.requests, config).values():  # where it ran
        print(describe(op))
    print(
        f"\nwrote {out}/ ({len(result.requests):,} requests, {len(result.steps):,} steps, "
        f"{len(result.rebalances)} rebalance rows: scheduled, skipped and emergency)"
    )
    return 0
