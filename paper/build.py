"""Rebuild the study in ``paper/``: every table, figure and number in ``paper/paper.md``.

Run from the repository root: ``python paper/build.py`` (a few minutes on 2 cores).
Inputs: the six DeepSeek-V3 expert-count files SGLang published (``--data``, default
``$EPLB_DATA/deepseek-v3-sglang`` when the environment variable is set, else
``../shared/traces/deepseek-v3-sglang``; docs/data.md says where to get them) and the traces
bundled in ``traces/data``.
Outputs (in ``--out``, default ``paper/``): ``results.json``, ``tables/*.md``,
``figures/*.png`` and ``paper.md`` rendered from ``paper/paper.in.md`` (``$name``
placeholders are filled from ``results.json``; a placeholder without a value fails the build).

All or nothing: every stage writes into a temporary folder beside ``--out``; only when the
whole build succeeded are ``tables/`` and ``figures/`` swapped in and ``results.json`` and
``paper.md`` renamed over the old ones. A failed, interrupted (Ctrl-C, SIGTERM) or killed
build leaves the previous set untouched (a killed one leaves a ``.paper-build-*`` folder,
which the next build removes). Each stage prints a line when it starts and ends.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import string
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from eplb import (
    EplbError,
    Topology,
    solvers,
    traces,
)
from eplb.atomic import atomic_write_text, publish_tree, recover_publish
from eplb.data_dirs import traces_dir
from eplb.evaluation import metrics, pareto, plots, replay, traffic
from eplb.evaluation.tables import markdown
from eplb.solvers.analysis.bounds import lower_bound
from eplb.solvers.analysis.migration import replicas_moved

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OUT = HERE  # where the stages write; main() points it at a temporary folder
PUBLISHED = ("tables", "figures", "results.json", "paper.md")


SETTINGS = {
    "prefill": (Topology(4, 8, 9), 8),  # 4 nodes x 8 GPUs, 288 slots, 8 groups: hierarchical
    "decode": (Topology(18, 8, 2), 8),  # 18 x 8 GPUs, 2 slots per GPU: DeepSeek goes global
}
POLICIES = {  # label -> (solver, options)
    "deepseek": ("deepseek", {}),
    "greedy": ("greedy", {}),
    "greedy weighted": ("greedy", {"weighted": True}),
    "hierarchical": ("hierarchical", {}),
}


def solve(label: str, load, topo, groups):
    name, options = POLICIES[label]
    return solvers.solve(name, load, topo, num_groups=groups, **options)


def fmt(x: float, digits: int = 4) -> str:
    return f"{x:.{digits}f}"


# --------------------------------------------------------------------------- E1
def balance_table(files: list[Path], out: dict) -> pd.DataFrame:
    rows = []
    per_layer = {}
    jobs = [(f, s, p) for f in files for s in SETTINGS for p in POLICIES]
    loads = {f: traces.read(f).load() for f in files}
    bounds = {(f, s): lower_bound(loads[f], SETTINGS[s][0]) for f in files for s in SETTINGS}
    for f, setting, label in tqdm(jobs, desc="E1 balance", unit="solve"):
        topo, groups = SETTINGS[setting]
        if label == "hierarchical" and groups < topo.num_nodes:
            continue  # needs a group per node
        load = loads[f]
        t = time.perf_counter()
        p = solve(label, load, topo, groups)
        seconds = time.perf_counter() - t
        gpu = p.gpu_load(load)
        ratio = gpu.max(-1) / bounds[f, setting]
        per_layer[f.stem, setting, label] = ratio
        rows.append({
            "trace": f.stem, "setting": setting, "policy": label,
            "max_over_bound_mean": ratio.mean(), "max_over_bound_worst": ratio.max(),
            "balancedness_mean": metrics.balancedness(gpu).mean(),
            "step_max_over_mean": gpu.max(-1).sum() / gpu.mean(-1).sum(),
            "ms": seconds * 1e3,
        })
    df = pd.DataFrame(rows)
    agg = df.groupby(["setting", "policy"], sort=False).agg(
        max_over_bound_mean=("max_over_bound_mean", "mean"),
        max_over_bound_worst=("max_over_bound_worst", "max"),
        balancedness_mean=("balancedness_mean", "mean"),
        step_max_over_mean=("step_max_over_mean", "mean"),
        ms_median=("ms", "median"),
    ).reset_index()
    for r in agg.itertuples():
        key = f"{r.setting}_{r.policy.replace(' ', '_')}"
        out[f"{key}_mob"] = fmt(r.max_over_bound_mean)
        out[f"{key}_mob_worst"] = fmt(r.max_over_bound_worst)
        out[f"{key}_bal"] = fmt(r.balancedness_mean)
        out[f"{key}_step"] = fmt(r.step_max_over_mean)
        out[f"{key}_ms"] = fmt(r.ms_median, 1)
    # greedy never worse than deepseek, per layer, over all files and settings
    worse = sum(int(np.sum(per_layer[f.stem, s, "greedy"] > per_layer[f.stem, s, "deepseek"]
                           * (1 + 1e-12))) for f in files for s in SETTINGS)
    out["greedy_layers_worse_than_deepseek"] = str(worse)
    out["layers_compared"] = str(sum(len(per_layer[f.stem, s, "greedy"])
                                     for f in files for s in SETTINGS))
    # the group contract's own cost: max load over the group-constrained bound (prefill)
    topo, groups = SETTINGS["prefill"]
    for label in ("deepseek", "hierarchical"):
        ratios = [solve(label, loads[f], topo, groups).gpu_load(loads[f]).max(-1)
                  / lower_bound(loads[f], topo, num_groups=groups, hierarchical=True)
                  for f in files]
        out[f"group_bound_{label}"] = fmt(float(np.mean(np.concatenate(ratios))))
        out[f"group_bound_{label}_worst"] = fmt(float(np.max(np.concatenate(ratios))))
    atomic_write_text(OUT / "tables" / "balance.md", markdown(agg, digits=4, index=False))
    atomic_write_text(OUT / "tables" / "balance_per_trace.md", markdown(df, digits=4, index=False))
    # figure: per-layer max/bound on one prefill file
    ref = files[0].stem
    frames = {label: pd.DataFrame({"layer": np.arange(len(v)), "max_over_bound": v})
              for (stem, s, label), v in per_layer.items() if stem == ref and s == "prefill"}
    _line_plot(frames, "layer", "max_over_bound", OUT / "figures" / "per_layer_prefill.png",
               f"max GPU load / lower bound per MoE layer, {ref}, 4x8 GPUs, 288 slots")
    out["per_layer_trace"] = ref
    return agg


def _line_plot(frames: dict, x: str, y: str, path: Path, title: str) -> None:
    plt = plots._plt()
    fig, ax = plt.subplots(figsize=(8, 4))
    for label, frame in frames.items():
        ax.plot(frame[x], frame[y], marker=".", label=label)
    styles = ["-", "--", ":", "-."]
    for line, style in zip(ax.get_lines(), styles * 4, strict=False):
        line.set_linestyle(style)
    ax.set_xlabel(x.replace("_", " "))
    ax.set_ylabel(y.replace("_", " "))
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    plots._save(fig, path)


# -------------------------------------------------------------------------- E1b
def exact_study(files: list[Path], out: dict, layers: int) -> None:
    """Certified optima on the first ``layers`` layers: S = 2 (decode) and S = 9 (prefill)."""
    decode = next(f for f in files if f.stem.startswith("decode"))
    for setting, path in (("decode", decode), ("prefill", files[0])):
        topo, groups = SETTINGS[setting]
        load = traces.read(path).load()[:layers]
        t = time.perf_counter()
        exact = solvers.solve("ilp", load, topo, deterministic_time=20, workers=2, progress=False)
        seconds = time.perf_counter() - t
        info = exact.meta["solver"]
        opt = np.array(info["objective"])
        best_bound = np.array(info["bound"])
        ds = solvers.solve("deepseek", load, topo, num_groups=groups).gpu_load(load).max(-1)
        gr = solvers.solve("greedy", load, topo).gpu_load(load).max(-1)
        simple = lower_bound(load, topo)
        key = f"ex_{setting}"
        out[f"{key}_trace"] = path.stem
        out[f"{key}_layers"] = str(layers)
        out[f"{key}_optimal"] = str(int(info["optimal_layers"]))
        out[f"{key}_gap_max"] = f"{float(info['gap_max']):.1e}"
        out[f"{key}_deepseek"] = fmt(float(np.mean(ds / best_bound)))
        out[f"{key}_deepseek_worst"] = fmt(float(np.max(ds / best_bound)))
        out[f"{key}_greedy"] = fmt(float(np.mean(gr / best_bound)))
        out[f"{key}_greedy_worst"] = fmt(float(np.max(gr / best_bound)))
        out[f"{key}_improved"] = str(int(np.sum(opt < gr * (1 - 1e-9))))
        out[f"{key}_bound_tightness"] = fmt(float(np.mean(simple / best_bound)))
        out[f"{key}_seconds"] = fmt(seconds, 0)


# --------------------------------------------------------------------------- E2
def redundancy_sweep(path: Path, out: dict) -> None:
    load = traces.read(path).load()
    rows = []
    slots = [256, 288, 320, 352, 384]
    for P in tqdm(slots, desc="E2 redundancy", unit="setting"):
        topo = Topology.parse("4x8", slots=P)
        for label in ("deepseek", "greedy", "greedy weighted", "hierarchical"):
            p = solve(label, load, topo, 8)
            gpu = p.gpu_load(load)
            rows.append({"slots": P, "redundant": P - 256, "policy": label,
                         "step_max_over_mean": gpu.max(-1).sum() / gpu.mean(-1).sum()})
    df = pd.DataFrame(rows)
    table = df.pivot(index="redundant", columns="policy", values="step_max_over_mean")
    atomic_write_text(OUT / "tables" / "redundancy.md", markdown(table, digits=4))
    frames = {label: part for label, part in df.groupby("policy", sort=False)}
    _line_plot(frames, "redundant", "step_max_over_mean", OUT / "figures" / "redundancy.png",
               f"step max/mean GPU load vs redundant slots, {path.stem}, 4x8 GPUs")
    for r in df.itertuples():
        out[f"red{r.redundant}_{r.policy.replace(' ', '_')}"] = fmt(r.step_max_over_mean)


# --------------------------------------------------------------------------- E3
def replay_study(out: dict) -> None:
    cal = traces.read(REPO / "traces" / "data" / "deepseek-v3-calibrated.npz")
    trace = traces.synth.drift(cal.num_layers, cal.num_experts, windows=24, rate=0.05,
                               skew=(0.3, 0.8), seed=7, layer_ids=cal.layer_ids,
                               meta={"num_groups": 8, "top_k": 8})
    topo = SETTINGS["prefill"][0]
    frames = {}
    rows = []
    runs = [("deepseek", 1, "deepseek every window", {}),
            ("greedy", 1, "greedy every window", {}),
            ("greedy", 1, "greedy repair every window", {"tolerance": 0.002}),
            ("greedy", 4, "greedy every 4 windows", {}),
            ("greedy", 24, "greedy once (window 0)", {})]
    for solver, interval, label, options in tqdm(runs, desc="E3 replay"):
        first = solvers.solve(solver, trace.load(0), topo, num_groups=8)
        first = type(first)(first.phy2log, first.num_experts, topo, first.replica_share,
                            first.meta, trace.layer_ids)
        frame = replay.replay(trace, topo, solver=solver, interval=interval, history=1,
                              num_groups=8, initial=first, solver_options=options)
        frames[label] = frame
        scored = frame[frame["window"] >= 1]
        moved = frame.loc[frame["rebalanced"] & (frame["window"] > 0), "replicas_moved"]
        rows.append({"run": label, "step_max_over_mean": scored["step_max_over_mean"].mean(),
                     "rebalances": int(frame["rebalanced"].sum()),
                     "replicas_moved_per_rebalance": moved.mean() if len(moved) else 0.0})
    # migration with and without relabeling against the live placement
    load0, load1 = trace.load(0), trace.load(1)
    p0 = solvers.solve("greedy", load0, topo)
    fresh = solvers.solve("greedy", load1, topo)
    kept = solvers.solve("greedy", load1, topo, previous=p0)
    repaired = solvers.solve("greedy", load1, topo, previous=p0, tolerance=0.002)
    out["moved_fresh"] = str(int(replicas_moved(p0, fresh).sum()))
    out["moved_relabeled"] = str(int(replicas_moved(p0, kept).sum()))
    out["moved_repaired"] = str(int(replicas_moved(p0, repaired).sum()))
    out["slots_total"] = str(trace.num_layers * topo.num_slots)
    df = pd.DataFrame(rows)
    atomic_write_text(OUT / "tables" / "replay.md", markdown(df, digits=4, index=False))
    plots.replay_curve(frames, OUT / "figures" / "replay.png",
                       title="drifting trace, 4x8 GPUs, 288 slots")
    for i, r in enumerate(df.itertuples()):
        out[f"replay{i}_step"] = fmt(r.step_max_over_mean)
        out[f"replay{i}_moved"] = fmt(r.replicas_moved_per_rebalance, 1)
    out["replay_windows"] = str(trace.num_windows)


# --------------------------------------------------------------------------- E4
def traffic_study(path: Path, out: dict) -> None:
    load = traces.read(path).load()
    topo, groups = SETTINGS["prefill"]
    rows = []
    for label in tqdm(list(POLICIES), desc="E4 traffic"):
        p = solve(label, load, topo, groups)
        for policy in ("even", "local_first"):
            if label == "greedy weighted" and policy == "local_first":
                continue  # local_first ignores shares
            rep = traffic.simulate(p, load=load, policy=policy, top_k=8, num_groups=groups,
                                   topk_groups=4)
            tokens = load.sum(-1) / 8  # [L] tokens through each layer (top-8)
            rows.append({"policy": label, "dispatch": policy,
                         "rdma_MB_per_layer": rep.rdma_bytes.mean() / 1e6,
                         "nvlink_MB_per_layer": rep.nvlink_bytes.mean() / 1e6,
                         "rdma_bytes_per_token": np.mean(rep.rdma_bytes / tokens),
                         "nvlink_bytes_per_token": np.mean(rep.nvlink_bytes / tokens),
                         "alltoall_us_per_1k_tokens": np.mean(rep.alltoall_seconds / tokens)
                         * 1e9})
    df = pd.DataFrame(rows)
    atomic_write_text(OUT / "tables" / "traffic.md", markdown(df, digits=3, index=False))
    for r in df.itertuples():
        key = f"tr_{r.policy.replace(' ', '_')}_{r.dispatch}"
        out[f"{key}_rdma"] = fmt(r.rdma_bytes_per_token, 0)
        out[f"{key}_nvlink"] = fmt(r.nvlink_bytes_per_token, 0)
        out[f"{key}_us"] = fmt(r.alltoall_us_per_1k_tokens, 1)
    front = pareto.sweep(load, topo, num_groups=groups, topk_groups=4, policy="local_first",
                         ilp_time_limit=None, top_k=8)
    plots.pareto_front(front, OUT / "figures" / "pareto.png",
                       title=f"balance vs RDMA, {path.stem}, 4x8 GPUs, local_first dispatch")
    atomic_write_text(OUT / "tables" / "pareto.md", markdown(front, digits=4, index=False))


# -------------------------------------------------------------------------- E4b
RELAX_GRID = (0.0, 0.25, 0.5, 0.75, 1.0)
GROUP_LIMITED = {"top_k": 8, "num_groups": 8, "topk_groups": 4}  # DeepSeek-V3 routing


def _served(p, load) -> tuple[float, float, float]:
    """(step max/mean GPU tokens under local_first, RDMA bytes per step, step max/mean under
    the even split) of placement ``p`` for ``load``: counts mode, sources spread evenly,
    group-limited co-occurrence model."""
    rep = traffic.simulate(p, load=load, policy="local_first", **GROUP_LIMITED)
    gt = rep.gpu_tokens
    even = p.gpu_load(load)
    return (float(gt.max(1).sum() / gt.mean(1).sum()), float(rep.rdma_bytes.sum()),
            float(even.max(1).sum() / even.mean(1).sum()))


def relaxed_study(files: list[Path], out: dict) -> None:
    """The `relaxed` policy against the group contract on every real file at 4x8/288, balance
    measured under the dispatch actually used (local_first), RDMA with group-limited routing;
    the Pareto figure with the new front; a token-level cross-check on one file."""
    topo, groups = SETTINGS["prefill"]
    points = [("deepseek (hierarchical)", "deepseek", {}), ("hierarchical", "hierarchical", {}),
              ("greedy", "greedy", {}), ("greedy_traffic 1", "greedy_traffic",
                                         {"rdma_weight": 1.0}),
              ("greedy_traffic 10", "greedy_traffic", {"rdma_weight": 10.0})]
    points += [(f"relaxed {r:g}", "relaxed", {"relax": r}) for r in RELAX_GRID]
    rows = []
    for f in tqdm(files, desc="E4b relaxed", unit="file"):
        load = traces.read(f).load()
        for label, name, opts in points:
            p = solvers.solve(name, load, topo, num_groups=groups, **opts)
            lf, rdma, even = _served(p, load)
            rows.append({"trace": f.stem, "policy": label, "solver": name,
                         "relax": opts.get("relax", np.nan), "lf_step_max_over_mean": lf,
                         "rdma_bytes": rdma, "even_step_max_over_mean": even,
                         "solve_seconds": p.meta["solver"]["seconds"]})
    df = pd.DataFrame(rows)
    hier = df[df["policy"] == "hierarchical"].set_index("trace")
    df["rdma_vs_hierarchical"] = df["rdma_bytes"] / df["trace"].map(hier["rdma_bytes"])
    df["on_front"] = False
    for _, part in df.groupby("trace", sort=False):
        df.loc[part.index, "on_front"] = pareto.front(part["rdma_bytes"],
                                                      part["lf_step_max_over_mean"])
    default = f"relaxed {solvers.options('relaxed')['relax']:g}"
    per_file = []
    for stem in hier.index:
        h = hier.loc[stem]
        r = df[(df["trace"] == stem) & (df["policy"] == default)].iloc[0]
        g = df[(df["trace"] == stem) & (df["policy"] == "greedy")].iloc[0]
        per_file.append({
            "trace": stem,
            "hierarchical_lf": h["lf_step_max_over_mean"],
            "relaxed_lf": r["lf_step_max_over_mean"],
            "relaxed_rdma_vs_hierarchical": r["rdma_vs_hierarchical"],
            "greedy_lf": g["lf_step_max_over_mean"],
            "greedy_rdma_vs_hierarchical": g["rdma_vs_hierarchical"],
            "dominates_hierarchical": bool(r["lf_step_max_over_mean"] < h["lf_step_max_over_mean"]
                                           and r["rdma_bytes"] <= h["rdma_bytes"]),
        })
    pf = pd.DataFrame(per_file)
    atomic_write_text(OUT / "tables" / "relaxed.md", markdown(pf, digits=4, index=False))
    atomic_write_text(OUT / "tables" / "pareto_local_first.md",
                      markdown(df.drop(columns=["solver"]), digits=4, index=False))
    out["rx_default"] = default.split()[1]
    out["rx_dominates"] = str(int(pf["dominates_hierarchical"].sum()))
    out["rx_files"] = str(len(pf))
    for key, col in (("hier_lf", "hierarchical_lf"), ("lf", "relaxed_lf"),
                     ("rdma", "relaxed_rdma_vs_hierarchical"), ("greedy_lf", "greedy_lf"),
                     ("greedy_rdma", "greedy_rdma_vs_hierarchical")):
        out[f"rx_{key}_min"] = fmt(pf[col].min())
        out[f"rx_{key}_max"] = fmt(pf[col].max())
    gt10 = df[df["policy"] == "greedy_traffic 10"]
    out["rx_gt10_lf_min"] = fmt(gt10["lf_step_max_over_mean"].min())
    out["rx_gt10_lf_max"] = fmt(gt10["lf_step_max_over_mean"].max())
    out["rx_gt10_rdma_min"] = fmt(gt10["rdma_vs_hierarchical"].min())
    out["rx_gt10_rdma_max"] = fmt(gt10["rdma_vs_hierarchical"].max())
    relax_rows = df[df["solver"] == "relaxed"]
    out["rx_seconds_max"] = fmt(relax_rows["solve_seconds"].max(), 1)
    zero = df[df["policy"] == "relaxed 0"].set_index("trace")
    out["rx_zero_lf_min"] = fmt(zero["lf_step_max_over_mean"].min())
    out["rx_zero_lf_max"] = fmt(zero["lf_step_max_over_mean"].max())
    out["rx_zero_rdma_equal"] = str(int((zero["rdma_bytes"] == hier["rdma_bytes"]).sum()))
    # monotone along the knob? (both axes, every file)
    mono = 0
    for _, part in relax_rows.groupby("trace", sort=False):
        part = part.sort_values("relax")
        mono += int((np.diff(part["lf_step_max_over_mean"]) <= 1e-12).all()
                    and (np.diff(part["rdma_bytes"]) <= 0).all())
    out["rx_monotone"] = str(mono)
    _relaxed_figure(df, files[0].stem, OUT / "figures" / "pareto_local_first.png")
    # token-level cross-check: DeepSeek-style group-limited tokens fitted to the real counts
    real = traces.read(files[0])
    tok = traces.synth.token_level(real, num_tokens=4096, seed=0)
    res = {}
    for name in ("hierarchical", "relaxed", "greedy"):
        p = solvers.solve(name, real, topo, num_groups=groups)
        rep = traffic.simulate_trace(p, tok, policy="local_first", source="tokens")
        gt = rep.gpu_tokens
        res[name] = (gt.max(1).sum() / gt.mean(1).sum(), rep.rdma_bytes.sum())
    out["rx_tok_tokens"] = "4,096"
    for name, (lf, rdma) in res.items():
        out[f"rx_tok_{name}_lf"] = fmt(lf)
        out[f"rx_tok_{name}_rdma"] = fmt(rdma / res["hierarchical"][1])


def _relaxed_figure(df: pd.DataFrame, ref: str, path: Path) -> None:
    """Left: every policy on ``ref``; right: the relaxed curve of every file, RDMA relative
    to hierarchical's."""
    plt = plots._plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    part = df[df["trace"] == ref]
    rel = part[part["solver"] == "relaxed"].sort_values("relax")
    ax1.plot(rel["rdma_bytes"] / 1e12, rel["lf_step_max_over_mean"], "-o", color="C3",
             label="relaxed (relax 0 .. 1)")
    for i, r in enumerate(rel.itertuples()):
        ax1.annotate(f"{r.relax:g}", (r.rdma_bytes / 1e12, r.lf_step_max_over_mean),
                     textcoords="offset points", xytext=(6, 6 if i % 2 else -12), fontsize=8)
    markers = {"deepseek": "s", "hierarchical": "D", "greedy": "^", "greedy_traffic": "v"}
    for r in part[part["solver"] != "relaxed"].itertuples():
        ax1.plot(r.rdma_bytes / 1e12, r.lf_step_max_over_mean, markers[r.solver], ms=8,
                 label=r.policy, mfc="none" if not r.on_front else None)
    ax1.set_xlabel("RDMA TB per step (58 layers; group-limited routing, local_first)")
    ax1.set_ylabel("step max/mean GPU tokens under local_first")
    ax1.set_title(f"{ref}, 4x8 GPUs, 288 slots", fontsize=10)
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    for i, (stem, p) in enumerate(df[df["solver"] == "relaxed"].groupby("trace", sort=False)):
        p = p.sort_values("relax")
        ax2.plot(p["rdma_vs_hierarchical"], p["lf_step_max_over_mean"], "-o", ms=4,
                 color=f"C{i}", label=stem)
        h = df[(df["trace"] == stem) & (df["solver"] == "hierarchical")].iloc[0]
        ax2.plot(1.0, h["lf_step_max_over_mean"], "D", color=f"C{i}", mfc="none", ms=8)
    ax2.set_xlabel("RDMA bytes / hierarchical's")
    ax2.set_ylabel("step max/mean GPU tokens under local_first")
    ax2.set_title("relaxed (dots, relax 0 .. 1) vs hierarchical (diamonds), six files",
                  fontsize=10)
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8)
    plots._save(fig, path)


