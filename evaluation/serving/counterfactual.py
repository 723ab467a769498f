"""Counterfactual pairs: the expert effect alone (docs/serving.md, "Comparing policies").

One closed-loop run of a *driver* config records every unit step (its start time and its
batch per DP rank); each config then replays that step sequence with its own placement
policy: the same batches, the same routed expert counts per step (the simulator's draws are a
function of seed, unit and step order only), its own initial placement, rebalances (planned
from the load the replayed steps recorded) and migrations. Only the placement and what moving
it costs differ, so per-step time differences are the placement's.

Breakdown of a replayed step (seconds, summing to ``step_s``): the step model's keys, except
that ``dp_wait`` is the step's DP wait with its expert counts perfectly balanced
(`balanced_step`; the same for every config: it depends on the batch and counts only)
and ``ep_wait`` takes what the model's DP wait adds on top (DP imbalance meeting the
placement's imbalance). ``stall_s``: a stalling migration's copy charged to the first step
after it (the step sequence does not move in a counterfactual).

What a user sees (`REQUEST_METRICS`: TTFT and TPOT percentiles, tokens/s per node) comes from
re-timing the driver's run with each config's step durations (`retime`): a unit's step starts
when the one before it ends, or, where the driver's unit sat idle waiting for work, not before
the driver's start; a request's first token moves with its prefill unit's clock at its prefill
end, its decode span with its decode unit's clock; throughput counts the tokens of the steps
that still start in the window.
The batches stay the driver's (no queue reacts), so this is the expert effect on latency at
the driver's operating point (`OPERATING`, also in ``attrs["operating_point"]``).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from eplb import runners
from eplb.errors import InputError
from eplb.evaluation.serving.config import ClusterConfig, EplbConfig, EplbMode
from eplb.evaluation.serving.operating_point import measured
from eplb.evaluation.serving.simulator.expert_loads import Popularity, StepLoads
from eplb.evaluation.serving.simulator.loop import Simulation, build_engines, check_args
from eplb.evaluation.serving.steptime import BREAKDOWN
from eplb.evaluation.serving.workload.model import Workload

__all__ = ["DELTA", "OPERATING", "REQUEST_METRICS", "STEP_KEYS", "StepFrame", "counterfactual",
           "replay", "retime", "step_log"]

# per-step columns of a replay beside phase / unit / step / start_s / tokens
STEP_KEYS = ("step_s", "stall_s", *(f"{k}_s" for k in BREAKDOWN), "gpu_load_max_over_mean")
# the parts a placement changes: what the paired per-step differences are broken into
DELTA = ("step_s", "ep_wait_s", "comm_exposed_s", "moe_s", "stall_s", "dp_wait_s")
# what a user sees, re-timed with each config's steps (`retime`, `request_metrics`)
REQUEST_METRICS = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s",
                   "input_tok_s_per_node", "output_tok_s_per_node")
# the driver's operating point (the same for every config of a seed: the batches are its)
OPERATING = ("prefill_tokens_per_rank", "decode_requests_per_rank", "decode_kv_fill")
# the fields every config of a counterfactual comparison must share (the step sequence's)
SHARED = ("model", "hardware", "prefill", "decode", "routing", "kv", "faults")


class StepFrame(pd.DataFrame):
    """The replayed steps (a plain `pandas.DataFrame` otherwise): pandas deep-copies ``attrs``
    into every frame derived from the comparison, so this one is shared instead of copied."""

    def __deepcopy__(self, memo=None):
        return self


def step_log(config: ClusterConfig, workload: Workload, seed: int, duration_s=None,
             drain_s=None) -> dict:
    """The closed-loop run of ``config``: ``{(phase, unit): [(start_s, batch, tokens), ...]}``
    of every step in order, ``"_end_s"``, the run's end, and ``"_result"``, its `SimResult`."""
    sim = Simulation(config, workload, seed, duration_s, False, 10.0, drain_s)
    log: dict[Any, Any] = {}
    for phase in ("prefill", "decode"):
        for unit in sim.units[phase]:
            steps = log[(phase, unit.index)] = []
            unit.step_time = _logged(unit.step_time, steps)
    res = sim.run()
    log["_end_s"] = float(res.meta["end_s"])
    log["_result"] = res
    return log


def _logged(step_time, steps: list):
    def logged(batch, t, tokens):
        steps.append((t, batch, tokens))
        return step_time(batch, t, tokens)

    return logged


