"""Compare every registered solver on the real traces in ``../shared/traces``, 3 topologies.

Traces: the 6 DeepSeek-V3 SGLang dumps (58 MoE layers x 256 experts; routing top-8 within the
top 4 of 8 expert groups, so the traffic model uses its group-limited mode) and, when
its reader is available, the Qwen1.5-MoE per-rank directory (24 layers x 60 experts, 6 source
ranks; its counts are one per token, so the traffic model uses top_k = 1 for it).
Topologies (default): 4x8:288 (DeepSeek's prefill deployment), 8x8:320, 18x8:288 (DeepSeek's
decode deployment: 144 GPUs, 2 slots each). Every run is in-sample (the dumps have one
window). Writes ``results.csv``, ``layers.csv``, ``tables.md`` and plots to ``--out``, plus a
Pareto sweep (balance vs RDMA bytes) of one trace per topology, and prints the wall time.

    python benchmarks/compare_real.py [--out /tmp/eplb-compare-real] [--workers 2]
    python benchmarks/compare_real.py --solvers deepseek,greedy,hierarchical --ilp-limit 0

Measured on 2 shared cores (7 traces x 3 topologies): without ilp, 63 runs in 86 s plus a
19 s sweep (1 min 46 s in all; most of it is the LP lower bound at 2 slots per GPU); with
ilp (``--time-limit 0.25`` s per layer, 58 layers per solve; its 2-slot pairing path runs
past the limit) 84 runs in 529 s plus a 169 s sweep (11 min 40 s in all, with another
benchmark sharing the cores part of the time): ilp dominates. 75 of the 84 runs are ``ok``;
the other 9 are ``hierarchical`` where it does not apply (8 groups on 18 nodes; Qwen has no
expert groups), recorded with that reason in the ``status`` column.

The same comparison from the CLI (without the Qwen top_k note and the single-trace sweep):

    eplb compare ../shared/traces/deepseek-v3-sglang/*.json ../shared/traces/qwen1.5-moe-harmoeny \
        --topologies 4x8:288,8x8:320,18x8:288 --groups 8 --topk-groups 4 --time-limit 0.25 \
        --workers 2 \
        -o results.csv --markdown tables.md --plot plots/
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

from eplb import solvers, traces
from eplb.atomic import atomic_write_text
from eplb.data_dirs import traces_dir
from eplb.errors import EplbError
from eplb.evaluation import plots
from eplb.evaluation.compare import compare, parse_topologies
from eplb.evaluation.pareto import sweep
from eplb.evaluation.tables import markdown, slug, write_csv

SHARED = traces_dir()  # $EPLB_DATA or ../shared/traces


def load_traces(root: Path) -> dict[str, traces.Trace]:
    out = {}
    for path in sorted((root / "deepseek-v3-sglang").glob("*.json")):
        t = traces.read(path)
        meta = {**t.meta, "top_k": 8, "num_groups": 8, "topk_groups": 4}  # DeepSeek-V3 routing
        out[path.stem] = type(t)(t.counts, t.layer_ids, meta=meta)
    qwen = root / "qwen1.5-moe-harmoeny"
    if qwen.is_dir():
        try:
            t = traces.read(qwen)
        except EplbError as exc:
            print(f"skipping {qwen}: {exc}", file=sys.stderr)
        else:
            out["qwen1.5-moe"] = type(t)(t.counts, t.layer_ids, source_counts=t.source_counts,
                                         meta={**t.meta, "top_k": 1})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, default=SHARED)
    ap.add_argument("--out", type=Path, default=Path("/tmp/eplb-compare-real"))
    ap.add_argument("--topologies", default="4x8:288,8x8:320,18x8:288")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--solvers", default=None, help="comma-separated (default: all registered)")
    ap.add_argument("--time-limit", type=float, default=0.25,
                    help="search solvers' time limit (ilp: seconds per layer)")
    ap.add_argument("--pareto-trace", default="prefill_in1024")
    ap.add_argument("--ilp-limit", type=float, default=0.25,
                    help="ilp time limit per layer in the sweep (0: no ilp)")
    ap.add_argument("--ilp-weights", default="0,1", help="rdma_weight values for ilp")
    args = ap.parse_args()
    if not args.traces.is_dir():
        sys.exit(f"real traces not found at {args.traces}")
    args.out.mkdir(parents=True, exist_ok=True)
    named = load_traces(args.traces)
    names = args.solvers.split(",") if args.solvers else solvers.available()
    print(f"{len(named)} traces, solvers {names}, topologies {args.topologies}, "
          f"{args.workers} workers", file=sys.stderr)

    start = time.perf_counter()
    res = compare(named, solvers=names, topologies=args.topologies, time_limit=args.time_limit,
                  workers=args.workers)
    res.write(args.out / "results.csv", args.out / "tables.md", args.out / "layers.csv")
    files = res.plot(args.out / "plots")
    t_compare = time.perf_counter() - start

    start = time.perf_counter()
    frames = []
    if args.pareto_trace in named:
        trace = named[args.pareto_trace]
        for spec in parse_topologies(args.topologies):
            topo = spec.resolve(trace.num_experts)
            df = sweep(trace.load(), topo, num_groups=8, topk_groups=4, top_k=8,
                       ilp_time_limit=args.ilp_limit or None, progress=True,
                       ilp_weights=[float(w) for w in args.ilp_weights.split(",")])
            stem = slug(f"{args.pareto_trace}_{spec.text}")
            files.append(plots.pareto_front(df, args.out / "plots" / f"pareto_{stem}.png",
                                            title=f"{args.pareto_trace} on {spec.text}"))
            frames.append(df.assign(trace=args.pareto_trace, topology=spec.text))
    if frames:
        pareto = pd.concat(frames, ignore_index=True)
        write_csv(pareto, args.out / "pareto.csv")
        cols = ["topology", "label", "rdma_weight", "step_max_over_mean", "rdma_bytes",
                "solve_seconds", "on_front", "status"]
        atomic_write_text(args.out / "pareto.md", markdown(pareto[cols], index=False))
    t_pareto = time.perf_counter() - start

    ok = int((res.summary["status"] == "ok").sum())
    print(res.tables())
    print(f"compare: {ok}/{len(res.summary)} runs ok, {t_compare:.1f} s wall "
          f"({len(files)} files in {args.out})")
    print(f"pareto sweep ({args.pareto_trace}, {len(frames)} topologies): {t_pareto:.1f} s")


if __name__ == "__main__":
    main()