# -------------------------------------------------------------------------- E3b
CHAIN_TOLERANCE = 0.005
CHAIN_DRIFT = (0.1, 0.25, 0.5, 1.0)


def chain_study(files: list[Path], out: dict) -> None:
    """Chain repair at two slots per GPU (18x8/288) on the real decode files: the live
    placement is greedy's for one file; the new load is that file's counts with 5% lognormal
    noise, or its traffic mix drifted a share alpha toward the other decode workload."""
    topo = SETTINGS["decode"][0]
    decode = [f for f in files if f.stem.startswith("decode")]
    loads = {f.stem: traces.read(f).load() for f in decode}
    names = list(loads)
    rows = []
    for i, name in enumerate(tqdm(names, desc="E3b chain repair", unit="file")):
        own = loads[name]
        other = loads[names[(i + 1) % len(names)]]
        total = own.sum(1, keepdims=True)
        cases = [("noise 0.05", own * np.random.default_rng(0).lognormal(0, 0.05, own.shape))]
        cases += [(f"drift {a:g}", ((1 - a) * own / total + a * other / other.sum(1, keepdims=True))
                   * total) for a in CHAIN_DRIFT]
        live = solvers.solve("greedy", own, topo)
        for label, new in cases:
            fresh = solvers.solve("greedy", new, topo, previous=live)
            n_fresh = fresh.meta["solver"]["replicas_moved_total"]
            fresh_max = fresh.gpu_load(new).max(1)
            over = live.gpu_load(new) > (fresh_max * (1 + CHAIN_TOLERANCE))[:, None]
            row = {"live": name, "new load": label, "fresh_moved": n_fresh,
                   "overloaded_gpus": int(over.sum()), "overloaded_share": float(over.mean())}
            for chains in (False, True):
                p = solvers.solve("repair", new, topo, previous=live, tolerance=CHAIN_TOLERANCE,
                                  chains=chains)
                tag = "chains" if chains else "single"
                n = p.meta["solver"]["replicas_moved_total"]
                row[f"{tag}_moved"] = n
                row[f"{tag}_share"] = n / n_fresh
                row[f"{tag}_worst_vs_fresh"] = float((p.gpu_load(new).max(1) / fresh_max).max())
                row[f"{tag}_seconds"] = p.meta["solver"]["seconds"]
            row["target"] = bool(row["chains_share"] <= 0.20
                                 and row["chains_worst_vs_fresh"] <= 1 + CHAIN_TOLERANCE + 1e-9)
            rows.append(row)
    df = pd.DataFrame(rows)
    atomic_write_text(OUT / "tables" / "chain_repair.md", markdown(df, digits=3, index=False))
    out["ch_files"] = ", ".join(f"`{n}`" for n in names)
    out["ch_met"] = str(int(df["target"].sum()))
    out["ch_cases"] = str(len(df))
    out["ch_worst"] = fmt(df["chains_worst_vs_fresh"].max())
    out["ch_seconds_max"] = fmt(df["chains_seconds"].max(), 1)
    for label, part in df.groupby("new load", sort=False):
        key = label.replace(" ", "_").replace(".", "")
        for tag in ("single", "chains"):
            out[f"ch_{key}_{tag}_min"] = fmt(part[f"{tag}_share"].min(), 3)
            out[f"ch_{key}_{tag}_max"] = fmt(part[f"{tag}_share"].max(), 3)
        out[f"ch_{key}_over"] = fmt(part["overloaded_share"].mean(), 2)
        out[f"ch_{key}_per_over"] = fmt(part["chains_moved"].sum() / part["overloaded_gpus"].sum(),
                                        1)
        out[f"ch_{key}_fresh_min"] = str(int(part["fresh_moved"].min()))
        out[f"ch_{key}_fresh_max"] = str(int(part["fresh_moved"].max()))


