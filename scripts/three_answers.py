"""Three answers to "is EPLB worth it here?" on one workload, and why they differ: `advise`
(the step model at an operating point), a closed-loop `simulate` comparison and a counterfactual
replay; writes the block "three_answers" in docs/advise.md.

Workload: the Azure code trace (../shared/requests/azure_code_2023.csv, or $EPLB_REQUESTS), its
first `HEAD` requests rescaled to `RATE` req/s, on the `deepseek_day6` preset. Policies: the
trivial placement that never moves (``eplb.solver=static, eplb.initial=trivial``) against the
preset's `deepseek` EPLB (placed from the routing's history at the start). `SEEDS` paired seeds.
`advise` scores the decode unit (18 x 8 H800, 288 slots) on the routing the simulator draws
its expert counts from (the decode phase's expected shares over the run), once at its default
operating point and once at the one the closed-loop run measured (``--from-summary``).
Run: ``python scripts/three_answers.py [--check]`` (a few minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
from docblock import update_doc

from eplb.data_dirs import requests_dir
from eplb.evaluation import serving
from eplb.evaluation.serving.advise import advise
from eplb.evaluation.serving.config import ClusterConfig, EplbConfig
from eplb.evaluation.serving.intervals import ci_table
from eplb.evaluation.serving.operating_point import describe, measured
from eplb.evaluation.serving.simulator.expert_loads import Popularity
from eplb.evaluation.serving.workload import readers
from eplb.evaluation.serving.workload.synth import rescale

ROOT = Path(__file__).resolve().parent.parent
REQUESTS = requests_dir()
TRACE = REQUESTS / "azure_code_2023.csv"
DOC = ROOT / "docs" / "advise.md"
HEAD, RATE, SEEDS = 2400, 40.0, (0, 1)
METRICS = ("decode_step_s", "prefill_step_s", "ttft_p50_s", "tpot_p50_s",
           "output_tok_s_per_node", "input_tok_s_per_node")


def _configs() -> dict[str, ClusterConfig]:
    base = ClusterConfig.deepseek_day6()
    return {
        "trivial": base.replace(eplb=EplbConfig(solver="static", initial="trivial"),
                                name="trivial"),
        "eplb": base.replace(name="eplb"),  # the preset's deepseek EPLB, placed from history
    }


def _workload():
    wl = readers.read(TRACE).head(HEAD)
    return rescale(wl, rate=RATE)


def _pct(d_mean: float, base: float) -> str:
    return f"{100 * d_mean / base:+.1f}%" if base else "-"


def _rows(frame, label: str) -> tuple[list[str], dict]:
    """Table rows of a compared ``frame`` (EPLB vs trivial, paired over the seeds)."""
    cols = [m for m in METRICS if m in frame]
    t = ci_table(frame, cols, "trivial")
    out, rel = [], {}
    for m in cols:
        b = float(t.loc["trivial", (m, "mean")])
        r = t.loc["eplb", m]
        rel[m] = float(r["d_mean"]) / b if b else float("nan")
        rel[m + "_ci"] = f"{_pct(float(r['d_lo']), b)} to {_pct(float(r['d_hi']), b)}"
        out.append(f"| {label} | {m} | {b:.4g} | {float(r['mean']):.4g} | "
                   f"{_pct(float(r['d_mean']), b)} [{_pct(float(r['d_lo']), b)}, "
                   f"{_pct(float(r['d_hi']), b)}] |")
    return out, rel


def table() -> str:
    named, wl = _configs(), _workload()
    closed = serving.compare(named, wl, list(SEEDS), mode="closed_loop", progress=False)
    counter = serving.compare(named, wl, list(SEEDS), mode="counterfactual", progress=False)
    base = named["trivial"]
    run = serving.simulate(base, wl, seed=SEEDS[0], progress=False)
    ops = measured(run.steps, run.requests, base)
    end = float(run.meta["end_s"])
    load = Popularity(base.routing, base.model_spec, "decode", SEEDS[0]).mean(0.0, end)
    pre_load = Popularity(base.routing, base.model_spec, "prefill", SEEDS[0]).mean(0.0, end)
    with tempfile.TemporaryDirectory() as tmp:
        run.save(Path(tmp), base, plots=False)
        kw = dict(phase="decode", hardware="h800", levers=["today", "rebalance", "bound"])
        at_default = advise(load, "18x8", 288, **kw)
        at_run = advise(load, "18x8", 288, from_summary=tmp, **kw)
        pre_run = advise(pre_load, "4x8", base.prefill.slots_per_layer, phase="prefill",
                         hardware="h800", levers=["today", "rebalance", "bound"],
                         from_summary=tmp)
    rows = [
        "| tool | metric | trivial | EPLB | EPLB vs trivial [95% CI] |",
        "|---|---|---|---|---|",
    ]
    r_closed, rel_closed = _rows(closed, "closed-loop simulate")
    r_counter, rel_counter = _rows(counter, "counterfactual")
    rows += r_closed + r_counter
    adv = {}
    for name, a in (("advise, default point", at_default), ("advise, measured point", at_run)):
        t = a.table.set_index("lever")
        adv[name] = t
        s0, s1 = float(t.loc["today", "step_ms"]), float(t.loc["rebalance", "step_ms"])
        k0, k1 = float(t.loc["today", "tok_s_per_node"]), float(t.loc["rebalance",
                                                                     "tok_s_per_node"])
        rows.append(f"| {name} | decode step (ms) | {s0:.4g} | {s1:.4g} | "
                    f"{_pct(s1 - s0, s0)} (modelled, no interval) |")
        rows.append(f"| {name} | decode tok/s/node | {k0:.4g} | {k1:.4g} | "
                    f"{_pct(k1 - k0, k0)} (modelled) |")
    tp = pre_run.table.set_index("lever")
    p0, p1 = float(tp.loc["today", "step_ms"]), float(tp.loc["rebalance", "step_ms"])
    rows.append(f"| advise, measured point | prefill step (ms) | {p0:.4g} | {p1:.4g} | "
                f"{_pct(p1 - p0, p0)} (modelled, no interval) |")
    d_op, p_op = ops.get("decode", {}), ops.get("prefill", {})
    da, dr = at_default.meta["operating_point"], at_run.meta["operating_point"]
    step_adv = (adv["advise, measured point"].loc["rebalance", "step_ms"]
                / adv["advise, measured point"].loc["today", "step_ms"] - 1)
    lines = [
        *rows,
        "",
        f"Workload: the first {HEAD:,} requests of the Azure code trace rescaled to {RATE:g} "
        f"req/s (prompts {np.mean(wl.requests['input_tokens']):,.0f} tokens, outputs "
        f"{np.mean(wl.requests['output_tokens']):,.1f} tokens on average), `deepseek_day6`, "
        f"seeds {', '.join(map(str, SEEDS))} paired. Operating point of the closed-loop "
        "trivial run (`operating_point.measured`; the counterfactual replays its batches):",
        "",
        *(f"- {describe(op)}" for op in (p_op, d_op) if op),
        f"- advise's default operating point: {da['ran']:,} running requests per rank at "
        f"{da['context_tokens']:,} tokens; with `--from-summary` it takes the run's: "
        f"{dr['ran']:,} per rank (the run's {d_op.get('per_rank', float('nan')):.2f}, in whole "
        f"requests) at {dr['context_tokens']:,} tokens.",
        "",
        "Why the numbers differ:",
        "",
        f"- **advise at its default point vs the run's point.** At {da['ran']:,} requests per "
        f"rank the decode step is {adv['advise, default point'].loc['today', 'step_ms']:.1f} ms "
        f"trivial and EPLB gains {adv['advise, default point'].loc['rebalance', 'gain_pct']:+.1f}% "
        f"tokens/s; at the run's {dr['ran']:,} per rank the step is "
        f"{adv['advise, measured point'].loc['today', 'step_ms']:.1f} ms and the gain "
        f"{adv['advise, measured point'].loc['rebalance', 'gain_pct']:+.1f}%: with few "
        "tokens per GPU the step is fixed costs (weights, small kernels, latency floors) that "
        "balancing does not touch, so the same placement is worth less.",
        f"- **advise's gain is tokens/s at a saturated unit; the simulations' is not.** In the "
        f"closed loop the decode unit is bound by {d_op.get('bound', '-')}, so its output "
        "tokens/s is the arrivals' and moves only by how soon the run drains at its end "
        f"({100 * rel_closed.get('output_tok_s_per_node', 0):+.1f}%, 95% CI "
        f"{rel_closed.get('output_tok_s_per_node_ci', '-')}), and the step-time gain shows up "
        "as latency instead: decode step "
        f"{100 * rel_closed.get('decode_step_s', 0):+.1f}%, TPOT "
        f"{100 * rel_closed.get('tpot_p50_s', 0):+.1f}%, TTFT "
        f"{100 * rel_closed.get('ttft_p50_s', 0):+.1f}% (prefill step "
        f"{100 * rel_closed.get('prefill_step_s', 0):+.1f}%).",
        f"- **counterfactual vs closed loop.** The counterfactual keeps the trivial run's "
        f"batches and re-times them: decode step {100 * rel_counter.get('decode_step_s', 0):+.1f}%"
        f" against advise's {100 * step_adv:+.1f}% at the same point (advise scores the "
        "expected load; the replay draws every step's counts), TPOT "
        f"{100 * rel_counter.get('tpot_p50_s', 0):+.1f}%, TTFT "
        f"{100 * rel_counter.get('ttft_p50_s', 0):+.1f}%; prefill step "
        f"{100 * rel_counter.get('prefill_step_s', 0):+.1f}% against advise's "
        f"{100 * (p1 / p0 - 1):+.1f}% at the run's prefill point (advise runs every rank at "
        "the mean batch and in-sample placements; the replay's steps also wait for their "
        "slowest DP rank, the same wait under both policies, which dilutes the relative "
        "gain). In the closed loop the queues react "
        "(shorter prefill steps drain the queue sooner, so batches change), which is what "
        "separates its TTFT change from the replay's; tok/s stays the arrivals' in both.",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if docs/advise.md is stale")
    args = ap.parse_args(argv)
    if not TRACE.is_file():
        print(f"needs the Azure trace at {TRACE}", file=sys.stderr)
        return 2
    body = table()
    print(body)
    return update_doc(DOC, {"three_answers": body}, check=args.check,
                      script="three_answers.py")


if __name__ == "__main__":
    sys.exit(main())
