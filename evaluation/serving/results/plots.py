"""Figures of a simulation (matplotlib, Agg, written atomically via `evaluation.plots`):
`latency_cdfs`, `throughput` (tokens/s per node over time, rebalances and faults marked),
`utilisation` (per-rank heatmaps), `breakdown` (mean step time per phase, by part)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from eplb.atomic import os_errors
from eplb.evaluation.plots import _plt, _save
from eplb.evaluation.serving.steptime import BREAKDOWN

__all__ = ["breakdown", "latency_cdfs", "throughput", "utilisation", "write_all"]


def latency_cdfs(result, path) -> Path:
    """TTFT and TPOT CDFs of the finished requests, the config's SLOs as dashed lines."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    slo = result.meta.get("slo", {})
    req = result.requests
    for ax, col, key, label in (
        (axes[0], "ttft_s", "ttft_s", "time to first token (s)"),
        (axes[1], "tpot_s", "tpot_s", "time per output token (s)"),
    ):
        x = np.sort(req[col].dropna().to_numpy())
        if x.size:
            ax.plot(x, np.arange(1, x.size + 1) / x.size, lw=1.5)
            ax.set_xscale("log" if x[0] > 0 and x[-1] / max(x[0], 1e-12) > 50 else "linear")
        if key in slo:
            ax.axvline(slo[key], color="red", ls="--", lw=1, label=f"SLO {slo[key]:g} s")
            ax.legend(fontsize=8)
        ax.set_xlabel(label)
        ax.set_ylabel("share of requests")
        ax.set_ylim(0, 1.01)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{result.meta.get('config_name', '')}: latency ({len(req):,} requests)")
    return _save(fig, path)


def _rate(steps, column: str, bin_s: float, end: float, nodes: int):
    edges = np.arange(0.0, end + bin_s, bin_s)
    if len(steps) == 0 or edges.size < 2:
        return edges[:-1], np.zeros(max(edges.size - 1, 0))
    tot, _ = np.histogram(steps["start_s"], bins=edges, weights=steps[column])
    return edges[:-1], tot / bin_s / max(nodes, 1)


def throughput(result, path) -> Path:
    """Prefill input and decode output tokens/s per node over time; rebalances (dotted) and
    faults (red) marked."""
    plt = _plt()
    end = max(float(result.meta.get("end_s", 0.0)), 1e-9)
    fig, axes = plt.subplots(2, 1, figsize=(10, 5.5), sharex=True)
    steps = result.steps
    for ax, phase, col, nodes, label in (
        (
            axes[0],
            "prefill",
            "input_tokens_done",
            result.meta.get("prefill_nodes", 1),
            "prefill input tok/s per node",
        ),
        (
            axes[1],
            "decode",
            "output_tokens",
            result.meta.get("decode_nodes", 1),
            "decode output tok/s per node",
        ),
    ):
        part = steps[steps["phase"] == phase] if len(steps) else steps
        # bins of at least a few steps, so a step's tokens (counted at its start) average out
        med = float(part["duration_s"].median()) if len(part) else 0.0
        bin_s = max(end / 200, 4 * med, 1.0)
        x, y = _rate(part, col, bin_s, end, nodes)
        ax.plot(x, y, lw=1.2, drawstyle="steps-post")
        ax.set_ylabel(label)
        ax.set_title(f"{bin_s:.3g} s bins", fontsize=8, loc="right")
        ax.grid(alpha=0.3)
        rb = result.rebalances
        moved = rb[(rb["phase"] == phase) & (rb["kind"] != "skipped")] if len(rb) else rb
        for t in moved["time_s"] if len(moved) else ():
            ax.axvline(t, color="grey", ls=":", lw=0.8)
        ax.set_xlim(0.0, end)
        fl = result.faults
        for t in fl[fl["phase"] == phase]["time_s"] if len(fl) else ():
            ax.axvline(t, color="red", lw=1.2)
    axes[1].set_xlabel(
        "simulated time (s); dotted: rebalances and emergency placements, red: faults"
    )
    fig.suptitle(f"{result.meta.get('config_name', '')}: throughput")
    return _save(fig, path)


def utilisation(result, path) -> Path:
    """One heatmap per unit: rank utilisation (0..1+) over time, up to the run's end (a step
    running past the end charges buckets after it; they are not drawn)."""
    plt = _plt()
    end = float(result.meta.get("end_s", np.inf))
    names = [n for n in result.utilisation if (result.utilisation[n].index < end).any()]
    if not names:
        fig, ax = plt.subplots(figsize=(6, 2))
        ax.text(0.5, 0.5, "no steps ran", ha="center")
        ax.axis("off")
        return _save(fig, path)
    fig, axes = plt.subplots(len(names), 1, figsize=(10, 2.6 * len(names)), squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        frame = result.utilisation[name]
        t = frame.index.to_numpy(dtype=float)
        step = float(np.diff(t).min()) if t.size > 1 else 1.0
        frame = frame[t < end]
        t = t[t < end]
        right = min(t[-1] + step, end)
        im = ax.imshow(
            frame.to_numpy().T,
            aspect="auto",
            origin="lower",
            interpolation="nearest",
            extent=(t[0], right, -0.5, frame.shape[1] - 0.5),
            vmin=0.0,
            cmap="viridis",
        )
        ax.set_xlim(t[0], right)
        ax.set_ylabel(f"{name}\nrank")
        fig.colorbar(im, ax=ax, label="utilisation")
    axes[-1, 0].set_xlabel(
        "simulated time (s); prefill: new tokens / token budget, decode: running / max running"
    )
    return _save(fig, path)


def breakdown(result, path) -> Path:
    """Stacked bars: the mean step's seconds per part, one bar per phase."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    steps = result.steps
    for ax, phase in zip(axes, ("prefill", "decode"), strict=True):
        part = steps[steps["phase"] == phase] if len(steps) else steps
        bottom = 0.0
        if len(part):
            w = part["duration_s"].to_numpy()
            for key in BREAKDOWN:
                v = float(np.average(part[f"{key}_s"], weights=w)) if w.sum() > 0 else 0.0
                ax.bar([phase], [v * 1e3], bottom=bottom * 1e3, label=key)
                bottom += v
        ax.set_ylabel("mean step time (ms), duration-weighted")
        ax.set_title(f"{phase} ({len(part):,} steps)")
        ax.grid(alpha=0.3, axis="y")
    axes[1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle(f"{result.meta.get('config_name', '')}: step-time breakdown")
    return _save(fig, path)


def write_all(result, directory: Path) -> list[Path]:
    """Every figure into ``directory`` (created); the paths written."""
    with os_errors(directory):
        directory.mkdir(parents=True, exist_ok=True)
    return [
        latency_cdfs(result, directory / "latency_cdf.png"),
        throughput(result, directory / "throughput.png"),
        utilisation(result, directory / "utilisation.png"),
        breakdown(result, directory / "breakdown.png"),
    ]