# --------------------------------------------------------------------------- E5
def executor_check(out: dict) -> None:
    from eplb.executor import MoELayer, ReferenceExecutor

    tok = traces.read(REPO / "traces" / "data" / "deepseek-v3-tokens.npz")
    topo = SETTINGS["prefill"][0]
    p = solvers.solve("greedy", tok.load(), topo)
    layer = MoELayer(tok.num_experts, 128, 64, tok.topk_ids.shape[2], seed=0,
                     dtype=np.float64)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((tok.topk_ids.shape[0], 128))
    ids = tok.topk_ids[:, 0, :].astype(np.int64)
    w = rng.random(ids.shape)
    ex = ReferenceExecutor(layer, p, policy="local_first", seed=0)
    y, stats = ex.forward(x, ids, w, tok.token_rank, layer_index=0)
    err = float(np.abs(y - layer.dense_forward(x, ids, w)).max())
    rep = traffic.simulate(p, topk_ids=tok.topk_ids, token_rank=tok.token_rank,
                           policy="local_first", hidden=128)
    out["exec_tokens"] = str(ids.shape[0])
    out["exec_err"] = f"{err:.1e}"
    same = (np.array_equal(stats.gpu_tokens, rep.gpu_tokens[0])
            and stats.rdma_bytes == rep.rdma_bytes[0] and stats.nvlink_bytes == rep.nvlink_bytes[0])
    out["exec_traffic_equal"] = "equal" if same else "NOT equal"


