"""Issue 34, part 2: what the prefill admission rule (``scheduler.prefill_admission``) does to a
Day-6 prefill unit, the default ``rank_queues`` (SGLang's PD prefill: dispatch on arrival to a
DP rank's unbounded FCFS queue) beside the kept ``global_queue`` (the former router-held queue,
ranks capped at ``token_budget`` queued tokens).

- **saturated**: the `deepseek_day6` preset (1 prefill unit EP32 + 1 decode unit EP144)
  offered 1.3x what `steady_state(mix=)` says its prefill unit sustains, for ``--minutes``
  (5), measured over the last two thirds, on two mixes: the docs' Day-6 mix
  (``day6_workload(mix="published")``) and the README's generator (``eplb workload synth
  --hit-rate 0.56 --seed 1``, ~5k-token multi-turn prompts). Per rule: input and computed
  tokens/s per node against `steady_state(mix=)` under the same rule (on the workload's mix,
  cache hits replayed with an unbounded store, and on the simulated requests' own lengths and
  hits), the share of the step token budget the steps use and the share of step time spent
  waiting for the slowest DP rank (``dp_wait``).
- **moderate**: the README's Day-6 example (1,200 requests at 10 req/s, 120 s): TTFT, goodput.

    python scripts/serving_admission.py [--workers 2] [--write-docs | --check]

``--write-docs`` replaces the ``admission`` block of docs/serving.md; ``--check`` recomputes it
and exits 1 when the block differs (the runs are deterministic; wall times are printed, never
written).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import numpy as np
from docblock import update_doc

from eplb import runners
from eplb.evaluation import serving
from eplb.evaluation.serving.results.mix import LengthMix
from eplb.evaluation.serving.workload import day6

DOC = Path(__file__).resolve().parents[1] / "docs" / "serving.md"
RULES = ("rank_queues", "global_queue")
MIXES = ("published", "readme")
OVERLOAD = 1.3  # offered rate over steady_state's sustained prefill rate
STEADY_STEPS = 200  # steady_state(mix=)'s sampled steps (24 by default; the tails need more)


def config(rule: str) -> serving.ClusterConfig:
    cfg = serving.ClusterConfig.deepseek_day6()
    return cfg.replace(scheduler=dataclasses.replace(cfg.scheduler, prefill_admission=rule))


def workload(mix: str, n: int, rate: float) -> serving.Workload:
    """``n`` requests of ``mix`` at ``rate`` req/s."""
    if mix == "published":
        return day6.day6_workload(n, rate, mix="published", seed=0)
    return serving.workload.synthesize(n, rate=rate, hit_rate=0.56, seed=1)  # README's synth


def saturated(task: dict) -> dict:
    """One saturated run (a runner task)."""
    rule, mix, span = task["rule"], task["mix"], task["span"]
    cfg = config(rule)
    probe = workload(mix, 20_000, 100.0)
    st = serving.steady_state(cfg, "prefill", mix=probe, steps=STEADY_STEPS)
    rate = OVERLOAD * st["requests_per_s"]
    wl = workload(mix, int(rate * span) + 100, rate)
    t0 = time.time()
    res = serving.simulate(cfg, wl, seed=0, duration_s=span, progress=False)
    wall = time.time() - t0
    a, b = span / 3, span
    s = res.steps
    p = s[(s["phase"] == "prefill") & (s["start_s"] >= a) & (s["start_s"] < b)]
    unit = cfg.prefill
    G, gpn, budget = unit.num_gpus, unit.gpus_per_node, unit.token_budget
    span_p = float((p["start_s"] + p["duration_s"]).max() - p["start_s"].min())
    r = res.requests
    done = r[(r["prefill_end_s"] >= a) & (r["prefill_end_s"] < b)]
    own = LengthMix(done["input_tokens"].to_numpy(np.int64),
                    done["cached_tokens"].to_numpy(np.int64),
                    done["output_tokens"].to_numpy(np.int64))
    st_own = serving.steady_state(cfg, "prefill", mix=own, steps=STEADY_STEPS)

    def use(x: dict) -> float:  # steady_state's tokens per rank and step over the budget
        return x["tok_s_per_node"] * x["step_s"] / gpn / budget

    return {
        **task,
        "rate": rate,
        "wall_s": wall,
        "input": float(p["input_tokens_done"].sum()) / span_p / unit.nodes,
        "computed": float(p["tokens"].sum()) / span_p / unit.nodes,
        "budget_use": float(p["tokens"].sum()) / (G * budget * len(p)),
        "dp_wait": float(p["dp_wait_s"].sum() / p["duration_s"].sum()),
        "hit": float(done["cached_tokens"].sum() / done["input_tokens"].sum()),
        "st_input": st["input_tok_s_per_node"],
        "st_computed": st["tok_s_per_node"],
        "st_use": use(st),
        "st_dp_wait": st["breakdown"]["dp_wait"] / st["step_s"],
        "st_hit": float(probe.cached_tokens().sum() / probe.requests["input_tokens"].sum()),
        "own_input": st_own["input_tok_s_per_node"],
    }


def moderate(task: dict) -> dict:
    """The README's example at its own rate (a runner task)."""
    wl = serving.workload.synthesize(1200, rate=10.0, hit_rate=0.56, seed=1)
    t0 = time.time()
    res = serving.simulate(config(task["rule"]), wl, seed=0, duration_s=120.0, progress=False)
    s = res.summary()
    p = res.steps[res.steps["phase"] == "prefill"]
    return {
        **task,
        "wall_s": time.time() - t0,
        "ttft_p50": s["ttft_p50_s"],
        "ttft_p90": s["ttft_p90_s"],
        "goodput": s["goodput"],
        "hit": s["kv_hit_rate"],
        "dp_wait": float(p["dp_wait_s"].sum() / p["duration_s"].sum()),
    }


