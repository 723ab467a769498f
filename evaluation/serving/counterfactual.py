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
from eplb.evaluation.serving.simulator.expert_loads import Popularity, StepLoads
from eplb.evaluation.serving.simulator.loop import Simulation, build_engines, check_args
from eplb.evaluation.serving.steptime import BREAKDOWN
from eplb.evaluation.serving.workload.model import Workload

__all__ = ["DELTA", "STEP_KEYS", "StepFrame", "counterfactual", "replay", "step_log"]

# per-step columns of a replay beside phase / unit / step / start_s / tokens
STEP_KEYS = ("step_s", "stall_s", *(f"{k}_s" for k in BREAKDOWN), "gpu_load_max_over_mean")
# the parts a placement changes: what the paired per-step differences are broken into
DELTA = ("step_s", "ep_wait_s", "comm_exposed_s", "moe_s", "stall_s", "dp_wait_s")
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
    of every step in order, and ``"_end_s"``, the run's end."""
    sim = Simulation(config, workload, seed, duration_s, False, 10.0, drain_s)
    log: dict[Any, Any] = {}
    for phase in ("prefill", "decode"):
        for unit in sim.units[phase]:
            steps = log[(phase, unit.index)] = []
            unit.step_time = _logged(unit.step_time, steps)
    res = sim.run()
    log["_end_s"] = float(res.meta["end_s"])
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
    for name, cfg in named.items():
        t0 = time.perf_counter()
        steps, rebal = done[name] if name in done else replay(cfg, log, seed)
        steps["ep_wait_s"] += steps["dp_wait_s"] - dp_ref
        steps["dp_wait_s"] = dp_ref
        steps.insert(0, "seed", seed)
        steps.insert(0, "config", name)
        frames.append(steps)
        rows.append({"config": name, "seed": seed, **_summary(steps, rebal, task["window"]),
                     "wall_s": time.perf_counter() - t0})
    return {"rows": rows, "steps": frames, "wall_s": time.perf_counter() - start}


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
    (config minus the first config, seed by seed); ``window=(t0, t1)``: summarise the steps
    starting in it (seconds). ``attrs["steps"]``: every replayed step
    (`STEP_KEYS`) with ``d_`` columns of `DELTA` against the first config's same step;
    ``attrs["baseline"]``, ``attrs["driver"]`` (default the baseline), ``attrs["wall_s"]``."""
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
                       wall_s=time.perf_counter() - start, mode="counterfactual")
    return frame