# --------------------------------------------------------------------------- E6
STUDY_SEEDS = (21, 22, 23)  # robust and lp were designed on seeds 11 and 12, never on these


def pct(x: float) -> str:
    """A share as a whole percentage (``-0%`` printed as ``0%``)."""
    return f"{100 * x:.0f}%".replace("-0%", "0%")


DRIFT_KINDS = ("drift", "bursty", "calibrated+drift")


def gap_rows(kind: str, seed: int, scored: dict, base: str, extra: str) -> list[dict]:
    """One row per run of ``scored`` (label -> (step max/mean, ``extra`` value)) with the share
    of the gap from run ``base`` to the ``"oracle"`` run that it closes."""
    top, best = scored[base][0], scored["oracle"][0]
    return [{"generator": kind, "seed": seed, "run": label, "step_max_over_mean": step,
             extra: value, "gap_closed": (top - step) / (top - best)}
            for label, (step, value) in scored.items()]


def gap_tables(rows: list[dict], table: str, extra: str, prefix: str, names: dict,
               out: dict) -> pd.DataFrame:
    """Writes ``tables/{table}.md`` (means over seeds per generator and run) and
    ``tables/{table}_per_seed.md``; puts each run's step, gap closed (mean, worst seed) into
    ``out`` as ``{prefix}_{generator}_{names[run]}_...``; returns the aggregate."""
    df = pd.DataFrame(rows)
    agg = df.groupby(["generator", "run"], sort=False).agg(
        step_max_over_mean=("step_max_over_mean", "mean"),
        gap_closed_mean=("gap_closed", "mean"), gap_closed_min=("gap_closed", "min"),
        **{extra: (extra, "mean")}, seeds=("seed", "count")).reset_index()
    atomic_write_text(OUT / "tables" / f"{table}.md", markdown(agg, digits=4, index=False))
    atomic_write_text(OUT / "tables" / f"{table}_per_seed.md",
                      markdown(df, digits=4, index=False))
    for r in agg.itertuples():
        key = f"{prefix}_{r.generator.replace('+', '_')}_{names[r.run]}"
        out[f"{key}_step"] = fmt(r.step_max_over_mean)
        out[f"{key}_closed"] = pct(r.gap_closed_mean)
        out[f"{key}_closed_min"] = pct(r.gap_closed_min)
    return agg