def replay(config: ClusterConfig, log: Mapping, seed: int) -> tuple[pd.DataFrame, list[dict]]:
    """``config``'s placement policy on the recorded steps of ``log`` (`step_log`): one row per
    step (`STEP_KEYS`) and the rebalances made."""
    model = config.model_spec
    pops = {ph: Popularity(config.routing, model, ph, seed) for ph in ("prefill", "decode")}
    units = build_engines(config, pops, seed)
    rows: list[tuple] = []
    rebalances: list[dict] = []
    for phase in ("prefill", "decode"):
        pop = pops[phase]
        eplb = config.eplb_for(phase)  # [eplb] with the phase's own table over it
        interval = eplb.rebalance_interval_s
        stall = eplb.migration == "stall"
        for unit in units[phase]:
            planner = unit.planner
            ideal = StepLoads(pop, unit.index, seed) if eplb.mode is EplbMode.BALANCED else None
            unit.set_placement(
                planner.initial(
                    lambda pop=pop, h=eplb.history_s: pop.mean(-h, 0.0),
                    lambda pop=pop, i=interval: pop.mean(0.0, i),
                )
            )
            next_rebal = interval if planner.rebalances else math.inf
            pending: list[tuple[float, Any]] = []  # (live_s, plan) of overlapped copies
            owed = 0.0  # a stalling copy's seconds, charged to the next step
            for k, (t, batch, tokens) in enumerate(log.get((phase, unit.index), ())):
                while next_rebal <= t:
                    tr, next_rebal = next_rebal, next_rebal + interval
                    if unit.placement is None:
                        continue
                    future = pop.mean(tr, tr + interval)
                    load = future if eplb.mode is EplbMode.ORACLE else unit.recorder.load(
                        tr - eplb.history_s, tr
                    )
                    plan = planner.plan(unit.placement, load, future)
                    if plan is None:
                        continue
                    rebalances.append(
                        {"time_s": tr, "phase": phase, "unit": unit.index,
                         "bytes_moved": plan.bytes_moved, "copy_s": plan.copy_s,
                         "stall_s": plan.copy_s if stall else 0.0}
                    )
                    if stall:
                        unit.set_placement(plan.placement)
                        owed += plan.copy_s
                    else:
                        pending.append((tr + plan.copy_s, plan.placement))
                while pending and pending[0][0] <= t:
                    unit.set_placement(pending.pop(0)[1])
                if ideal is not None:
                    st = balanced_step(unit.sm, batch, ideal.draw(t, unit.picks_per_token * tokens))
                else:
                    st = unit.step_time(batch, t, tokens)
                ratio = st.gpu_load_max / np.where(st.gpu_load_mean > 0, st.gpu_load_mean, 1.0)
                b = st.breakdown
                rows.append(
                    (phase, unit.index, k, t, tokens, st.total_s, owed,
                     *(b[key] for key in BREAKDOWN), float(ratio.mean()))
                )
                owed = 0.0
    cols = ["phase", "unit", "step", "start_s", "tokens", "step_s", "stall_s",
            *(f"{k}_s" for k in BREAKDOWN), "gpu_load_max_over_mean"]
    return pd.DataFrame.from_records(rows, columns=cols), rebalances


def balanced_step(sm, batch, counts: np.ndarray):
    """The step of ``batch`` with the expert counts ``counts: float[L, E]`` perfectly balanced:
    every GPU holds the mean of the logical experts' GEMM seconds and receives the mean
    picks. For decode a lower bound on the step under any placement of these counts (the
    expert curve is subadditive, every stage is monotone); in prefill the all-to-all takes the
    placement-free visit probabilities of balanced routing (docs/serving.md)."""
    mb, G = sm.micro_batches, sm.topology.num_gpus
    c = counts * (1.0 / mb)  # picks of one micro-batch
    L = c.shape[0]
    moe = np.repeat(sm.gpu.expert_table.seconds(c).sum(1, keepdims=True) / G, G, axis=1)
    recv = np.repeat(c.sum(1, keepdims=True) / G, G, axis=1)
    src = batch.tokens / mb
    if sm.phase == "decode":
        rank = sm.rank.decode_rows(batch)
        return sm.assembly.decode_step(batch, rank, src, recv, moe, sm.comm.ll)
    a1, a2, sh = sm.rank.stages(batch)
    v, vn = sm.comm.balanced_visits(L)
    links = sm.comm.links(src, recv, v, vn)
    uniform = bool(np.all(src == src[0]))
    links_eq = links if uniform else sm.comm.links(np.full(G, src.mean()), recv, v, vn)
    return sm._assemble(batch, a1, a2, sh, (moe, recv * mb, links, moe, links_eq),
                        balanced=True)


