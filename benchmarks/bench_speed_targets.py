"""Issue 36's speed targets, each measured against its baseline in the same process, with the
ratio printed and the target said met or missed.

- ``fleet`` (target 1): the Day-6 preset scaled to 24 prefill + 7 decode units under the
  ``published`` Day-6 mix at Day-6's per-node prefill load (73.7k input tok/s on each of the 96
  prefill nodes), ``--seconds`` simulated (default 120) after the cluster is built; CPU
  seconds of generating the workload and of simulating, extrapolated to one simulated hour
  (set-up once, the rest linear in simulated time; the generator timed on ``--gen-requests``,
  default 1,000,000, and scaled to the hour's requests) against the 300 s budget. Baseline in
  the same process: the generator's session layout before issue 36 (`benchmarks/reference`) on
  the same draws (same requests).
- ``mooncake`` (target 2): the Day-6 preset (1 prefill + 1 decode unit) on the Mooncake
  conversation hour (``../shared/requests``): simulated seconds per CPU second against 300.
- ``lp`` (target 3): `dispatch="lp"` against ``even`` on the same run (the Day-6 preset under
  its 1P+1D headline traffic, ``--lp-minutes`` simulated minutes, default 2), CPU ratio
  against 1.3; also with ``lp_overhead_s=0`` (the same steps as ``even``).
- ``greedy`` (target 4): `greedy` against SGLang's ``deepseek_vec`` (`benchmarks/peers`, needs
  torch) on 58 x 256 at 4x8/288, 18x8/288 and 8x8/320, best of ``--repeat`` CPU ms, one
  thread, on the bundled zipf trace and the SGLang prefill_in1024 / decode_in2000out100 dumps.
- ``startup`` (target 6): wall seconds of ``eplb solve`` on the bundled trace (best of 3)
  against 1.0 s, and against ``python -c "import numpy"``.
- ``dask``: the scale section of docs/serving.md: the fleet split into 7 independent
  sub-clusters (one decode unit each with 3 or 4 prefill units, traffic in proportion),
  ``--dask-seconds`` simulated each (default 60), serially in this process and on a Dask
  ``LocalCluster`` of 2 worker processes (this 2-core machine); wall seconds and the speed-up.

    python benchmarks/bench_speed_targets.py [--only fleet,mooncake,lp,greedy,startup,dask]
        [--seconds 120] [--lp-minutes 2] [--repeat 5] [--dask-seconds 20]

CPU seconds on a shared machine still grow with its load (caches, frequency): the load
average is printed with every section; read the ratios.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"  # before numpy loads its thread pools

import argparse  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from eplb.data_dirs import requests_dir, traces_dir  # noqa: E402
from eplb.evaluation import serving  # noqa: E402
from eplb.evaluation.serving.config import UnitConfig  # noqa: E402
from eplb.evaluation.serving.workload import day6, synth  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
DATA = traces_dir()
REQUESTS = requests_dir()
for _alt in (Path("/work/shared/traces"), Path("/work/shared/requests")):
    if not DATA.is_dir() and _alt.name == "traces" and _alt.is_dir():
        DATA = _alt
    if not REQUESTS.is_dir() and _alt.name == "requests" and _alt.is_dir():
        REQUESTS = _alt

FLEET = (24, 7)  # Day-6's fleet in units of the preset's sizes (presets.deepseek_day6)
# the runs stop when arrivals stop (no drain): CPU per simulated second is extrapolated to the
# hour, and a drain after the measured seconds (up to 600 s of a backlog at the fleet's rate)
# would be counted `3600 / seconds` times over
ARRIVALS_ONLY = 0.0
BUDGET = {"fleet_cpu_s": 300.0, "mooncake_x": 300.0, "lp_ratio": 1.3, "startup_s": 1.0}


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def load_avg() -> str:
    return f"load average {os.getloadavg()[0]:.1f}"


def units(cfg: serving.ClusterConfig, prefill: int, decode: int) -> serving.ClusterConfig:
    pu, du = dict(cfg.prefill.__dict__), dict(cfg.decode.__dict__)
    pu["count"], du["count"] = prefill, decode
    return cfg.replace(prefill=UnitConfig(**pu), decode=UnitConfig(**du))


def fleet_rate(prefill_units: int, mix: str = "published") -> float:
    """req/s of the ``mix`` at Day-6's input tokens per prefill node on the units' 4 nodes."""
    mean_in = day6.mix_stats(day6.day6_workload(20_000, 100.0, mix=mix))["input_mean"]
    return day6.DAY6["prefill_input_tok_s_per_node"] * 4 * prefill_units / mean_in


def cpu(fn):
    t = time.process_time()
    out = fn()
    return time.process_time() - t, out


# ---------------------------------------------------------------------------- target 1
def bench_fleet(seconds: float, gen_requests: int) -> None:
    from reference import old_sessions

    cfg = units(serving.ClusterConfig.deepseek_day6(), *FLEET)
    rate = fleet_rate(FLEET[0])
    n = int(rate * seconds * 1.02) + 50
    hour_n = rate * 3600
    print(f"\n== target 1: fleet hour, {FLEET[0]}P + {FLEET[1]}D, published mix, {rate:,.0f} "
          f"req/s ({hour_n:,.0f} requests an hour), {seconds:g} simulated s; {load_avg()}")
    # the generator at ``gen_requests`` (its cost per request grows with the open sessions
    # until they reach rate x THINK_S, then stays), and its session layout old against new
    # on the same draws
    m = max(gen_requests, n)
    gen_s, big = cpu(lambda: day6.day6_workload(m, rate, mix="published", seed=0))
    wl = big.head(n)  # the same first requests as a workload of n (the draws are per index)
    kw = {**day6.FIXED, **day6.MIXES["published"]}
    draws = synth._Draws(
        m,
        new_tokens=synth.lognormal_lengths(m, kw["input_mean"], kw["input_sigma"], seed=0),
        output_tokens=synth.lognormal_lengths(m, kw["output_mean"], kw["output_sigma"], seed=0,
                                              stream=synth._OUTPUT),
        system_prompts=kw["system_prompts"], seed=0)
    lay = {"system_tokens": kw["system_prompt_tokens"],
           "open_sessions": max(32, int(round(rate * day6.THINK_S))),
           "max_input": kw["max_input_tokens"], "block": 512, "hashes": True}
    p = kw["session_prob"]
    new_s, new = cpu(lambda: synth._sessions(draws, p, **lay))
    old_s, old = cpu(lambda: old_sessions._sessions(draws, p, **lay))
    same = new[:3] == old[:3] and all(np.array_equal(a, b) for a, b in zip(new[3], old[3],
                                                                            strict=True))
    del big, new, old
    gen_hour = gen_s * hour_n / m
    print(f"   generator: {gen_s:.2f} s CPU for {m:,} requests ({1e6 * gen_s / m:.1f} us each); "
          f"its session layout {new_s:.2f} s against {old_s:.2f} s before issue 36 "
          f"(x{old_s / new_s:.1f} faster; identical: {same})")
    setup_s, sim = cpu(lambda: serving.simulator.loop.Simulation(cfg, wl, 0, seconds, False,
                                                                  10.0, drain_s=ARRIVALS_ONLY))
    run_s, res = cpu(sim.run)
    per_hour = gen_hour + run_s * 3600 / seconds + setup_s
    s = res.summary(window=(seconds / 3, seconds))
    print(f"   simulation: set-up {setup_s:.1f} s, run {run_s:.1f} s CPU ({seconds / run_s:.2f} "
          f"simulated s per CPU s), {res.meta['events']:,} events; reached "
          f"{s['input_tok_s_per_node']:,.0f} input / {s['output_tok_s_per_node']:,.0f} output "
          f"tok/s/node, TTFT p50 {s['ttft_p50_s']:.2f} s, TPOT p50 "
          f"{1e3 * s['tpot_p50_s']:.1f} ms")
    print(f"   one fleet hour: {per_hour:,.0f} s CPU (generation {gen_hour:,.0f} + "
          f"simulation {run_s * 3600 / seconds + setup_s:,.0f}); target <= "
          f"{BUDGET['fleet_cpu_s']:.0f} s: x{per_hour / BUDGET['fleet_cpu_s']:.2f} of it, "
          f"{verdict(per_hour <= BUDGET['fleet_cpu_s'])}")


# ---------------------------------------------------------------------------- target 2
def bench_mooncake() -> None:
    from eplb.evaluation.serving import workload as W

    path = REQUESTS / "mooncake_conversation.jsonl"
    if not path.exists():
        print(f"\n== target 2: skipped ({path} not found; set EPLB_REQUESTS)")
        return
    wl = W.read(path)
    cfg = serving.ClusterConfig.deepseek_day6()
    print(f"\n== target 2: 1P+1D Day-6 preset on the Mooncake conversation hour "
          f"({len(wl):,} requests); {load_avg()}")
    run_s, res = cpu(lambda: serving.simulate(cfg, wl, seed=0, progress=False))
    end = res.meta["end_s"]
    steps = res.steps["phase"].value_counts().to_dict()
    x = end / run_s
    print(f"   {end:,.0f} simulated s in {run_s:.1f} s CPU: {x:.0f}x real time "
          f"({steps.get('prefill', 0):,} prefill + {steps.get('decode', 0):,} decode steps, "
          f"{1e3 * run_s / max(sum(steps.values()), 1):.2f} ms CPU per step); target >= "
          f"{BUDGET['mooncake_x']:.0f}x: x{x / BUDGET['mooncake_x']:.2f} of it, "
          f"{verdict(x >= BUDGET['mooncake_x'])}")


# ---------------------------------------------------------------------------- target 3
def bench_lp(minutes: float) -> None:
    seconds = 60.0 * minutes
    base = serving.ClusterConfig.deepseek_day6()
    rate = fleet_rate(1, "balanced_units")
    wl = day6.day6_workload(int(rate * seconds * 1.02) + 50, rate, mix="balanced_units", seed=0)
    print(f"\n== target 3: lp against even dispatch, Day-6 preset, {rate:.1f} req/s, "
          f"{minutes:g} simulated min; {load_avg()}")
    serving.simulate(base, wl, seed=0, duration_s=10.0, progress=False)  # warm-up
    out = {}
    for name, cfg in (("even", base), ("lp", base.replace(dispatch="lp")),
                      ("lp, no overhead", base.replace(dispatch="lp", lp_overhead_s=0.0))):
        run_s, res = cpu(lambda c=cfg: serving.simulate(c, wl, seed=0, duration_s=seconds,
                                                        drain_s=ARRIVALS_ONLY,
                                                        progress=False))
        out[name] = (run_s, len(res.steps))
        print(f"   {name:16s} {run_s:6.1f} s CPU, {len(res.steps):,} steps")
    r = out["lp"][0] / out["even"][0]
    r0 = out["lp, no overhead"][0] / out["even"][0]
    print(f"   lp / even: x{r:.2f} CPU (x{r0:.2f} on the same steps); target <= "
          f"{BUDGET['lp_ratio']}: {verdict(r <= BUDGET['lp_ratio'])}")


# ---------------------------------------------------------------------------- target 4
def bench_greedy(repeat: int) -> None:
    try:
        import bench_peers as bp
    except ImportError as exc:  # torch is not a dependency of eplb
        print(f"\n== target 4: skipped ({exc}; pip install torch)")
        return
    import torch

    from eplb import solvers, traces

    torch.set_num_threads(1)
    loads = [REPO / "traces" / "data" / "zipf-58x256.npz"] + [
        f for f in (DATA / "deepseek-v3-sglang" / "prefill_in1024.json",
                    DATA / "deepseek-v3-sglang" / "decode_in2000out100.json") if f.exists()]
    print(f"\n== target 4: greedy against SGLang deepseek_vec, best of {repeat} CPU ms, one "
          f"thread; {load_avg()}")
    from eplb.solvers.primitives import jit as jit_mod

    jit = jit_mod.available()
    note = ("in brackets greedy without the compiled kernels (the fast extra)" if jit
            else "numba not installed: the numpy count search")
    print(f"   greedy / deepseek_vec ms ({note})")
    worst = 0.0
    for path in loads:
        load = traces.read(path).load()
        row = []
        for label, topo in bp.CONFIGS:
            def run(t=topo, ld=load):
                return solvers.solve("greedy", ld, t, num_groups=bp.GROUPS)

            g = bp.best_ms(run, repeat)
            plain = ""
            if jit:  # the same solve with the numpy code, as before issue 36
                kernels, jit_mod._KERNELS = jit_mod._KERNELS, False
                try:
                    plain = f" ({bp.best_ms(run, repeat):.1f})"
                finally:
                    jit_mod._KERNELS = kernels
            v = bp.best_ms(bp.peer_call(bp.sglang_deepseek_vec, load, topo), repeat)
            worst = max(worst, g / v)
            row.append(f"{label} {g:.1f}{plain} / {v:.1f} = x{g / v:.2f}")
        print(f"   {path.name}: " + ", ".join(row))
    print(f"   worst greedy / deepseek_vec x{worst:.2f}; target <= 1: {verdict(worst <= 1.0)}")


# ---------------------------------------------------------------------------- target 6
def bench_startup() -> None:
    trace = REPO / "traces" / "data" / "deepseek-v3-calibrated.npz"

    def best_wall(cmd: list[str]) -> tuple[float, float]:
        """Best wall and best CPU (user + system of the child) seconds of 3 runs."""
        best, best_cpu = float("inf"), float("inf")
        for _ in range(3):
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True, cwd=REPO)
            best = min(best, time.perf_counter() - t)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            best_cpu = min(best_cpu, r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
        return best, best_cpu

    print(f"\n== target 6: start-up; {load_avg()}")
    with tempfile.TemporaryDirectory() as tmp:
        base, _ = best_wall([sys.executable, "-c", "import numpy"])
        solve, solve_cpu = best_wall([sys.executable, "-m", "eplb.cli", "solve", str(trace),
                                      "--topology", "4x8", "--slots", "288", "-o",
                                      str(Path(tmp) / "p.json")])
    print(f"   eplb solve {solve:.2f} s wall, {solve_cpu:.2f} s CPU (python -c 'import numpy' "
          f"{base:.2f} s wall, "
          f"x{solve / base:.1f}); target <= {BUDGET['startup_s']:.1f} s wall: "
          f"{verdict(solve <= BUDGET['startup_s'])}")


# ---------------------------------------------------------------------------- scale
def sub_clusters() -> list[tuple[int, int]]:
    """The fleet as 7 independent sub-clusters of one decode unit each, the 24 prefill units
    dealt 4, 4, 4, 3, 3, 3, 3."""
    p, d = FLEET
    return [(p // d + (i < p % d), 1) for i in range(d)]


def sub_cluster_task(task: dict) -> dict:
    """One sub-cluster: its share of the fleet's traffic, generated and simulated here (CPU
    seconds of both)."""
    t = time.process_time()
    cfg = units(serving.ClusterConfig.deepseek_day6(), task["prefill"], task["decode"])
    n = int(task["rate"] * task["seconds"] * 1.02) + 50
    wl = day6.day6_workload(n, task["rate"], mix="published", seed=task["seed"])
    res = serving.simulate(cfg, wl, seed=task["seed"], duration_s=task["seconds"],
                           drain_s=ARRIVALS_ONLY,
                           progress=False)
    return {"cpu_s": time.process_time() - t, "requests": len(res.requests),
            "end_s": res.meta["end_s"]}


def _warm() -> None:
    import eplb.evaluation.serving  # noqa: F401


def bench_dask(seconds: float) -> None:
    from eplb import runners

    try:
        import distributed
    except ImportError:
        print("\n== scale: skipped (pip install 'eplb[dask]')")
        return
    per_unit = fleet_rate(1)
    tasks = [{"prefill": p, "decode": d, "rate": per_unit * p, "seconds": seconds, "seed": i}
             for i, (p, d) in enumerate(sub_clusters())]
    shape = ", ".join(f"{t['prefill']}P+1D" for t in tasks)
    print(f"\n== scale: the fleet as {len(tasks)} sub-clusters ({shape}), {seconds:g} "
          f"simulated s each; {load_avg()}")
    t = time.perf_counter()
    serial = [sub_cluster_task(x) for x in tasks]
    serial_wall = time.perf_counter() - t
    cpu_sum = sum(r["cpu_s"] for r in serial)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        client.run(_warm)  # workers up, eplb imported, before the clock starts
        t = time.perf_counter()
        out = runners.run(sub_cluster_task, tasks, scheduler=client, progress=False)
        dask_wall = time.perf_counter() - t
    same = [r["requests"] for r in out] == [r["requests"] for r in serial]
    print(f"   serial: {serial_wall:.1f} s wall, {cpu_sum:.1f} s CPU in all; LocalCluster of 2 "
          f"workers: {dask_wall:.1f} s wall (x{serial_wall / dask_wall:.2f}; same requests "
          f"served: {same}); {load_avg()}")
    hour = cpu_sum * 3600 / seconds
    print(f"   one fleet hour as sub-clusters: {hour:,.0f} CPU s; on N workers about "
          f"{hour / len(tasks):,.0f} s wall from N = {len(tasks)} (one sub-cluster a worker; "
          "extrapolated, not measured)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="fleet,mooncake,lp,greedy,startup,dask")
    ap.add_argument("--seconds", type=float, default=120.0, help="fleet: simulated seconds")
    ap.add_argument("--gen-requests", type=int, default=1_000_000,
                    help="fleet: requests generated to time the generator")
    ap.add_argument("--lp-minutes", type=float, default=2.0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dask-seconds", type=float, default=60.0)
    args = ap.parse_args()
    parts = set(args.only.split(","))
    if "fleet" in parts:
        bench_fleet(args.seconds, args.gen_requests)
    if "mooncake" in parts:
        bench_mooncake()
    if "lp" in parts:
        bench_lp(args.lp_minutes)
    if "greedy" in parts:
        bench_greedy(args.repeat)
    if "startup" in parts:
        bench_startup()
    if "dask" in parts:
        bench_dask(args.dask_seconds)


if __name__ == "__main__":
    main()