def drift_trace(kind: str, seed: int, windows: int, tokens: int = 16384):
    """The three drifting generators of the robust / lp studies (58 x 256, DeepSeek-V3 ids)."""
    cal = traces.read(REPO / "traces" / "data" / "deepseek-v3-calibrated.npz")
    meta = {"num_groups": 8, "top_k": 8}
    kw = dict(windows=windows, tokens=tokens, seed=seed)
    if kind == "drift":  # the replay section's generator
        return traces.synth.drift(cal.num_layers, cal.num_experts, rate=0.05, skew=(0.3, 0.8),
                                  layer_ids=cal.layer_ids, meta=meta, **kw)
    if kind == "bursty":
        return traces.synth.bursty(cal.num_layers, cal.num_experts, skew=(0.3, 0.8),
                                   layer_ids=cal.layer_ids, meta=meta, **kw)
    return traces.synth.calibrated(drift=0.05, **kw)


def expected_shares(kind: str, seed: int, windows: int) -> np.ndarray:
    """``[T, L, E]``: what each window's counts are drawn from (the same seed without sampling
    noise: 2**34 tokens), i.e. the best a forecaster could know after the window ends; for
    ``bursty`` the steady shares (bursts are independent of the past), for ``calibrated+drift``
    the drifting shares without the transient jitter."""
    if kind == "bursty":
        cal = traces.read(REPO / "traces" / "data" / "deepseek-v3-calibrated.npz")
        base = traces.synth.bursty(cal.num_layers, cal.num_experts, windows=1, tokens=2**34,
                                   burst_prob=0.0, skew=(0.3, 0.8), seed=seed).counts
        return np.repeat(base, windows, axis=0)
    if kind == "drift":
        return drift_trace(kind, seed, windows, tokens=2**34).counts
    return traces.synth.calibrated(windows=windows, tokens=2**34, seed=seed, jitter=0.0,
                                   drift=0.05).counts


def robust_study(out: dict, windows: int = 12) -> None:
    """Greedy every window vs ``robust`` (history 8), against the per-window oracle and the
    placement a forecaster with the generator's expected shares would make."""
    topo = SETTINGS["prefill"][0]
    runs = [("greedy", 1, {}), ("robust", 8, {}), ("robust", 8, {"tolerance": 0.002}),
            ("robust", 8, {"scenarios": "mean"}), ("robust", 8, {"scenarios": "worst"})]
    rows = []
    jobs = [(k, s) for k in DRIFT_KINDS for s in STUDY_SEEDS]
    for kind, seed in tqdm(jobs, desc="E6 robust", unit="trace"):
        trace = drift_trace(kind, seed, windows)
        first = solvers.solve("greedy", trace.load(0), topo, layer_ids=trace.layer_ids)
        scored = {}
        for solver, history, opts in runs:
            if opts.get("scenarios") and seed != STUDY_SEEDS[0]:
                continue  # the scenario packings are slower: first seed only
            frame = replay.replay(trace, topo, solver=solver, interval=1, history=history,
                                  initial=first, oracle=solver == "greedy",
                                  solver_options=opts)
            later = frame[frame["window"] >= 1]
            label = solver + "".join(f" {k}={v}" for k, v in opts.items())
            scored[label] = (later["step_max_over_mean"].mean(),
                             later["replicas_moved"].mean())
            if solver == "greedy":
                scored["oracle"] = (later["oracle_step_max_over_mean"].mean(), np.nan)
        truth = expected_shares(kind, seed, windows)
        steps = []
        for t in range(1, windows):
            p = solvers.solve("greedy", truth[t - 1], topo, layer_ids=trace.layer_ids)
            steps.append(metrics.summarize(metrics.score_windows(
                p, trace.counts[t : t + 1]))["step_max_over_mean"])
        scored["informed"] = (float(np.mean(steps)), np.nan)
        rows += gap_rows(kind, seed, scored, "greedy", "replicas_moved")
    names = {"greedy": "greedy", "oracle": "oracle", "informed": "informed", "robust": "robust",
             "robust tolerance=0.002": "robust_repair", "robust scenarios=mean": "robust_mean",
             "robust scenarios=worst": "robust_worst"}
    agg = gap_tables(rows, "robust", "replicas_moved", "rb", names, out)
    for r in agg.itertuples():
        key = f"rb_{r.generator.replace('+', '_')}_{names[r.run]}"
        out[f"{key}_moved"] = "" if np.isnan(r.replicas_moved) else f"{r.replicas_moved:,.0f}"
    out["rb_windows"] = str(windows)
    out["rb_seeds"] = ", ".join(map(str, STUDY_SEEDS))


