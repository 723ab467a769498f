"""Serving-simulator targets (issue 11): DeepSeek's Day-6 figures, the EP balancer's worth end
to end, and SGLang's default-vs-perfect placement pair. Nothing here is fitted: the step-time
constants are the ones fitted on SGLang's H100 run (docs/serving-calibration.md).

    python scripts/simulate_day6.py calibrate   # Day-6: simulated vs published, with the error
    python scripts/simulate_day6.py worth       # static / deepseek / greedy / oracle, seeds
    python scripts/simulate_day6.py sglang      # 50,302 -> 59,337 (default vs perfect, EP32 4K)
    python scripts/simulate_day6.py all --write-docs --workers 2
    python scripts/simulate_day6.py fit-workload   # refit evaluation.serving.workload.day6.MIXES

``--write-docs`` replaces the generated blocks of docs/serving.md. Each section prints its
wall time; ``--quick`` shortens every run (for trying the script, not for the docs).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
from docblock import update_doc

from eplb.evaluation import serving
from eplb.evaluation.serving import workload as W
from eplb.evaluation.serving.config import EplbConfig, RoutingConfig, UnitConfig
from eplb.evaluation.serving.workload import day6

DOC = Path(__file__).resolve().parents[1] / "docs" / "serving.md"
# section -> its block in DOC (`<!-- KEY:begin -->` ... `<!-- KEY:end -->`)
BLOCKS = {"calibrate": "sim-day6", "worth": "sim-worth", "sglang": "sim-sglang"}
DRIFT = 0.003  # expected share of a layer's experts changing popularity per minute (assumed)


def _units(cfg, prefill=None, decode=None, **unit_changes):
    pu, du = dict(cfg.prefill.__dict__), dict(cfg.decode.__dict__)
    if prefill is not None:
        pu["count"] = prefill
    if decode is not None:
        du["count"] = decode
    for key, value in unit_changes.items():
        phase, name = key.split("__")
        (pu if phase == "prefill" else du)[name] = value
    return cfg.replace(prefill=UnitConfig(**pu), decode=UnitConfig(**du))


def _mean_lengths(mix: str) -> dict:
    return day6.mix_stats(day6.day6_workload(20_000, 100.0, mix=mix, seed=0))


def _fmt(x, digits=0):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:,.{digits}f}"


def _err(sim, pub):
    return f"{sim / pub - 1:+.1%}"


# ------------------------------------------------------------------ Day-6 calibration
def calibrate(minutes: float, workers: int) -> str:
    cfg = serving.ClusterConfig.deepseek_day6()
    stats = _mean_lengths("published")
    # (a) prefill capacity: one prefill unit offered 1.3x what steady_state says it sustains
    wl_probe = day6.day6_workload(20_000, 100.0, mix="published", seed=0)
    cached = wl_probe.cached_tokens()
    new = wl_probe.requests["input_tokens"].to_numpy() - cached
    ss = serving.steady_state(
        cfg, "prefill", input_tokens=int(new.mean()), kv_tokens=int(cached.mean())
    )
    cap = ss["input_tok_s_per_node"] * cfg.prefill.nodes / stats["input_mean"]
    span = 60.0 * minutes
    p_rate = 1.3 * cap
    wl = day6.day6_workload(int(p_rate * span) + 100, p_rate, mix="published", seed=0)
    # only the prefill steps before span are read: no drain (since --duration drains, an
    # overloaded unit would run up to another 15 simulated minutes for nothing)
    res = serving.simulate(cfg, wl, seed=0, duration_s=span, drain_s=0.0, progress=True)
    pre = res.summary(window=(span / 3, span))
    # (b) decode at 20-22 tok/s per request: five prefill units (more than enough) feed one
    # decode unit; sweep the rate, interpolate the throughput where a request gets 21 tok/s
    cfg_d = _units(cfg, prefill=5)
    rows = []
    for rate in (230.0, 260.0, 290.0, 320.0):
        wl = day6.day6_workload(int(rate * span) + 100, rate, mix="published", seed=1)
        r = serving.simulate(cfg_d, wl, seed=1, duration_s=span, progress=True)
        s = r.summary(window=(0.4 * span, span))
        dec = r.steps[(r.steps["phase"] == "decode") & (r.steps["start_s"] >= 0.4 * span)]
        # context per running request and step (every running request emits alike)
        kv = float(dec["kv_tokens"].sum() / dec["requests"].sum()) if len(dec) else math.nan
        rows.append(
            {
                "rate": rate,
                "tok_s_per_request": s["output_tok_s_per_request"],
                "out_per_node": s["output_tok_s_per_node"],
                "running_per_gpu": s["decode_running_per_gpu"],
                "tpot_p50_s": s["tpot_p50_s"],
                "kv_hit_rate": s["kv_hit_rate"],
                "kv_per_output": kv,
            }
        )
    sweep = pd.DataFrame(rows)
    order = np.argsort(sweep["tok_s_per_request"].to_numpy())
    x = sweep["tok_s_per_request"].to_numpy()[order]
    y = sweep["out_per_node"].to_numpy()[order]
    at = {v: float(np.interp(v, x, y)) if x[0] <= v <= x[-1] else math.nan for v in (20, 21, 22)}
    hit = float(sweep["kv_hit_rate"].mean())
    kvlen = float(sweep["kv_per_output"].mean())
    pub = day6.DAY6
    lines = [
        "| quantity | published (Day 6) | simulated | error | how the simulator measured it |",
        "|---|---|---|---|---|",
        f"| prefill input tok/s per node (cache hits included) | 73,700 | "
        f"{_fmt(pre['input_tok_s_per_node'])} | {_err(pre['input_tok_s_per_node'], 73_700)} | "
        f"capacity: 1 prefill unit (EP32) offered {p_rate:.0f} req/s (1.3x its steady-state "
        f"capacity), minutes {span / 180:.0f}-{span / 60:.0f} of {span / 60:.0f} |",
        f"| decode output tok/s per node at 21 tok/s per request | 14,800 | {_fmt(at[21])} | "
        f"{_err(at[21], 14_800) if math.isfinite(at[21]) else '-'} | rate sweep on 5 prefill "
        "+ 1 decode unit (EP144), interpolated where the mean request speed is 21 tok/s |",
        f"| ... at 20 / 22 tok/s per request | (20-22 tok/s) | {_fmt(at[20])} / {_fmt(at[22])} "
        "| | same sweep |",
        f"| KV-cache hit rate | 56.3% | {hit:.1%} | {hit - pub['hit_rate']:+.1%} points | "
        "cached / input tokens of the routed requests (store lookups at routing time: a "
        "turn misses what its previous turn has not finished writing) |",
        f"| KV length per output token | 4,989 | {_fmt(kvlen)} | {_err(kvlen, 4989)} | "
        "context per running request over the decode steps of the sweep (the workload is "
        "fitted to 4,989 over whole requests) |",
    ]
    sweep_lines = [
        "",
        "| offered req/s | tok/s per request | output tok/s per node | running requests per "
        "GPU | TPOT p50 (ms) |",
        "|---|---|---|---|---|",
    ] + [
        f"| {r.rate:.0f} | {r.tok_s_per_request:.1f} | {_fmt(r.out_per_node)} | "
        f"{r.running_per_gpu:.1f} | {r.tpot_p50_s * 1e3:.1f} |"
        for r in sweep.itertuples()
    ]
    note = (
        f"\nSteady state without queueing (`steady_state`, balanced routing, uniform batches): "
        f"prefill {_fmt(ss['input_tok_s_per_node'])} input tok/s per node at this mix; the "
        "simulated capacity is below it by the DP imbalance of real prompt lengths, the EP "
        "imbalance of a real placement under per-step routing noise, and store loads."
    )
    return "\n".join(lines + sweep_lines) + "\n" + note


# ------------------------------------------------------------------ the EP balancer's worth
def worth(minutes: float, seeds: list[int], workers: int) -> str:
    base = serving.ClusterConfig.deepseek_day6()
    stats = _mean_lengths("balanced_units")
    rate = (
        0.9 * day6.DAY6["prefill_input_tok_s_per_node"] * base.prefill.nodes / stats["input_mean"]
    )
    span = 60.0 * minutes
    interval = 600.0
    wl = day6.day6_workload(int(rate * span) + 100, rate, mix="balanced_units", seed=7)
    out = []
    for title, drift, policies, run_seeds in (
        (
            "stationary popularity",
            0.0,
            (
                ("no EPLB (trivial, static)", "static", "trivial"),
                ("deepseek", "deepseek", "history"),
                ("greedy", "greedy", "history"),
                ("balanced (perfect)", "balanced", "trivial"),
            ),
            seeds[:1],
        ),
        (
            f"drifting popularity ({DRIFT:g} of the experts per minute)",
            DRIFT,
            (
                ("static (from the 10 min before)", "static", "history"),
                ("deepseek", "deepseek", "history"),
                ("greedy", "greedy", "history"),
                ("oracle (next 10 min known)", "oracle", "history"),
            ),
            seeds,
        ),
    ):
        cfgs = {
            name: base.replace(
                eplb=EplbConfig(
                    solver=solver, initial=init, rebalance_interval_s=interval, history_s=interval
                ),
                routing=RoutingConfig(drift=drift),
                name=name,
            )
            for name, solver, init in policies
        }
        frame = serving.compare(
            cfgs, wl, run_seeds, duration_s=span, window=(interval, span), workers=workers
        )
        metrics = [
            "ttft_p50_s",
            "ttft_p90_s",
            "tpot_p50_s",
            "tpot_p90_s",
            "input_tok_s_per_node",
            "output_tok_s_per_node",
            "decode_gpu_load_max_over_mean",
            "prefill_gpu_load_max_over_mean",
        ]
        g = frame.groupby("config", sort=False)
        mean, std = g[metrics].mean(), g[metrics].std(ddof=1)
        rel = g[["r_tpot_p50_s", "r_ttft_p50_s", "r_output_tok_s_per_node"]].mean()
        base_name = next(iter(cfgs))
        lines = [
            f"**{title}**, {len(run_seeds)} seed(s) ({', '.join(map(str, run_seeds))}); "
            f"deltas paired against *{base_name}* at the same seed:",
            "",
            "| policy | TTFT p50 / p90 (s) | TPOT p50 / p90 (ms) | input tok/s/node | "
            "output tok/s/node | max/mean GPU load, prefill / decode | TPOT p50 vs base | "
            "TTFT p50 vs base | output tok/s vs base |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for name in cfgs:
            m, s = mean.loc[name], std.loc[name]
            pm = "" if len(run_seeds) < 2 else f" ± {s['tpot_p50_s'] * 1e3:.1f}"
            lines.append(
                f"| {name} | {m['ttft_p50_s']:.2f} / {m['ttft_p90_s']:.2f} | "
                f"{m['tpot_p50_s'] * 1e3:.1f}{pm} / {m['tpot_p90_s'] * 1e3:.1f} | "
                f"{_fmt(m['input_tok_s_per_node'])} | {_fmt(m['output_tok_s_per_node'])} | "
                f"{m['prefill_gpu_load_max_over_mean']:.3f} / "
                f"{m['decode_gpu_load_max_over_mean']:.3f} | "
                f"{rel.loc[name, 'r_tpot_p50_s']:+.1%} | {rel.loc[name, 'r_ttft_p50_s']:+.1%} | "
                f"{rel.loc[name, 'r_output_tok_s_per_node']:+.1%} |"
            )
        out.append("\n".join(lines))
    head = (
        f"Day-6 preset (1 prefill unit EP32 + 1 decode unit EP144, H800, DeepSeek's DP "
        f"balancers), `balanced_units` traffic at 90% of Day-6 per-node load ({rate:.0f} "
        f"req/s), {minutes:g} simulated minutes, rebalancing every 10 minutes from the last "
        f"10 (overlapped copy at 50 GB/s per GPU), measured over minutes 10-{minutes:g}; "
        "popularity windows of 60 s; placements start from the 10 minutes before the run "
        "(`initial = history`) except *no EPLB*."
    )
    return head + "\n\n" + "\n\n".join(out)


# ------------------------------------------------------------------ SGLang's pair
def sglang(minutes: float) -> str:
    cfg = serving.ClusterConfig.sglang_96xh100()
    span = 60.0 * minutes
    ss = serving.steady_state(cfg, "prefill", input_tokens=4096)
    cap = ss["input_tok_s_per_node"] * cfg.prefill.nodes / 4096
    rate = 1.3 * cap
    n = int(rate * span) + 50
    wl = W.synthesize(
        n, rate=rate, input_mean=4096, input_sigma=0.0, output_mean=1, output_sigma=0.0, seed=0
    )
    rows = []
    for name, solver, init in (
        ("default placement (trivial)", "static", "trivial"),
        ("EPLB (deepseek, from the 10 min before)", "static", "history"),
        ("simulated perfect EPLB (balanced routing)", "balanced", "trivial"),
    ):
        c = cfg.replace(eplb=EplbConfig(solver=solver, initial=init))
        res = serving.simulate(c, wl, seed=0, duration_s=span, progress=True)
        s = res.summary(window=(span / 5, span))
        rows.append(
            (
                name,
                s["input_tok_s_per_node"],
                s["prefill_gpu_load_max_over_mean"],
                res.steps["ep_wait_s"].mean(),
            )
        )
    default, perfect = rows[0][1], rows[-1][1]
    pub = {
        "default placement (trivial)": 50_302,
        "simulated perfect EPLB (balanced routing)": 59_337,
    }
    lines = [
        "| placement | SGLang input tok/s per node | simulated | error | max/mean GPU load "
        "(routed picks) | EP wait per step (ms) |",
        "|---|---|---|---|---|---|",
    ]
    for name, value, bal, epw in rows:
        p = pub.get(name)
        lines.append(
            f"| {name} | {_fmt(p) if p else '-'} | {_fmt(value)} | "
            f"{_err(value, p) if p else '-'} | {bal:.3f} | {epw * 1e3:.1f} |"
        )
    lines.append(
        f"| ratio perfect / default | {59_337 / 50_302:.3f} | {perfect / default:.3f} | | | |"
    )
    lines.append(
        f'| ratio EPLB / default (SGLang\'s "EPLB speedup, prefill") | 1.49 | '
        f"{rows[1][1] / default:.3f} | | | |"
    )
    head = (
        f"`sglang_96xh100` prefill unit (4 nodes, EP32, H100, 16,384 tokens per rank), "
        f"4,096-token prompts without cache hits and one output token (a prefill "
        f"benchmark), offered {rate:.0f} req/s (1.3x the steady-state capacity), "
        f"{minutes:g} simulated minutes, measured after the first fifth. Calibrated "
        "DeepSeek-V3 prefill routing with per-step noise. The perfect-EPLB figure is the "
        f"point the step-time constants were fitted to ({_fmt(ss['input_tok_s_per_node'])} "
        "in steady state), so its "
        "error is not a prediction; the default-placement figure and the ratio are."
    )
    return head + "\n\n" + "\n".join(lines)


# ------------------------------------------------------------------ docs
def write_docs(parts: dict[str, str]) -> None:
    """Put each section's body (``parts``, keys of `BLOCKS`) into its block of `DOC`."""
    update_doc(DOC, {BLOCKS[k]: body for k, body in parts.items()}, check=False,
               script="simulate_day6.py all --write-docs")
    print(f"wrote {DOC}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("calibrate", "worth", "sglang", "all", "fit-workload"))
    ap.add_argument("--seeds", type=int, default=3, help="seeds of the worth table (default 3)")
    ap.add_argument("--workers", type=int, default=1, help="processes for the worth runs")
    ap.add_argument("--quick", action="store_true", help="short runs (not for the docs)")
    ap.add_argument("--write-docs", action="store_true", help="update docs/serving.md")
    args = ap.parse_args()
    if args.what == "fit-workload":
        for name, io, via, spt in (
            ("published", day6.DAY6["io_ratio"], "sessions", 1024),
            ("balanced_units", 73.7 * 4 / (14.8 * 18), "system_prompts", 1536),
        ):
            print(name, day6.fit_mix(io, via=via, system_prompt_tokens=spt))
        return
    q = 0.2 if args.quick else 1.0
    parts = {}
    todo = ("calibrate", "worth", "sglang") if args.what == "all" else (args.what,)
    for what in todo:
        start = time.perf_counter()
        if what == "calibrate":
            body = calibrate(15 * q, args.workers)
        elif what == "worth":
            body = worth(30 * q if not args.quick else 12, list(range(args.seeds)), args.workers)
        else:
            body = sglang(5 * q)
        wall = time.perf_counter() - start
        body += f"\n\n(`python scripts/simulate_day6.py {what}`: {wall / 60:.1f} min wall.)"
        parts[what] = body
        print(f"\n### {what}\n\n{body}\n")
    if args.write_docs:
        if args.quick:
            raise SystemExit("--quick results are not for the docs; rerun without --quick")
        write_docs(parts)


if __name__ == "__main__":
    main()