def retime(driver: pd.DataFrame, durations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The driver's steps of one unit (``driver``: its `SimResult.steps` rows in step order,
    ``start_s`` and ``duration_s``) re-timed with ``durations: float[K]`` seconds: a step
    starts when the one before ends, or, where the driver's unit was idle before it (its
    start after the previous end), at the later of that end and the driver's start. Returns
    ``(start, end): float64[K]``."""
    start0 = driver["start_s"].to_numpy(dtype=np.float64)
    end0 = start0 + driver["duration_s"].to_numpy(dtype=np.float64)
    d = np.asarray(durations, dtype=np.float64)
    start, end = np.empty_like(d), np.empty_like(d)
    prev0 = prev = -math.inf
    for k in range(d.size):
        idle = start0[k] > prev0 + 1e-12
        start[k] = max(start0[k], prev) if idle else prev
        end[k] = start[k] + d[k]
        prev0, prev = end0[k], end[k]
    return start, end


def _clock(driver: pd.DataFrame, start: np.ndarray, end: np.ndarray):
    """``t -> t'``: driver seconds to re-timed ones on one unit, linear inside each step and
    each gap, shifted by the last step's change after it."""
    s0 = driver["start_s"].to_numpy(dtype=np.float64)
    e0 = s0 + driver["duration_s"].to_numpy(dtype=np.float64)
    xs = np.ravel(np.column_stack([s0, e0]))
    ys = np.ravel(np.column_stack([start, end]))
    order = np.argsort(xs, kind="stable")
    xs, ys = xs[order], np.maximum.accumulate(ys[order])

    def clock(t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=np.float64)
        if not xs.size:
            return t
        out = np.interp(t, xs, ys)
        return np.where(t > xs[-1], t + (ys[-1] - xs[-1]), np.where(t < xs[0], t, out))

    return clock


def request_metrics(result, replayed: pd.DataFrame, window=None) -> dict[str, float]:
    """`REQUEST_METRICS` of the driver's run ``result`` (a `SimResult`) re-timed with the
    ``replayed`` steps of one config (`replay`'s frame: ``step_s`` and ``stall_s`` per
    ``(phase, unit, step)``): latencies over the requests arriving in ``window`` (default
    the arrival window, as `SimResult.summary`) that the driver served (TTFT) or finished
    (TPOT); throughput as the summary counts it, the tokens of the steps starting in the
    window (re-timed) over its length. Driver and config agree exactly when the durations do."""
    steps = result.steps
    t0, t1 = result.arrival_window() if window is None else window
    clocks: dict[tuple[str, int], Any] = {}
    done = {"prefill": 0.0, "decode": 0.0}  # tokens of the steps re-timed into the window
    for (phase, unit), drv in steps.groupby(["phase", "unit"], sort=False):
        drv = drv.sort_values("step")
        rep = replayed[(replayed["phase"] == phase) & (replayed["unit"] == unit)]
        rep = rep.set_index("step").reindex(drv["step"])
        dur = (rep["step_s"] + rep["stall_s"]).to_numpy()
        dur = np.where(np.isnan(dur), drv["duration_s"].to_numpy(), dur)
        start, end = retime(drv, dur)
        clocks[(phase, int(unit))] = _clock(drv, start, end)
        col = "input_tokens_done" if phase == "prefill" else "output_tokens"
        inside = (start >= t0) & (start < t1)
        done[phase] += float(drv[col].to_numpy()[inside].sum())
    req = result.requests
    req = req[(req["arrival_s"] >= t0) & (req["arrival_s"] < t1)]
    ttft = req["ttft_s"].to_numpy(dtype=np.float64).copy()
    for u in np.unique(req["prefill_unit"]):
        if ("prefill", int(u)) not in clocks:
            continue
        sel = (req["prefill_unit"] == u).to_numpy() & req["prefill_end_s"].notna().to_numpy()
        t = req["prefill_end_s"].to_numpy()[sel]
        ttft[sel] += clocks[("prefill", int(u))](t) - t
    tpot = req["tpot_s"].to_numpy(dtype=np.float64).copy()
    for u in np.unique(req["decode_unit"]):
        if ("decode", int(u)) not in clocks:
            continue
        sel = (req["decode_unit"] == u).to_numpy() & ~np.isnan(tpot)
        a, b = req["first_token_s"].to_numpy()[sel], req["finish_s"].to_numpy()[sel]
        c = clocks[("decode", int(u))]
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot[sel] *= np.where(b > a, (c(b) - c(a)) / (b - a), 1.0)
    out: dict[str, float] = {}
    for name, x in (("ttft", ttft), ("tpot", tpot)):
        x = x[~np.isnan(x)]
        for q in (50, 90):
            out[f"{name}_p{q}_s"] = float(np.percentile(x, q)) if x.size else math.nan
    span = t1 - t0
    meta = result.meta
    for phase, key, nodes in (("prefill", "input_tok_s_per_node", meta.get("prefill_nodes", 1)),
                              ("decode", "output_tok_s_per_node", meta.get("decode_nodes", 1))):
        out[key] = done[phase] / span / nodes if span > 0 else math.nan
    return out


