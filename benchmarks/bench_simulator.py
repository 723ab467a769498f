"""Benchmark: the serving simulator's speed (simulated seconds per wall second, events/s).

1. **Headline** (issue 11 target: one simulated hour in <= 60 s wall on 2 cores): the Day-6
   preset (one prefill unit EP32 + one decode unit EP144 on H800, DeepSeek's DP balancers,
   `deepseek` EPLB every 10 minutes, one MTP draft) under Day-6-like traffic at Day-6 per-node
   load on *both* units: the ``balanced_units`` mix of `evaluation.serving.workload.day6`
   (56.3% prefix hits, 4,989 KV tokens per output token, input / output = 1.107) at
   73,700 x 4 / mean input req/s. Reports wall seconds, simulated / wall, events/s, steps,
   requests, the per-node throughput reached, and where the wall time went (DP balancers,
   the step-time model, the per-step expert-count draws, the rest).
2. The same hour with ``round_robin`` DP balancers (the policies' own cost, compared).
3. **Baseline in the same process**: a few simulated minutes of (1) with every step timed by
   `StepModel.time(batch, placement, counts)` (no prepared routing, exact expert curve) instead
   of the hot path (`StepModel.time_routed`): the ratio is the hot path's speed-up.
4. **Growth** with load and units (a few simulated minutes each): 25 / 50 / 100% of (1)'s rate
   on one prefill + one decode unit; two of each at twice the rate; 3 prefill + 1 decode units
   with the ``published`` Day-6 mix at Day-6 decode load.

    python benchmarks/bench_simulator.py [--hours 1] [--minutes 5] [--skip-hour]

Wall times are of this machine while it ran (2 cores shared with other jobs: read ratios, and
expect +-30% between runs); the headline also prints the process's CPU seconds, which a busy
machine inflates less than wall time. To compare two commits, run
``benchmarks/sim_cpu_seconds.py ROOT SECONDS`` with each commit's checkout (and its own
editable install) alternately.
"""

from __future__ import annotations

import argparse
import functools
import time

from eplb.evaluation import serving
from eplb.evaluation.serving import balancers
from eplb.evaluation.serving.config import UnitConfig
from eplb.evaluation.serving.simulator import expert_loads, units
from eplb.evaluation.serving.steptime import StepModel
from eplb.evaluation.serving.workload import day6


def _config(prefill_units=1, decode_units=1, balancer=None) -> serving.ClusterConfig:
    cfg = serving.ClusterConfig.deepseek_day6()
    pu, du = dict(cfg.prefill.__dict__), dict(cfg.decode.__dict__)
    pu["count"], du["count"] = prefill_units, decode_units
    if balancer:
        pu["balancer"] = du["balancer"] = balancer
    return cfg.replace(prefill=UnitConfig(**pu), decode=UnitConfig(**du))


class Timers:
    """Wall seconds spent in wrapped functions (installed for one run)."""

    def __init__(self):
        self.acc: dict[str, float] = {}
        self._undo = []

    def wrap(self, owner, name: str, key: str) -> None:
        fn = getattr(owner, name)
        acc = self.acc

        @functools.wraps(fn)
        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                acc[key] = acc.get(key, 0.0) + time.perf_counter() - t

        setattr(owner, name, timed)
        self._undo.append((owner, name, fn))

    def __enter__(self):
        self.wrap(balancers, "assign", "DP balancers")
        self.wrap(StepModel, "time_routed", "step-time model")
        self.wrap(StepModel, "time", "step-time model")
        self.wrap(expert_loads.StepLoads, "draw", "expert-count draws")
        return self

    def __exit__(self, *exc):
        for owner, name, fn in reversed(self._undo):
            setattr(owner, name, fn)


def run(cfg, rate: float, seconds: float, mix: str, *, timers: bool = False) -> dict:
    wl = day6.day6_workload(int(rate * seconds * 1.02) + 50, rate, mix=mix, seed=0)
    t = Timers() if timers else None
    if t:
        t.__enter__()
    try:
        start, cpu0 = time.perf_counter(), time.process_time()
        res = serving.simulate(cfg, wl, seed=0, duration_s=seconds, progress=False)
        wall = time.perf_counter() - start
        cpu = time.process_time() - cpu0
    finally:
        if t:
            t.__exit__(None, None, None)
    s = res.summary(window=(seconds / 3, seconds))
    steps = res.steps["phase"].value_counts().to_dict()
    out = {
        "wall_s": wall,
        "cpu_s": cpu,
        "sim_per_wall": seconds / wall,
        "events": res.meta["events"],
        "events_per_s": res.meta["events"] / wall,
        "prefill_steps": steps.get("prefill", 0),
        "decode_steps": steps.get("decode", 0),
        "requests": len(res.requests),
        "input_tok_s_per_node": s["input_tok_s_per_node"],
        "output_tok_s_per_node": s["output_tok_s_per_node"],
        "decode_running_per_gpu": s["decode_running_per_gpu"],
        "ttft_p50_s": s["ttft_p50_s"],
        "tpot_p50_s": s["tpot_p50_s"],
    }
    if t:
        out["split"] = dict(t.acc)
    return out