# --------------------------------------------------------------------------- E7
def lp_study(out: dict, windows: int = 12, layers: int = 16, tokens: int = 4096) -> None:
    """Token-level replay, placements rebalanced every 4 windows from the last 4: ``even`` vs
    ``local_first`` vs ``lp`` dispatch, on ``greedy`` and on ``robust`` with the ring layout."""
    topo = SETTINGS["prefill"][0]
    runs = [("greedy", {}, "even"), ("greedy", {}, "local_first"), ("greedy", {}, "lp"),
            ("robust", {}, "lp"), ("robust", {"layout": "ring"}, "even"),
            ("robust", {"layout": "ring"}, "lp")]
    rows = []
    jobs = [(k, s) for k in DRIFT_KINDS for s in STUDY_SEEDS[:2]]
    for kind, seed in tqdm(jobs, desc="E7 lp dispatch", unit="trace"):
        target = drift_trace(kind, seed, windows)
        target = target.select(layers=target.layer_ids[:layers])
        counts, toks = traces.synth.token_windows(target, num_tokens=tokens, iterations=5,
                                                  seed=seed)
        scored = {}
        for solver, opts, policy in runs:
            frame = replay.replay(counts, topo, solver=solver, interval=4, history=4,
                                  policy=policy, tokens=toks, solver_options=opts,
                                  oracle=policy == "even" and solver == "greedy")
            later = frame[frame["window"] >= 4]
            label = f"{solver}{' ring' if opts else ''} + {policy}"
            scored[label] = (later["dispatch_step_max_over_mean"].mean(),
                             later["rdma_bytes"].mean() / 1e9)
            if "oracle_step_max_over_mean" in later:
                scored["oracle"] = (later["oracle_step_max_over_mean"].mean(), np.nan)
        rows += gap_rows(kind, seed, scored, "greedy + even", "rdma_GB_per_window")
    names = {"greedy + even": "even", "greedy + local_first": "local_first",
             "greedy + lp": "lp", "robust + lp": "robust_lp", "robust ring + even": "ring_even",
             "robust ring + lp": "ring_lp", "oracle": "oracle"}
    agg = gap_tables(rows, "lp_dispatch", "rdma_GB_per_window", "lp", names, out)
    for r in agg.itertuples():
        key = f"lp_{r.generator.replace('+', '_')}_{names[r.run]}"
        out[f"{key}_rdma"] = "" if np.isnan(r.rdma_GB_per_window) else \
            f"{r.rdma_GB_per_window:.3f}"
    frames = {}
    for label in ("greedy + even", "greedy + lp", "robust ring + lp", "oracle"):
        part = agg[agg["run"] == label]
        frames[label] = pd.DataFrame({"generator": np.arange(len(part)),
                                      "step_max_over_mean": part["step_max_over_mean"].values})
    plt = plots._plt()
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.2
    for i, (label, frame) in enumerate(frames.items()):
        ax.bar(frame["generator"] + (i - 1.5) * width, frame["step_max_over_mean"] - 1,
               width, bottom=1, label=label)
    ax.set_xticks(range(len(DRIFT_KINDS)), DRIFT_KINDS)
    ax.set_ylabel("step max/mean GPU picks")
    ax.set_title(f"token-level replay, rebalanced every 4 windows, {tokens} tokens per window, "
                 f"{layers} layers, 4x8 GPUs", fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    ax.legend()
    plots._save(fig, OUT / "figures" / "lp_dispatch.png")
    out["lp_windows"], out["lp_layers"], out["lp_tokens"] = str(windows), str(layers), str(tokens)
    out["lp_seeds"] = ", ".join(map(str, STUDY_SEEDS[:2]))


LEVER_TOKENS = {"decode": (4, 8, 16, 32, 64, 128, 256),
                "prefill": (256, 512, 1024, 2048, 4096, 8192, 16384)}
BLOG = {"waterfill": (1.48, 4.66), "lp": (0.84, 7.34)}  # LMSYS 2026-06-26, % total throughput


def lever_settings() -> list[tuple]:
    """(label, phase, topology, hardware, trace stem): DeepSeek's Day-6 units (H800, EP32
    prefill, EP144 decode) and SGLang's blog setting (2 nodes x 8 Hopper GPUs, 16 and 32
    redundant experts), for both phases."""
    from eplb.evaluation import serving
    day6 = serving.ClusterConfig.deepseek_day6()
    rows = [("Day-6", ph, day6.topology(ph), "h800",
             "prefill_in1024" if ph == "prefill" else "decode_in1000out1000")
            for ph in ("decode", "prefill")]
    for red in (16, 32):
        for ph in ("decode", "prefill"):
            rows.append((f"SGLang 2x8 +{red}", ph, Topology(2, 8, (256 + red) // 16), "h100",
                         "prefill_in1024" if ph == "prefill" else "decode_in1000out1000"))
    return rows


def levers() -> dict:
    """Lever name -> StepModel options against ``even`` + local shared expert, net of the
    configured overheads (lp: `LP_OVERHEAD_S` per MoE layer and micro-batch; Waterfill: its
    shipped shared-expert copies; duplication, issue 21 part 3: `DuplicateConfig`'s defaults,
    planner ~100 us per MoE layer and micro-batch and every copy's NVLink transfer on the
    critical path as in UltraEP, or prefetched under the previous layer with no planner)."""
    from eplb.dispatch import DISPATCH
    from eplb.evaluation.serving.config import DuplicateConfig
    out = {"lp": {"dispatch": "lp"}, "lp, no overhead": {"dispatch": "lp", "lp_overhead_s": 0.0},
           "waterfill": {"shared_expert": "waterfill"},
           "lp + waterfill": {"dispatch": "lp", "shared_expert": "waterfill"}}
    if "duplicate" in DISPATCH:
        out["duplication"] = {"dispatch": "duplicate"}
        out["duplication, prefetched, no planner"] = {
            "dispatch": "duplicate",
            "duplicate": DuplicateConfig(planner_s=0.0, overlap="previous_layer")}
    return out


def _break_even(tokens, gains) -> str:
    """Tokens per rank where the gain first turns positive (log-linear between grid points),
    '< min' if it pays at every point, 'none' if at none."""
    g = np.asarray(gains)
    if (g > 0).all():
        return f"< {tokens[0]}"
    if not (g > 0).any():
        return "none"
    i = int(np.argmax(g > 0))
    if i == 0:
        return f"< {tokens[0]}"
    x0, x1 = np.log2(tokens[i - 1]), np.log2(tokens[i])
    x = x0 + (x1 - x0) * (-g[i - 1]) / (g[i] - g[i - 1])
    return f"{2 ** x:.0f}"


def levers_study(files: list[Path], out: dict, steps: int = 4, seed: int = 0) -> None:
    """E8: step-time gain over even split of each dispatch-time lever vs tokens per rank, for
    decode and prefill, on the Day-6 units and SGLang's two-node setting; placements from the
    `deepseek` solver on the SGLang-published count file of the phase, each step's picks drawn
    from it (multinomial, ``top_k`` x tokens per layer), gain = mean even step seconds / mean
    lever step seconds - 1 (throughput at a fixed batch)."""
    from eplb.evaluation import serving
    from eplb.evaluation.serving import RankBatch, StepModel
    from eplb.evaluation.serving.config.hardware import LP_OVERHEAD_S, get_hardware
    m = serving.ClusterConfig.deepseek_day6().model_spec
    L = m.moe_layers
    by_stem = {f.stem: f for f in files}
    lev = levers()
    rows, ceilings = [], []
    jobs = lever_settings()
    for label, phase, topo, hw_name, stem in tqdm(jobs, desc="E8 levers", unit="setting"):
        load = traces.read(by_stem[stem]).load()
        prob = load / load.sum(1, keepdims=True)
        p = solvers.solve("deepseek", load, topo, num_groups=8)
        if label == "Day-6":  # where the placement's imbalance sits: GPUs vs whole nodes
            gpu_imb, node_imb = _gpu_and_node_imbalance(p, prob)
            out[f"lever_day6_{phase}_gpu_imb"] = f"{gpu_imb:.3f}"
            out[f"lever_day6_{phase}_node_imb"] = f"{node_imb:.3f}"
        hw = get_hardware(hw_name)
        models = {"even": StepModel(phase, topo, hardware=hw)}
        models.update({k: StepModel(phase, topo, hardware=hw, **v) for k, v in lev.items()})
        routed = {k: sm.prepare(p, load) for k, sm in models.items()}
        rng = np.random.default_rng(seed)
        G = topo.num_gpus
        for tok in LEVER_TOKENS[phase]:
            batch = RankBatch.uniform(phase, G, tokens=tok, context=1024 if phase == "prefill"
                                      else 2000)
            draws = [rng.multinomial(int(m.top_k * tok * G), prob).astype(float)
                     for _ in range(steps)]
            secs = {k: np.mean([sm.time_routed(batch, routed[k], d, picks=True).total_s
                                for d in draws]) for k, sm in models.items()}
            if label == "Day-6" and tok == LEVER_TOKENS[phase][-1]:  # GEMM time per layer
                st = models["even"].time_routed(batch, routed["even"], draws[0], picks=True)
                out[f"lever_day6_{phase}_moe_us"] = f"{1e6 * st.breakdown['moe'] / (2 * L):.0f}"
            # what any balancing can buy: the even step with its EP wait removed (perfect EP
            # balance), and the lp overhead per MoE layer and micro-batch at which lp breaks even
            ep_wait = np.mean([models["even"].time_routed(batch, routed["even"], d, picks=True)
                               .breakdown["ep_wait"] for d in draws])
            ceilings.append({"setting": label, "phase": phase, "tokens_per_rank": tok,
                             "ceiling_pct": 100 * (secs["even"] / (secs["even"] - ep_wait) - 1),
                             "lp_break_even_us": 1e6 * (secs["even"] - secs["lp, no overhead"])
                             / (L * models["lp"].micro_batches)})
            for k in lev:
                rows.append({"setting": label, "phase": phase, "tokens_per_rank": tok,
                             "lever": k, "gain_pct": 100 * (secs["even"] / secs[k] - 1)})
    df = pd.DataFrame(rows)
    atomic_write_text(OUT / "tables" / "levers.md", markdown(df.pivot_table(
        index=["setting", "phase", "tokens_per_rank"], columns="lever",
        values="gain_pct").reset_index(), digits=3, index=False))
    be = []
    for (label, phase, k), part in df.groupby(["setting", "phase", "lever"], sort=False):
        be.append({"setting": label, "phase": phase, "lever": k,
                   "break_even_tokens_per_rank": _break_even(
                       list(part["tokens_per_rank"]), list(part["gain_pct"])),
                   "best_gain_pct": part["gain_pct"].max()})
    atomic_write_text(OUT / "tables" / "levers_break_even.md",
                      markdown(pd.DataFrame(be), digits=3, index=False))
    plt = plots._plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    styles = {"Day-6": "-", "SGLang 2x8 +16": "--", "SGLang 2x8 +32": ":"}
    colors = dict(zip(lev, ["C0", "C1", "C2", "C3", "C4", "C5"], strict=False))
    for ax, phase in zip(axes, ("decode", "prefill"), strict=True):
        for (label, k), part in df[df["phase"] == phase].groupby(["setting", "lever"]):
            ax.plot(part["tokens_per_rank"], part["gain_pct"], styles[label],
                    color=colors[k], marker=".", label=f"{k}, {label}")
        ax.axhline(0, color="k", lw=0.5)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens per rank" if phase == "prefill" else "requests per rank")
        ax.set_ylabel("step-time gain over even split (%)")
        ax.set_title(phase, fontsize=10)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=6)
    plots._save(fig, OUT / "figures" / "levers.png")
    sg = df[df["setting"].str.startswith("SGLang")]
    for k, (lo, hi) in BLOG.items():
        g = sg[sg["lever"] == k]["gain_pct"]
        out[f"lever_{k}_sglang_min"], out[f"lever_{k}_sglang_max"] = f"{g.min():.2f}", \
            f"{g.max():.2f}"
        inside = ((g >= lo) & (g <= hi)).mean()
        out[f"lever_{k}_sglang_inside_pct"] = f"{100 * inside:.0f}"
    g = sg[sg["lever"] == "lp, no overhead"]["gain_pct"]
    out["lever_lp_free_sglang_min"], out["lever_lp_free_sglang_max"] = f"{g.min():.2f}", \
        f"{g.max():.2f}"
    cdf = pd.DataFrame(ceilings)
    atomic_write_text(OUT / "tables" / "levers_ceiling.md", markdown(cdf, digits=3, index=False))
    sgc = cdf[cdf["setting"].str.startswith("SGLang")]
    out["lever_ceiling_sglang_min"] = f"{sgc['ceiling_pct'].min():.2f}"
    out["lever_ceiling_sglang_max"] = f"{sgc['ceiling_pct'].max():.2f}"
    dec16 = sgc[(sgc["phase"] == "decode") & (sgc["tokens_per_rank"] >= 16)]
    out["lever_ceiling_sglang_decode16_max"] = f"{dec16['ceiling_pct'].max():.2f}"
    for ph in ("decode", "prefill"):
        part = sgc[sgc["phase"] == ph]
        out[f"lever_ceiling_sglang_{ph}_max"] = f"{part['ceiling_pct'].max():.2f}"
        top = part.loc[part["ceiling_pct"].idxmax()]
        out[f"lever_ceiling_sglang_{ph}_at"] = f"{int(top['tokens_per_rank'])}"
        out[f"lever_lp_break_even_us_sglang_{ph}_max"] = f"{part['lp_break_even_us'].max():.1f}"
        best = part.loc[part["lp_break_even_us"].idxmax()]
        out[f"lever_lp_break_even_sglang_{ph}_at"] = (
            f"{best['setting']}, {int(best['tokens_per_rank'])} per rank")
    ov = LP_OVERHEAD_S * m.moe_layers * 2
    out["lever_lp_overhead_ms"] = f"{1e3 * ov:.1f}"
    from eplb.evaluation.serving.config import DuplicateConfig
    dup = DuplicateConfig()
    out["lever_dup_planner_ms"] = f"{1e3 * dup.planner_s * m.moe_layers * 2:.1f}"
    out["lever_dup_copy_us"] = f"{1e6 * m.expert_params / (day6_nvlink_gbps() * 1e9):.0f}"
    out["lever_dup_experts"], out["lever_dup_hbm_gb"] = str(dup.experts), f"{dup.hbm_gb:g}"
    dup_rows = _duplicate_on_trivial(by_stem, lev, steps, seed)
    atomic_write_text(OUT / "tables" / "levers_duplicate_trivial.md", markdown(
        pd.DataFrame(dup_rows).pivot_table(index=["phase", "tokens_per_rank"], columns="lever",
                                           values="gain_pct").reset_index(),
        digits=3, index=False))
    for phase in ("decode", "prefill"):
        part = [r for r in dup_rows if r["phase"] == phase and r["lever"] == "duplication"]
        out[f"lever_dup_trivial_{phase}_max"] = f"{max(r['gain_pct'] for r in part):.2f}"
        out[f"lever_dup_trivial_{phase}_break_even"] = _break_even(
            [r["tokens_per_rank"] for r in part], [r["gain_pct"] for r in part])
    for phase in ("decode", "prefill"):
        d6 = df[(df["setting"] == "Day-6") & (df["phase"] == phase)]
        for k, key in (("duplication", "dup"), ("duplication, prefetched, no planner", "dupfree")):
            g = d6[d6["lever"] == k]["gain_pct"]
            out[f"lever_{key}_{phase}_min"] = f"{g.min():.2f}"
            out[f"lever_{key}_{phase}_max"] = f"{g.max():.2f}"
    out["lever_steps"] = str(steps)


def _gpu_and_node_imbalance(p, prob) -> tuple[float, float]:
    """Busiest GPU's and busiest node's mean GPU picks over the mean GPU's, even split of the
    expected load ``prob: float[L, E]`` through ``p``, averaged over layers."""
    from eplb.dispatch import get
    rt = get("even").routing(p, 8, 4)
    slot = np.take_along_axis(prob, rt.expert, 1) * rt.share
    topo = p.topology
    g = slot.reshape(slot.shape[0], topo.num_gpus, -1).sum(-1)
    n = g.reshape(g.shape[0], topo.num_nodes, -1).mean(-1)
    return float((g.max(1) / g.mean(1)).mean()), float((n.max(1) / g.mean(1)).mean())


def _duplicate_on_trivial(by_stem: dict, lev: dict, steps: int, seed: int) -> list[dict]:
    """E8b: duplication's gain over even split on the Day-6 units with the trivial placement
    (slot p holds expert p mod E: no EPLB, so the imbalance sits inside nodes too), drawn as
    `levers_study` draws its steps."""
    from eplb.evaluation.serving import RankBatch, StepModel
    from eplb.evaluation.serving.config.hardware import get_hardware
    from eplb.evaluation.serving.config.model import deepseek_v3
    from eplb.evaluation.serving.simulator.planner import trivial_placement
    rows = []
    for _, phase, topo, hw_name, stem in lever_settings()[:2]:
        load = traces.read(by_stem[stem]).load()
        prob = load / load.sum(1, keepdims=True)
        p = trivial_placement(deepseek_v3, topo)
        hw = get_hardware(hw_name)
        keys = [k for k in lev if k.startswith("duplication")]
        models = {"even": StepModel(phase, topo, hardware=hw)}
        models.update({k: StepModel(phase, topo, hardware=hw, **lev[k]) for k in keys})
        routed = {k: sm.prepare(p, load) for k, sm in models.items()}
        rng = np.random.default_rng(seed)
        G = topo.num_gpus
        for tok in LEVER_TOKENS[phase]:
            batch = RankBatch.uniform(phase, G, tokens=tok, context=1024 if phase == "prefill"
                                      else 2000)
            draws = [rng.multinomial(int(deepseek_v3.top_k * tok * G), prob).astype(float)
                     for _ in range(steps)]
            secs = {k: np.mean([sm.time_routed(batch, routed[k], d, picks=True).total_s
                                for d in draws]) for k, sm in models.items()}
            rows += [{"phase": phase, "tokens_per_rank": tok, "lever": k,
                      "gain_pct": 100 * (secs["even"] / secs[k] - 1)} for k in keys]
    return rows


def day6_nvlink_gbps() -> float:
    """The Day-6 units' effective NVLink GB/s (the copies' bandwidth in the step-time model)."""
    from eplb.evaluation import serving
    return float(serving.ClusterConfig.deepseek_day6().topology("prefill").nvlink_gbps)


def default_data() -> Path:
    return traces_dir() / "deepseek-v3-sglang"


def publish(staging: Path, out: Path) -> None:
    """Move a finished build from ``staging`` into ``out``, all or nothing (`publish_tree`):
    every table, figure, ``results.json`` and ``paper.md`` is renamed into place, or, on any
    failure or interrupt, none is (a build killed midway is undone by the next one). Tables and
    figures an earlier build wrote that this one no longer makes are removed; files no build
    wrote (listed in no manifest) are never touched."""
    missing = [name for name in PUBLISHED if not (staging / name).exists()]
    if missing:
        raise RuntimeError(f"build incomplete, {', '.join(missing)} missing; nothing published")
    extra = sorted(p.name for p in staging.iterdir() if p.name not in PUBLISHED)
    if extra:
        raise RuntimeError(f"build wrote {', '.join(extra)} outside {', '.join(PUBLISHED)}; "
                           "nothing published")
    publish_tree(staging, out)


def _clean_stale(parent: Path) -> None:
    """Remove staging folders of builds whose process is gone (killed with SIGKILL)."""
    for d in parent.glob(".paper-build-*"):
        pid = d.name[len(".paper-build-"):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                os.kill(int(pid), 0)
                continue
            except ProcessLookupError:
                shutil.rmtree(d, ignore_errors=True)
            except (PermissionError, OverflowError):
                continue


def _on_sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def staging_dir(out: Path):
    """A temporary folder beside ``out`` (same filesystem, so publishing is renames),
    removed on any failure or interrupt."""
    out.mkdir(parents=True, exist_ok=True)
    recover_publish(out)  # a build killed while publishing: its half-moved set is undone
    _clean_stale(out)
    path = Path(tempfile.mkdtemp(prefix=f".paper-build-{os.getpid()}-", dir=out))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_stages(stages, out: Path, render) -> dict:
    """Run ``stages`` ((label, function of ``results``)) into a staging folder, render, then
    publish into ``out``; returns the results. Nothing in ``out`` changes unless every stage
    and the rendering succeed."""
    global OUT
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    saved = OUT
    try:
        with staging_dir(out) as staging:
            OUT = staging
            (staging / "tables").mkdir()
            (staging / "figures").mkdir()
            results: dict[str, str] = {}
            start = time.perf_counter()
            for i, (label, stage) in enumerate(stages, 1):
                t0 = time.perf_counter()
                print(f"[{i}/{len(stages)}] {label} ...", file=sys.stderr, flush=True)
                stage(results)
                print(f"[{i}/{len(stages)}] {label} done in {time.perf_counter() - t0:.0f} s",
                      file=sys.stderr, flush=True)
            results["build_seconds"] = fmt(time.perf_counter() - start, 0)
            render(staging, results)
            publish(staging, out)
            return results
    finally:
        OUT = saved
        signal.signal(signal.SIGTERM, previous)


def render_paper(staging: Path, results: dict) -> None:
    atomic_write_text(staging / "results.json", json.dumps(results, indent=1, sort_keys=True)
                      + "\n")
    template = string.Template((HERE / "paper.in.md").read_text())
    atomic_write_text(staging / "paper.md", template.substitute(results))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=None,
                    help="folder of the DeepSeek-V3 SGLang count files (*.json); default "
                    "$EPLB_DATA/deepseek-v3-sglang or ../shared/traces/deepseek-v3-sglang")
    ap.add_argument("--out", type=Path, default=HERE,
                    help="folder to publish results.json, paper.md, tables/ and figures/ into "
                    "(default paper/)")
    ap.add_argument("--exact-layers", type=int, default=6,
                    help="layers solved by the exact ilp per setting (default 6)")
    args = ap.parse_args()
    data = args.data or default_data()
    files = sorted(data.glob("*.json"))
    if not files:
        sys.exit(f"no DeepSeek-V3 count files (*.json) under {data}; pass --data DIR or set "
                 "EPLB_DATA (see docs/data.md)")
    if args.out.exists() and not args.out.is_dir():
        sys.exit(f"--out {args.out} exists and is not a folder")
    files = sorted(files, key=lambda f: (not f.stem.startswith("prefill_in1024"), f.stem))
    stages = [
        ("E1 balance against the lower bound", lambda out: balance_table(files, out)),
        ("E1b certified optima (ilp)", lambda out: exact_study(files, out, args.exact_layers)),
        ("E2 redundancy sweep", lambda out: redundancy_sweep(files[0], out)),
        ("E3 replay", replay_study),
        ("E4 traffic and Pareto front", lambda out: traffic_study(files[0], out)),
        ("E4b relaxed group contract (issue 14)", lambda out: relaxed_study(files, out)),
        ("E3b chain repair at 2 slots per GPU (issue 14)", lambda out: chain_study(files, out)),
        ("E5 executor cross-check", executor_check),
        ("E6 drift-robust rebalancing", robust_study),
        ("E7 per-batch lp dispatch", lp_study),
        ("E8 dispatch-time levers (issue 21)", lambda out: levers_study(files, out)),
    ]
    try:
        results = run_stages(stages, args.out, lambda staging, out: render_paper(
            staging, {"num_files": str(len(files)), **out}))
    except KeyboardInterrupt:
        sys.exit(f"interrupted: nothing in {args.out} was changed")
    except EplbError as exc:  # e.g. another build publishing into --out
        sys.exit(f"error: {exc}")
    print(f"wrote {args.out / 'paper.md'} in {results['build_seconds']} s")


if __name__ == "__main__":
    main()
