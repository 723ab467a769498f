"""Balance metrics of a placement on a load, per layer over GPUs (and nodes).

balancedness = mean / max GPU load, max/mean, imbalance = (max - mean) / mean, and the ratio to
`solvers.analysis.bounds.lower_bound`; an idle layer counts as perfectly balanced. GPU loads are
``float64[..., L, G]``. Definitions: docs/evaluation.md, section "Balance: the four ratios".
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from eplb.args import as_int_array, check_bool, check_int, check_type
from eplb.errors import InputError
from eplb.evaluation.align import (
    align,
    check_load_shape,
    check_num_groups,
    check_placement,
    check_trace,
    with_layers,
)
from eplb.loads import MAX_COUNT, as_real_array, check_load
from eplb.placement import Placement
from eplb.solvers.analysis.bounds import lower_bound
from eplb.topology import Topology
from eplb.traces.model import Trace


def check_gpu_load(gpu_load: ArrayLike, name: str = "gpu_load") -> np.ndarray:
    """``gpu_load: float[..., G]`` as float64: finite, >= 0, at least one GPU."""
    arr = as_real_array(gpu_load, name)
    if arr.ndim < 1 or arr.shape[-1] == 0:
        raise InputError(f"{name} must be float[..., G] with at least one GPU, got shape "
                         f"{arr.shape}")
    if not np.isfinite(arr).all() or (arr < 0).any() or (arr > MAX_COUNT * 2**10).any():
        raise InputError(f"{name} must hold finite loads >= 0")
    return arr


def balancedness(gpu_load: ArrayLike) -> np.ndarray:
    """``float64[L]`` mean/max over GPUs of ``gpu_load: float[L, G]`` (1.0 for an idle layer)."""
    gpu_load = check_gpu_load(gpu_load)
    mx = gpu_load.max(axis=-1)
    mean = gpu_load.mean(axis=-1)
    return np.divide(mean, mx, out=np.ones_like(mx), where=mx > 0)


def max_over_mean(gpu_load: ArrayLike) -> np.ndarray:
    """``float64[L]`` max/mean over GPUs of ``gpu_load: float[L, G]`` (1.0 for an idle layer)."""
    gpu_load = check_gpu_load(gpu_load)
    mx = gpu_load.max(axis=-1)
    mean = gpu_load.mean(axis=-1)
    return np.divide(mx, mean, out=np.ones_like(mx), where=mean > 0)


def imbalance(gpu_load: ArrayLike) -> np.ndarray:
    """``float64[...]`` (max - mean) / mean over the last axis of ``gpu_load: float[..., G]``
    (0.0 for an idle layer)."""
    return max_over_mean(gpu_load) - 1.0


def gpu_matrix(placement: Placement) -> np.ndarray:
    """``float64[L, E, G]``: fraction of expert ``e``'s tokens that GPU ``g`` receives.

    Honours ``replica_share`` (even split without shares); rows sum to 1 over ``G``.
    """
    check_placement(placement)
    topo = placement.topology
    L, P = placement.phy2log.shape
    E, G = placement.num_experts, topo.num_gpus
    held = placement.phy2log >= 0  # empty slots (-1, failed GPUs) hold nothing: -1 is no index
    key = (np.arange(L)[:, None] * E + placement.phy2log) * G + topo.gpu_of_slot[None, :]
    out = np.bincount(key[held], weights=placement.share[held], minlength=L * E * G)
    return out.reshape(L, E, G)


def gpu_loads(placement: Placement, counts: ArrayLike, *, chunk: int = 64) -> np.ndarray:
    """``float64[..., L, G]`` GPU loads of ``counts: float[..., L, E]`` (e.g. ``[T, L, E]``).

    One gather of every slot's expert count per block of ``chunk`` windows, times the shares,
    summed over each GPU's slots.
    """
    check_placement(placement)
    counts = as_real_array(counts, "counts")
    if counts.ndim < 2:
        raise InputError(f"counts must be float[..., L, E], got shape {counts.shape}")
    check_load(counts.reshape(-1, counts.shape[-1]) if counts.size else counts, name="counts")
    check_load_shape(placement, counts, "counts")
    chunk = check_int("chunk", chunk, 1)
    topo = placement.topology
    L, E = placement.num_layers, placement.num_experts
    G, S = topo.num_gpus, topo.slots_per_gpu
    lead = counts.shape[:-2]
    flat = counts.reshape(-1, L * E)  # [T, L*E]
    # [L*P] into L*E; an empty slot (-1) reads its layer's expert 0 and has share 0
    cols = (np.arange(L)[:, None] * E + np.maximum(placement.phy2log, 0)).ravel()
    share = np.where(placement.phy2log >= 0, placement.share, 0.0)  # [L, P]
    out = np.empty((flat.shape[0], L, G))
    for start in range(0, flat.shape[0], chunk):
        slots = flat[start : start + chunk][:, cols].reshape(-1, L, G * S) * share
        out[start : start + chunk] = slots.reshape(-1, L, G, S).sum(-1)
    return out.reshape(*lead, L, G)


def layer_bound(
    load: ArrayLike, topology: Topology, num_groups: int | None = None
) -> np.ndarray:
    """``float64[L]`` lower bound on each layer's max GPU load for ``load: float[L, E]``
    (`solvers.analysis.bounds.lower_bound`)."""
    load = check_load(load)
    check_type("topology", topology, Topology, "an eplb.Topology")
    num_groups = check_num_groups(num_groups, load.shape[1])
    return _layer_bound(load, topology, num_groups)


def _layer_bound(load: np.ndarray, topology: Topology, num_groups: int | None) -> np.ndarray:
    """`layer_bound` on checked arguments."""
    return np.asarray(lower_bound(load, topology, num_groups=num_groups), np.float64)


def _ratio(num: np.ndarray, den: np.ndarray, idle: float) -> np.ndarray:
    return np.divide(num, den, out=np.full(np.shape(num), idle, dtype=np.float64), where=den > 0)


def _load_columns(gpu: np.ndarray, topology: Topology) -> dict[str, np.ndarray]:
    """Per-row columns from ``gpu: float[..., G]``; means and minima run over the GPUs (and
    nodes) that have not failed (``topology.failed_gpus``)."""
    node = gpu.reshape(*gpu.shape[:-1], topology.num_nodes, topology.gpus_per_node).sum(-1)
    if topology.failed_gpus:
        alive = np.ones(topology.num_gpus, dtype=bool)
        alive[list(topology.failed_gpus)] = False
        node = node[..., alive.reshape(topology.num_nodes, -1).any(-1)]
        gpu = gpu[..., alive]
    mx, mean = gpu.max(-1), gpu.mean(-1)
    nmx, nmean = node.max(-1), node.mean(-1)
    return {
        "tokens": gpu.sum(-1),
        "gpu_max": mx,
        "gpu_mean": mean,
        "gpu_min": gpu.min(-1),
        "balancedness": _ratio(mean, mx, 1.0),
        "max_over_mean": _ratio(mx, mean, 1.0),
        "imbalance": _ratio(mx, mean, 1.0) - 1.0,
        "node_max_over_mean": _ratio(nmx, nmean, 1.0),
        "node_balancedness": _ratio(nmean, nmx, 1.0),
    }


def score(
    placement: Placement,
    load: ArrayLike | Trace,
    *,
    num_groups: int | None = None,
    bound: bool | ArrayLike = True,
) -> pd.DataFrame:
    """One row per layer of ``placement`` on ``load: float[L, E]`` (tokens per expert) or on a
    `traces.Trace` (its summed load, scored on the trace's layers: the ``layer`` column holds
    the trace's model layer ids; a placement still numbered ``0..L-1`` is labelled with them).

    Columns: ``layer`` (model layer id), ``tokens``, ``gpu_max``/``gpu_mean``/``gpu_min``
    (tokens per GPU), ``balancedness``, ``max_over_mean``, ``imbalance``, ``lower_bound``
    and ``max_over_bound`` (NaN without `solvers.analysis.bounds`, or with ``bound=False``;
    ``bound`` may also be a precomputed ``float[L]`` bound),
    ``node_max_over_mean``, ``node_balancedness``, ``replicas_max`` (most replicas of one
    expert), ``replicas_mean`` (``P / E``), ``experts_replicated`` (experts with >= 2
    replicas), ``hottest_replicas`` (replicas of the layer's heaviest expert).
    """
    check_placement(placement)

    if isinstance(load, Trace):
        default = np.array_equal(placement.layer_ids, np.arange(placement.num_layers))
        if default and placement.num_layers == load.num_layers and placement.num_experts == \
                load.num_experts:
            placement = with_layers(placement, load.layer_ids)
        placement = align(placement, load)
        load = load.load()
    load = check_load(load)
    check_load_shape(placement, load)
    num_groups = check_num_groups(num_groups, placement.num_experts)
    if isinstance(bound, (bool, np.bool_)):
        bound = check_bool("bound", bound)
        lb = (_layer_bound(load, placement.topology, num_groups) if bound
              else np.full(len(load), np.nan))
    else:
        lb = as_real_array(bound, "bound")
        if lb.shape != (load.shape[0],):
            raise InputError(f"bound must be True, False or float[{load.shape[0]}], got shape "
                             f"{lb.shape}")
    return _score(placement, load, lb)


def _score(placement: Placement, load: np.ndarray, lb: np.ndarray) -> pd.DataFrame:
    """`score` on checked arguments: ``load: float64[L, E]`` matching ``placement``,
    ``lb: float64[L]`` the bound column (NaN: none)."""
    topo = placement.topology
    slots = np.take_along_axis(load, np.maximum(placement.phy2log, 0), axis=1) * placement.share
    gpu = slots.reshape(len(load), topo.num_gpus, topo.slots_per_gpu).sum(-1)  # [L, G]
    cols = {"layer": placement.layer_ids.copy(), **_load_columns(gpu, topo)}
    cols["lower_bound"] = lb
    cols["max_over_bound"] = np.divide(
        cols["gpu_max"], lb, out=np.full_like(lb, np.nan), where=np.isfinite(lb) & (lb > 0)
    )
    idle = np.isfinite(lb) & (lb <= 0) & (cols["gpu_max"] <= 0)
    cols["max_over_bound"][idle] = 1.0
    cnt = placement.logcnt
    cols["replicas_max"] = cnt.max(-1)
    cols["replicas_mean"] = cnt.mean(-1)
    cols["experts_replicated"] = (cnt > 1).sum(-1)
    cols["hottest_replicas"] = np.take_along_axis(cnt, load.argmax(-1)[:, None], 1)[:, 0]
    return pd.DataFrame(cols)


def score_windows(
    placement: Placement, counts: ArrayLike, *, windows: ArrayLike | None = None, chunk: int = 64
) -> pd.DataFrame:
    """Per (window, layer) rows for ``counts: float[T, L, E]`` on one placement (vectorised).

    Columns: ``window`` (the given ``windows`` labels, default ``0..T-1``), ``layer`` and the
    load columns of `score` (``tokens`` ... ``node_balancedness``). No lower bound here: it is
    per-layer work; use `score` on the windows that matter.
    """
    check_placement(placement)
    counts = check_load(counts, name="counts", ndim=3)
    check_load_shape(placement, counts, "counts")
    topo = placement.topology
    T, L = counts.shape[:2]
    gpu = gpu_loads(placement, counts, chunk=chunk)  # [T, L, G]
    cols = {k: v.ravel() for k, v in _load_columns(gpu, topo).items()}
    labels = np.arange(T) if windows is None else as_int_array("windows", windows)
    if labels.shape != (T,):
        raise InputError(f"windows must label the {T} windows (int[{T}]), got shape "
                         f"{labels.shape}")
    frame = {"window": np.repeat(labels, L), "layer": np.tile(placement.layer_ids, T)}
    return pd.DataFrame({**frame, **cols})


def score_trace(placement: Placement, trace: Trace, *, windows: Any = None) -> pd.DataFrame:
    """`score_windows` of ``trace.counts`` (or the chosen ``windows``) after `align`."""
    check_trace(trace)
    placement = align(placement, trace)
    idx = trace.window_index(windows)
    return score_windows(placement, trace.counts[idx], windows=idx)


def summarize(frame: pd.DataFrame, by: str | list[str] | None = None) -> pd.Series | pd.DataFrame:
    """Aggregate a `score` / `score_windows` frame over layers (per ``by`` group if given).

    ``layers``, ``step_max_over_mean`` (sum of per-layer max over sum of per-layer mean),
    ``balancedness_mean``/``_min``, ``max_over_mean_mean``/``_worst``, ``imbalance_mean``,
    ``node_max_over_mean_mean``, and when present ``max_over_bound_mean``/``_worst``.
    """
    check_type("frame", frame, pd.DataFrame, "a pandas DataFrame (from score)")
    missing = [c for c in ("gpu_max", "gpu_mean", "balancedness", "max_over_mean", "imbalance",
                           "node_max_over_mean") if c not in frame]
    if missing:
        raise InputError(f"frame lacks columns {', '.join(missing)}; pass a score() frame")
    if by is not None:
        keys = [by] if isinstance(by, str) else by
        if not isinstance(keys, (list, tuple)) or not keys or not all(
                isinstance(k, str) and k in frame for k in keys):
            raise InputError(f"by must be a column name or a list of them, got {str(by)[:40]}")
        parts = {key: summarize(group) for key, group in frame.groupby(by, sort=True)}
        out = pd.DataFrame(parts).T
        out.index.names = [by] if isinstance(by, str) else by
        return out
    out = {
        "layers": float(len(frame)),
        "step_max_over_mean": float(
            _ratio(np.array(frame["gpu_max"].sum()), np.array(frame["gpu_mean"].sum()), 1.0)
        ),
        "balancedness_mean": float(frame["balancedness"].mean()),
        "balancedness_min": float(frame["balancedness"].min()),
        "max_over_mean_mean": float(frame["max_over_mean"].mean()),
        "max_over_mean_worst": float(frame["max_over_mean"].max()),
        "imbalance_mean": float(frame["imbalance"].mean()),
        "node_max_over_mean_mean": float(frame["node_max_over_mean"].mean()),
    }
    if "max_over_bound" in frame:
        out["max_over_bound_mean"] = float(frame["max_over_bound"].mean())
        out["max_over_bound_worst"] = float(frame["max_over_bound"].max())
    return pd.Series(out)