def slow_step_time(self, batch, t, tokens):
    """`units.Unit.step_time` without the hot path (baseline)."""
    if self.placement is None:
        return self.sm.time(batch)
    counts = self.loads.draw(t, self.picks_per_token * tokens)
    if self.recorder is not None:
        self.recorder.add(t, counts)
    return self.sm.time(batch, self.placement, counts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hours", type=float, default=1.0, help="headline span (default 1 hour)")
    ap.add_argument("--minutes", type=float, default=5.0, help="span of the other runs")
    ap.add_argument("--skip-hour", action="store_true", help="skip sections 1 and 2")
    args = ap.parse_args()
    mean_in = day6.mix_stats(day6.day6_workload(20_000, 100.0, mix="balanced_units"))["input_mean"]
    rate = day6.DAY6["prefill_input_tok_s_per_node"] * 4 / mean_in
    hour = args.hours * 3600
    short = args.minutes * 60
    print(
        f"Day-6 per-node load on 1 prefill + 1 decode unit: {rate:.1f} req/s "
        f"(balanced_units mix, mean input {mean_in:,.0f} tokens)\n"
    )
    if not args.skip_hour:
        for name, bal in (
            ("Day-6 preset (deepseek DP balancers)", None),
            ("round_robin DP balancers", "round_robin"),
        ):
            r = run(_config(balancer=bal), rate, hour, "balanced_units", timers=True)
            split = r.pop("split")
            rest = r["wall_s"] - sum(split.values())
            print(f"== {name}: {hour / 3600:g} simulated hour(s)")
            print(
                f"   wall {r['wall_s']:.1f} s (CPU {r['cpu_s']:.1f} s), "
                f"simulated/wall {r['sim_per_wall']:.1f}, "
                f"{r['events']:,} events ({r['events_per_s']:,.0f} events/s), "
                f"{r['prefill_steps']:,} prefill + {r['decode_steps']:,} decode steps, "
                f"{r['requests']:,} requests"
            )
            print(
                f"   reached: {r['input_tok_s_per_node']:,.0f} input tok/s/node (prefill), "
                f"{r['output_tok_s_per_node']:,.0f} output tok/s/node (decode), "
                f"{r['decode_running_per_gpu']:.1f} running requests/GPU, "
                f"TTFT p50 {r['ttft_p50_s']:.2f} s, TPOT p50 {r['tpot_p50_s'] * 1e3:.1f} ms "
                "(last two thirds)"
            )
            parts = ", ".join(f"{k} {v:.1f} s" for k, v in split.items())
            print(f"   wall split: {parts}, the rest (events, queues, KV, records) {rest:.1f} s\n")

    cfg = _config()
    fast = run(cfg, rate, short, "balanced_units")
    original = units.Unit.step_time
    units.Unit.step_time = slow_step_time
    try:
        slow = run(cfg, rate, short, "balanced_units")
    finally:
        units.Unit.step_time = original
    print(f"== baseline, {args.minutes:g} simulated minutes of the headline run")
    print(f"   hot path (prepared routing, tabulated curve): wall {fast['wall_s']:.1f} s")
    print(f"   StepModel.time per step:                       wall {slow['wall_s']:.1f} s")
    print(
        f"   ratio {slow['wall_s'] / fast['wall_s']:.2f}x "
        f"(TPOT p50 {fast['tpot_p50_s'] * 1e3:.2f} vs {slow['tpot_p50_s'] * 1e3:.2f} ms)\n"
    )

    print(f"== growth, {args.minutes:g} simulated minutes each")
    header = (
        "setting",
        "req/s",
        "wall s",
        "sim/wall",
        "events/s",
        "steps",
        "requests",
        "ms/decode step",
    )
    print("   " + " | ".join(header))
    cases = [
        ("1P+1D, 25% load", _config(), 0.25 * rate, "balanced_units"),
        ("1P+1D, 50% load", _config(), 0.5 * rate, "balanced_units"),
        ("1P+1D, 100% load", _config(), rate, "balanced_units"),
        ("2P+2D, 100% load", _config(2, 2), 2 * rate, "balanced_units"),
    ]
    pub = day6.mix_stats(day6.day6_workload(20_000, 100.0, mix="published"))["output_mean"]
    d_rate = day6.DAY6["decode_output_tok_s_per_node"] * 18 / pub
    cases.append(("3P+1D, published mix", _config(3, 1), d_rate, "published"))
    for label, c, rr, mix in cases:
        r = run(c, rr, short, mix)
        steps = r["prefill_steps"] + r["decode_steps"]
        print(
            f"   {label} | {rr:.1f} | {r['wall_s']:.1f} | {r['sim_per_wall']:.1f} | "
            f"{r['events_per_s']:,.0f} | {steps:,} | {r['requests']:,} | "
            f"{r['wall_s'] / max(r['decode_steps'], 1) * 1e3:.2f}"
        )


if __name__ == "__main__":
    main()
