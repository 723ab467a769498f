"""Figures written to files (matplotlib, Agg backend, imported lazily).

Every function takes the output ``path`` and returns it; the figure is written atomically. See
docs/evaluation.md, section "Plots".
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from eplb.args import as_int_array, check_opt_int
from eplb.atomic import atomic_write, atomic_write_bytes, check_output_path
from eplb.errors import InputError
from eplb.evaluation.metrics import check_gpu_load


def _plt():
    import matplotlib  # lazy: matplotlib is an optional extra (plot)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib is an optional extra (plot)

    return plt


def check_plot_path(path: str | os.PathLike, what: str = "plot") -> tuple[Path, str]:
    """``path`` (`eplb.atomic.check_output_path`) and its image format (its suffix, ``png``
    without one), refused before any drawing when matplotlib cannot write that format."""
    target = check_output_path(path, what)
    try:
        from matplotlib.backends.backend_agg import (  # lazy: matplotlib is an optional extra
            FigureCanvasAgg,
        )
    except ImportError:
        raise InputError(f"{what} needs matplotlib; install it with pip install "
                         "'eplb[plot]'") from None
    suffix = target.suffix.lstrip(".").lower() or "png"
    formats = FigureCanvasAgg.get_supported_filetypes()
    if suffix not in formats:  # matplotlib's own words
        raise InputError(f"{what} {target}: Format {suffix!r} is not supported (supported "
                         f"formats: {', '.join(sorted(formats))}); give an image file name "
                         "such as plot.png")
    return target, suffix


def _check_common(path, title) -> None:
    check_plot_path(path)
    if not isinstance(title, str):
        raise InputError(f"title must be a string, got {type(title).__name__}")


def _frames(frames, columns) -> dict:

    if not isinstance(frames, Mapping) or not frames:
        raise InputError("frames must be a non-empty {name: DataFrame} mapping")
    for name, frame in frames.items():
        if not isinstance(frame, pd.DataFrame) or any(c not in frame for c in columns):
            raise InputError(f"frames[{str(name)[:30]!r}] must be a DataFrame with columns "
                             f"{', '.join(columns)}")
    return dict(frames)


def _short(title: str, limit: int = 90) -> str:
    """One-line title: long paths cut to their file names, then to ``limit`` characters."""
    words = [Path(w).name if ("/" in w and len(w) > 20) else w for w in str(title).split(" ")]
    text = " ".join(words)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _save(fig, path) -> Path:
    plt = _plt()
    buf = io.BytesIO()
    suffix = check_plot_path(path)[1]
    fig.savefig(buf, format=suffix, dpi=120, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return Path(path)


def layer_balance(
    frames: Mapping[str, pd.DataFrame], path: str | os.PathLike, *, title: str = "",
    column: str = "max_over_mean",
) -> Path:
    """Line per solver: ``column`` of `evaluation.metrics.score` frames against model layer."""
    _check_common(path, title)
    if not isinstance(column, str):

        raise InputError(f"column must be a column name, got {str(column)[:30]}")
    frames = _frames(frames, ("layer", column))
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4))
    for name, frame in frames.items():
        ax.plot(frame["layer"], frame[column], marker=".", lw=1, label=name)
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("model layer")
    ax.set_ylabel("max / mean GPU load" if column == "max_over_mean" else column)
    ax.set_title(_short(title) or "per-layer balance")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def gpu_heatmap(
    loads: Mapping[str, np.ndarray],
    path: str | os.PathLike,
    *,
    layer_ids: ArrayLike | None = None,
    title: str = "",
    gpus_per_node: int | None = None,
) -> Path:
    """One panel per placement: ``gpu_load: float[L, G]`` divided by its layer mean.

    ``layer_ids: int[L]`` label the rows. ``gpus_per_node`` draws a line at every node
    boundary. Keep ``title`` short (file names, not paths): it is drawn above the panels, in one
    line.
    """

    _check_common(path, title)
    if not isinstance(loads, Mapping) or not loads:
        raise InputError("loads must be a non-empty {name: float[L, G]} mapping")
    loads = {str(k): check_gpu_load(v, f"loads[{str(k)[:20]!r}]") for k, v in loads.items()}
    if any(v.ndim != 2 for v in loads.values()):
        raise InputError("every load must be float[L, G]")
    gpus_per_node = check_opt_int("gpus_per_node", gpus_per_node, 1)
    if layer_ids is not None:
        layer_ids = as_int_array("layer_ids", layer_ids, ndim=1)
        if any(len(layer_ids) != v.shape[0] for v in loads.values()):
            raise InputError("layer_ids must have one id per row of the loads")
    plt = _plt()
    n = len(loads)
    fig, axes = plt.subplots(1, n, figsize=(3.2 * n + 1, 4.5), squeeze=False, sharey=True)
    vmax = max(float((g / np.maximum(g.mean(1, keepdims=True), 1e-12)).max()) for g in
               loads.values()) if loads else 1.0
    im = None
    for ax, (name, gpu) in zip(axes[0], loads.items(), strict=True):
        rel = gpu / np.maximum(gpu.mean(1, keepdims=True), 1e-12)
        im = ax.imshow(rel, aspect="auto", cmap="magma", vmin=0, vmax=max(vmax, 1.0),
                       interpolation="nearest")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("GPU" + (" (lines: node boundaries)" if gpus_per_node else ""))
        G = gpu.shape[1]
        if gpus_per_node and G > gpus_per_node:
            for edge in range(gpus_per_node, G, gpus_per_node):
                ax.axvline(edge - 0.5, color="cyan", lw=0.8)
    axes[0][0].set_ylabel("layer row")
    if layer_ids is not None and len(layer_ids):
        ticks = np.linspace(0, len(layer_ids) - 1, min(8, len(layer_ids))).astype(int)
        axes[0][0].set_yticks(ticks, [str(layer_ids[i]) for i in ticks])
        axes[0][0].set_ylabel("model layer")
    if im is not None:
        fig.colorbar(im, ax=axes[0].tolist(), label="GPU load / layer mean")
    fig.suptitle(_short(title) or "GPU load", fontsize=10)
    return _save(fig, path)


def replay_curve(frames: Mapping[str, pd.DataFrame] | pd.DataFrame, path: str | os.PathLike,
                 *, title: str = "") -> Path:
    """Step max/mean per window (one line per replay), rebalances dotted, bytes moved below."""
    _check_common(path, title)
    plt = _plt()
    if isinstance(frames, pd.DataFrame):
        frames = {frames.attrs.get("params", {}).get("solver", "replay"): frames}
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True,
                                  gridspec_kw={"height_ratios": [3, 1]})
    for name, df in frames.items():
        line = ax.plot(df["window"], df["step_max_over_mean"], lw=1.2, label=name)[0]
        if "oracle_step_max_over_mean" in df:
            ax.plot(df["window"], df["oracle_step_max_over_mean"], lw=0.8, ls="--",
                    color=line.get_color(), label=f"{name} oracle (peeks)")
        reb = df[df["rebalanced"]]
        ax2.bar(reb["window"], reb["bytes_moved"] / 1e9, width=0.8, alpha=0.6,
                color=line.get_color(), label=name)
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_ylabel("max / mean GPU load (step)")
    ax.set_title(_short(title) or "replay: placement live before each window")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax2.set_ylabel("GB moved")
    ax2.set_xlabel("window")
    ax2.grid(alpha=0.3)
    return _save(fig, path)


_X_AXES = {
    "rdma_bytes": (1e-9, "RDMA GB (traffic model, scored windows)"),
    "rdma_bytes_per_token": (1e-3, "RDMA KB per token, all layers (traffic model)"),
    "rdma_bytes_per_token_layer": (1.0, "RDMA bytes per token per layer (traffic model)"),
}


def pareto_front(frame: pd.DataFrame, path: str | os.PathLike, *, title: str = "",
                 x: str = "rdma_bytes", y: str = "step_max_over_mean") -> Path:
    """Scatter of ``y`` (balance) against ``x`` (RDMA bytes), one series per ``label``;
    sweeps (rows with ``rdma_weight``) joined by lines, each point labelled ``w=`` its
    ``rdma_weight``; the front outlined."""
    _check_common(path, title)
    plt = _plt()
    scale, xlabel = _X_AXES.get(x, (1.0, x))
    fig, ax = plt.subplots(figsize=(7, 5))
    # one colour per label (solver); with a ``trace`` column, one marker per trace
    traces_ = list(dict.fromkeys(frame["trace"])) if "trace" in frame else [None]
    markers = dict(zip(traces_, "osD^v<>pPX*h", strict=False))
    colours = {}
    for label, part in frame.groupby("label", sort=False):
        for tname, sub in (part.groupby("trace", sort=False) if "trace" in part
                           else [(None, part)]):
            sub = sub.sort_values(x)
            sweep = "rdma_weight" in sub and sub["rdma_weight"].notna().sum() > 1
            marker = markers.get(tname) or ("o" if sweep else "s")
            line = ax.plot(sub[x] * scale, sub[y], marker=marker, ms=5 if sweep else 8,
                           lw=1 if sweep else 0, color=colours.get(label),
                           label=label if label not in colours else None)[0]
            colours.setdefault(label, line.get_color())
            if sweep:  # each point of a sweep says its rdma_weight
                for xv, yv, w in zip(sub[x] * scale, sub[y], sub["rdma_weight"], strict=True):
                    if np.isfinite(w):
                        ax.annotate(f"w={w:g}", (xv, yv), textcoords="offset points",
                                    xytext=(4, 4), fontsize=7, color=line.get_color())
    if len(traces_) > 1:
        for tname in traces_:
            ax.plot([], [], ls="", marker=markers.get(tname, "o"), color="grey",
                     label=f"trace {tname}")
    if "on_front" in frame:
        front = frame[frame["on_front"]].sort_values(x)
        ax.plot(front[x] * scale, front[y], color="black", lw=0.8, ls="--", label="Pareto front")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("max / mean GPU load (step)")
    ax.set_title(_short(title) or "balance vs cross-node traffic")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def summary_bars(summary: pd.DataFrame, path: str | os.PathLike, *, title: str = "",
                 value: str = "step_max_over_mean") -> Path:
    """Grouped bars: ``value`` per trace (groups) and solver (bars) of a compare summary."""
    _check_common(path, title)
    plt = _plt()
    ok = summary[summary["status"] == "ok"] if "status" in summary else summary
    table = ok.pivot_table(index="trace", columns="solver", values=value, aggfunc="mean")
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(table) + 2), 4.5))
    width = 0.8 / max(len(table.columns), 1)
    xs = np.arange(len(table))
    for i, solver in enumerate(table.columns):
        ax.bar(xs + i * width, table[solver], width, label=solver)
    ax.set_xticks(xs + width * (len(table.columns) - 1) / 2, table.index, rotation=20,
                  ha="right", fontsize=8)
    low = float(np.nanmin(table.to_numpy())) if table.size else 1.0
    ax.set_ylim(min(1.0, low) - 0.01, None)
    ax.set_ylabel(value.replace("_", " "))
    ax.set_title(_short(title) or value)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)


def load_heatmap(load: ArrayLike, layer_ids: ArrayLike, path: str | os.PathLike, *,
                 title: str = "", what: str = "plot") -> Path:
    """Layer x expert heatmap of ``load: float[L, E]`` relative to each layer's mean (log
    colour scale), rows labelled with ``layer_ids: int[L]`` (what ``eplb trace info --plot``
    draws). ``what`` names the output in errors (e.g. a command-line flag)."""
    target, suffix = check_plot_path(path, what)  # before any drawing
    plt = _plt()
    from matplotlib.colors import LogNorm  # lazy: matplotlib is an optional extra (plot)

    load = np.asarray(load)
    mean = load.mean(axis=1, keepdims=True)
    rel = np.divide(load, mean, out=np.zeros_like(load), where=mean > 0)
    positive = rel[rel > 0]
    lo = max(float(positive.min()), 1e-2) if positive.size else 1e-2
    hi = max(float(rel.max()), lo * 10)
    L, E = load.shape
    fig, ax = plt.subplots(figsize=(min(14, 4 + E / 24), min(10, 2 + L / 8)))
    im = ax.imshow(np.maximum(rel, lo), aspect="auto", interpolation="nearest", cmap="magma",
                   norm=LogNorm(vmin=lo, vmax=hi))
    step = max(1, L // 20)
    ax.set_yticks(range(0, L, step))
    ax.set_yticklabels([str(i) for i in np.asarray(layer_ids)[::step]])
    ax.set_xlabel("logical expert")
    ax.set_ylabel("model layer")
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, label="load / layer mean")
    fig.tight_layout()
    try:
        with atomic_write(target, "wb") as fh:
            fig.savefig(fh, format=suffix, dpi=110)
    finally:
        plt.close(fig)
    return target