def _pct(x: float) -> str:
    return f"{x:+.1%}"


def table(sat: list[dict], mod: list[dict], minutes: float) -> str:
    names = {"published": "Day-6 `published` mix", "readme": "README's synth (~5k tokens)"}
    lines = [
        "| mix | admission | input tok/s per node: simulated / `steady_state` (error) | "
        "computed tok/s per node: simulated / `steady_state` (error) | error against "
        "`steady_state` on the simulated requests | step budget used: simulated / "
        "`steady_state` | step time waiting for the slowest DP rank: simulated / "
        "`steady_state` | KV hit rate: simulated / mix |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sat:
        lines.append(
            f"| {names[r['mix']]} | `{r['rule']}` | {r['input']:,.0f} / {r['st_input']:,.0f} "
            f"({_pct(r['input'] / r['st_input'] - 1)}) | {r['computed']:,.0f} / "
            f"{r['st_computed']:,.0f} ({_pct(r['computed'] / r['st_computed'] - 1)}) | "
            f"{_pct(r['input'] / r['own_input'] - 1)} | {r['budget_use']:.0%} / "
            f"{r['st_use']:.0%} | {r['dp_wait']:.0%} / {r['st_dp_wait']:.0%} | "
            f"{r['hit']:.3f} / {r['st_hit']:.3f} |"
        )
    lines += [
        "",
        f"Saturated: the `deepseek_day6` preset (1 prefill unit EP32 + 1 decode unit EP144, "
        f"DeepSeek's balancers, `attention` chunks), offered {OVERLOAD:g}x the prefill rate "
        f"`steady_state(mix=)` sustains under the same rule ("
        + ", ".join(f"{r['mix']} / {r['rule']}: {r['rate']:.1f} req/s" for r in sat)
        + f"), {minutes:g} simulated minutes, measured from minute {minutes / 3:.2f} on. "
        "`steady_state` runs balanced expert routing (the simulator a real placement with "
        "per-step routing noise: its EP wait) and replays the mix's cache hits with an "
        "unbounded store (the simulator's turns can arrive before their previous turn has "
        "been prefilled: the hit rate columns); the error column against the simulated "
        "requests takes their own lengths and hits.",
        "",
        "| admission | TTFT p50 / p90 (s) | goodput | KV hit rate | step time waiting for the "
        "slowest DP rank |",
        "|---|---|---|---|---|",
    ]
    for r in mod:
        lines.append(f"| `{r['rule']}` | {r['ttft_p50']:.2f} / {r['ttft_p90']:.2f} | "
                     f"{r['goodput']:.3f} | {r['hit']:.2f} | {r['dp_wait']:.0%} |")
    lines += [
        "",
        "Moderate load: the README's Day-6 example (`eplb workload synth -n 1200 --rate 10 "
        "--hit-rate 0.56 --seed 1`, `eplb simulate deepseek_day6 --duration 120`; TTFT "
        "percentiles over the requests served, the late arrivals still waiting at the end "
        "entering as lower bounds).",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=5.0, help="saturated runs' length")
    ap.add_argument("--workers", type=int, default=1)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write-docs", action="store_true")
    g.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.time()
    sat_tasks = [{"kind": "sat", "mix": m, "rule": r, "span": 60.0 * args.minutes}
                 for m in MIXES for r in RULES]
    mod_tasks = [{"kind": "mod", "rule": r} for r in RULES]
    out = runners.run(_task, sat_tasks + mod_tasks, workers=args.workers)
    sat, mod = out[: len(sat_tasks)], out[len(sat_tasks):]
    text = table(sat, mod, args.minutes)
    print(text)
    for r in out:
        print(f"{r['kind']} {r.get('mix', 'readme')} {r['rule']}: {r['wall_s']:.0f} s wall")
    print(f"(python scripts/serving_admission.py: {(time.time() - t0) / 60:.1f} min wall)")
    if args.write_docs or args.check:
        return update_doc(DOC, {"admission": text}, check=args.check,
                          script="serving_admission.py --write-docs")
    return 0


def _task(task: dict) -> dict:
    return saturated(task) if task["kind"] == "sat" else moderate(task)


if __name__ == "__main__":
    raise SystemExit(main())