def operating_columns(ops: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """`OPERATING` of the driver's run from its measured points (`operating_point.measured`:
    ``{phase: point}``)."""
    pre, dec = ops.get("prefill", {}), ops.get("decode", {})
    return {"prefill_tokens_per_rank": pre.get("per_rank", math.nan),
            "decode_requests_per_rank": dec.get("per_rank", math.nan),
            "decode_kv_fill": dec.get("kv_fill", math.nan)}


def _summary(steps: pd.DataFrame, rebalances: list[dict], window=None) -> dict[str, float]:
    out: dict[str, float] = {}
    if window is not None:
        t0, t1 = window
        steps = steps[(steps["start_s"] >= t0) & (steps["start_s"] < t1)]
        rebalances = [r for r in rebalances if t0 <= r["time_s"] < t1]
    for phase in ("prefill", "decode"):
        part = steps[steps["phase"] == phase]
        n = len(part)
        out[f"{phase}_steps"] = float(n)
        out[f"{phase}_step_s"] = float(part["step_s"].mean()) if n else math.nan
        out[f"{phase}_busy_s"] = float(part["step_s"].sum() + part["stall_s"].sum())
        out[f"{phase}_stall_s"] = float(part["stall_s"].sum())
        for key in ("ep_wait_s", "comm_exposed_s", "moe_s", "dp_wait_s"):
            out[f"{phase}_{key}"] = float(part[key].mean()) if n else math.nan
        out[f"{phase}_gpu_load_max_over_mean"] = (
            float(np.average(part["gpu_load_max_over_mean"], weights=part["step_s"]))
            if n and part["step_s"].sum() > 0
            else math.nan
        )
    out["rebalances"] = float(len(rebalances))
    out["bytes_moved"] = float(sum(r["bytes_moved"] for r in rebalances))
    return out


def run_seed(task: Mapping[str, Any]) -> dict[str, Any]:
    """One seed of a counterfactual comparison (a `runners.run` task): the driver's step log,
    every config's replay; summary rows and per-step frames."""
    start = time.perf_counter()
    named, seed = task["configs"], task["seed"]
    driver = named[task["driver"]]
    log = step_log(driver, task["workload"], seed, task["duration_s"], task.get("drain_s"))
    # the DP wait of each step with the experts perfectly balanced (`balanced_step`)
    done = {name: replay(cfg, log, seed) for name, cfg in named.items()
            if all(cfg.eplb_for(ph).mode is EplbMode.BALANCED for ph in ("prefill", "decode"))}
    ref = next(iter(done.values()), None) or replay(
        driver.with_eplb(EplbConfig(solver=EplbMode.BALANCED.value)), log, seed)
    dp_ref = ref[0]["dp_wait_s"].to_numpy()
    rows, frames = [], []
    result = log["_result"]
    points = measured(result.steps, result.requests, driver)
    operating = operating_columns(points)
    for name, cfg in named.items():
        t0 = time.perf_counter()
        steps, rebal = done[name] if name in done else replay(cfg, log, seed)
        seen = request_metrics(result, steps, task["window"])  # before the columns move
        steps["ep_wait_s"] += steps["dp_wait_s"] - dp_ref
        steps["dp_wait_s"] = dp_ref
        steps.insert(0, "seed", seed)
        steps.insert(0, "config", name)
        frames.append(steps)
        rows.append({"config": name, "seed": seed, **_summary(steps, rebal, task["window"]),
                     **seen, **operating, "wall_s": time.perf_counter() - t0})
    return {"rows": rows, "steps": frames, "points": points,
            "wall_s": time.perf_counter() - start}


def _shared(config: ClusterConfig, key: str):
    """Field ``key`` of ``config`` as the step sequence sees it: a unit without its phase's
    eplb table (placement policy may differ between the configs)."""
    value = getattr(config, key)
    return dataclasses.replace(value, eplb={}) if key in ("prefill", "decode") else value


def check_shared(named: Mapping[str, ClusterConfig]) -> None:
    """Every config must share the step sequence's fields (`SHARED`): only ``eplb``,
    ``dispatch``, ``slo`` and ``name`` may differ."""
    first_name, first = next(iter(named.items()))
    for name, cfg in named.items():
        for key in SHARED:
            if _shared(cfg, key) != _shared(first, key):
                raise InputError(
                    f"counterfactual mode replays one step sequence, so configs may differ only "
                    f"in eplb and dispatch; {name!r} and {first_name!r} differ in {key} "
                    "(use mode='closed_loop' to compare them)"
                )
        if cfg.faults:
            raise InputError(
                f"config {name!r} has faults; counterfactual mode does not replay failures "
                "(use mode='closed_loop')"
            )


def counterfactual(
    named: Mapping[str, ClusterConfig],
    workload: Workload,
    seeds: Sequence[int],
    *,
    duration_s: float | None = None,
    window: tuple[float, float] | None = None,
    driver: str | None = None,
    drain_s: float | None = None,
    workers: int = 1,
    scheduler: Any = None,
    progress: bool = True,
) -> pd.DataFrame:
    """Counterfactual pairs (module docstring): one row per ``(config, seed)`` with per-phase
    mean step seconds and breakdown, busy and stall seconds, rebalances, and ``d_`` columns
    (config minus the first config, seed by seed), `REQUEST_METRICS` re-timed (module
    docstring) and the driver's `OPERATING` point; ``window=(t0, t1)``: summarise the steps
    starting in it and the requests arriving in it (seconds). ``attrs["steps"]``: every
    replayed step (`STEP_KEYS`) with ``d_`` columns of `DELTA` against the first config's same step;
    ``attrs["baseline"]``, ``attrs["driver"]`` (default the baseline), ``attrs["wall_s"]``,
    ``attrs["operating_point"]``: seed -> `operating_point.measured` of the driver's run."""
    check_shared(named)
    base = next(iter(named))
    driver = base if driver is None else str(driver)
    if driver not in named:
        raise InputError(f"driver {driver!r} is not one of the configs: {', '.join(named)}")
    for cfg in named.values():
        check_args(cfg, workload, 0, duration_s, 1.0, drain_s)
    tasks = [
        {"configs": dict(named), "workload": workload, "seed": int(s), "driver": driver,
         "duration_s": duration_s, "drain_s": drain_s, "window": window}
        for s in seeds
    ]
    start = time.perf_counter()
    out = runners.run(run_seed, tasks, workers=workers, scheduler=scheduler,
                      progress=progress, desc="counterfactual", unit="seed")
    frame = pd.DataFrame([r for o in out for r in o["rows"]])
    metrics = [c for c in frame.columns if c not in ("config", "seed", "wall_s")]
    ref = frame[frame["config"] == base].set_index("seed")
    for m in metrics:
        frame[f"d_{m}"] = frame[m] - frame["seed"].map(ref[m])
    steps = pd.concat([f for o in out for f in o["steps"]], ignore_index=True)
    key = ["seed", "phase", "unit", "step"]
    bsteps = steps.loc[steps["config"] == base, key + list(DELTA)]
    joined = steps[key].merge(bsteps, on=key, how="left", validate="many_to_one")
    for m in DELTA:
        steps[f"d_{m}"] = steps[m].to_numpy() - joined[m].to_numpy()
    frame.attrs.update(baseline=base, driver=driver, steps=StepFrame(steps),
                       wall_s=time.perf_counter() - start, mode="counterfactual",
                       operating_point={int(s): o["points"] for s, o in zip(seeds, out,
                                                                            strict=True)})
    return frame
