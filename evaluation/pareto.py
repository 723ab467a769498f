"""Balance against cross-node traffic: sweep the traffic weight of traffic-aware solvers.

`sweep` runs ``greedy``/``ilp`` over ``rdma_weight`` plus fixed baselines, measuring every
placement with the same metrics and traffic model; `front` marks the non-dominated points. See
docs/evaluation.md, section "Balance against cross-node traffic".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from eplb import solvers
from eplb.args import check_bool, check_mapping, check_number, check_opt_number, check_seed
from eplb.dispatch import check_policy
from eplb.errors import EplbError, InputError
from eplb.evaluation.align import check_num_groups, check_trace
from eplb.evaluation.metrics import _score, summarize
from eplb.evaluation.traffic import _simulate, check_sizes, counts_source
from eplb.loads import as_real_array, check_load
from eplb.topology import Topology
from eplb.traces.model import Trace

if TYPE_CHECKING:  # annotations only: compare imports the runners and plots
    from eplb.evaluation.compare import CompareSpec

WEIGHTS = (0.0, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)


def front(x: ArrayLike, y: ArrayLike) -> np.ndarray:
    """``bool[n]``: points of ``x, y: float[n]`` not dominated (another point <= on both and <
    on one)."""

    x, y = as_real_array(x, "x"), as_real_array(y, "y")
    if x.ndim != 1 or x.shape != y.shape:
        raise InputError(f"x and y must be 1-D arrays of the same length, got shapes {x.shape} "
                         f"and {y.shape}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise InputError("x and y must be finite")
    le = (x[None, :] <= x[:, None]) & (y[None, :] <= y[:, None])
    lt = (x[None, :] < x[:, None]) | (y[None, :] < y[:, None])
    return ~(le & lt).any(axis=1)


def _measure(placement, load, counts, policy, sizes) -> dict[str, float]:
    """Balance and modelled traffic of one placement; ``counts`` = `traffic.counts_source`'s
    checked source, ``sizes`` the checked byte sizes (the sweep checks its inputs once)."""
    s = summarize(_score(placement, load, np.full(len(load), np.nan)))
    src, label, top_k, groups = counts
    t = _simulate(placement, ids=None, rank=None, src=src, label=label, policy=policy,
                  top_k=top_k, groups=groups, seed=0, **sizes).summary()
    return {"step_max_over_mean": float(s["step_max_over_mean"]),
            "max_over_mean_worst": float(s["max_over_mean_worst"]),
            "rdma_bytes": t["rdma_bytes"], "nvlink_bytes": t["nvlink_bytes"],
            "alltoall_seconds": t["alltoall_seconds"]}


def sweep(
    load: ArrayLike,
    topology: Topology,
    *,
    weights: Sequence[float] = WEIGHTS,
    num_groups: int | None = None,
    topk_groups: int | None = None,
    source_counts: ArrayLike | None = None,
    policy: str = "local_first",
    ilp_time_limit: float | None = 1.0,
    ilp_weights: Sequence[float] | None = None,
    ilp_options: dict[str, Any] | None = None,
    seed: int = 0,
    progress: bool = False,
    **traffic: Any,
) -> pd.DataFrame:
    """Pareto sweep on ``load: float[L, E]`` (optionally ``source_counts: float[L, G_src, E]``
    for the traffic model; ``num_groups`` + ``topk_groups`` select its group-limited
    co-occurrence model, which is what lets group-aware placements show their RDMA savings).
    ``weights``: ``rdma_weight`` values for ``greedy``, and for ``ilp`` unless ``ilp_weights``
    is given; ``ilp_time_limit`` is the ilp's limit (its ``time_limit``, per layer; ``None`` or
    0 skips ilp), ``ilp_options`` more ilp options (e.g. ``workers``). Solvers that are not
    registered are skipped.

    Returns one row per placement: ``label``, ``solver``, ``rdma_weight`` (NaN for baselines),
    ``step_max_over_mean``, ``max_over_mean_worst``, ``rdma_bytes``, ``nvlink_bytes``,
    ``alltoall_seconds``, ``solve_seconds``, ``status``, ``on_front``.
    """

    check_policy(policy)
    load = check_load(load)
    if not isinstance(topology, Topology):
        raise InputError(f"topology must be an eplb.Topology, got {type(topology).__name__}")
    num_groups = check_num_groups(num_groups, load.shape[1])
    seed = check_seed("seed", seed)
    progress = check_bool("progress", progress)
    ilp_options = check_mapping("ilp_options", ilp_options)
    ilp_time_limit = check_opt_number("ilp_time_limit", ilp_time_limit, 0, 86400)
    if isinstance(weights, (str, bytes)) or not hasattr(weights, "__iter__"):
        raise InputError(f"weights must be a list of numbers, got {str(weights)[:40]}")
    ws = [check_number("weights[]", w, 0, 1e6) for w in weights]
    if ilp_weights is not None:
        if isinstance(ilp_weights, (str, bytes)) or not hasattr(ilp_weights, "__iter__"):
            raise InputError(f"ilp_weights must be a list of numbers, got {str(ilp_weights)[:40]}")
        ilp_weights = [check_number("ilp_weights[]", w, 0, 1e6) for w in ilp_weights]
    have = set(solvers.available())
    unknown = sorted(set(traffic) - {"hidden", "dispatch_bytes", "combine_bytes", "top_k"})
    if unknown:
        raise InputError(f"sweep does not take {', '.join(unknown)}; traffic options are "
                         "hidden, dispatch_bytes, combine_bytes and top_k")
    sizes = {k: traffic.get(k, d) for k, d in
             (("hidden", 7168), ("dispatch_bytes", 1), ("combine_bytes", 2))}
    check_sizes(**sizes)
    L, E = load.shape
    counts = counts_source(L, E, topology.num_gpus, source_counts=source_counts,
                           load=None if source_counts is not None else load,
                           top_k=traffic.get("top_k"), num_groups=num_groups,
                           topk_groups=topk_groups)
    runs: list[tuple[str, str, float | None, dict[str, Any]]] = []
    if num_groups is not None and num_groups % topology.num_nodes == 0:
        runs.append(("deepseek hierarchical", "deepseek", None, {"num_groups": num_groups}))
    runs.append(("deepseek global", "deepseek", None, {"num_groups": None}))
    if "hierarchical" in have:
        runs.append(("hierarchical", "hierarchical", None, {"num_groups": num_groups}))
    if "greedy" in have:
        runs += [("greedy", "greedy", w, {"num_groups": num_groups, "rdma_weight": w})
                 for w in ws]
    if "ilp" in have and ilp_time_limit:
        iws = ws if ilp_weights is None else [float(w) for w in ilp_weights]
        runs += [("ilp", "ilp", w, {"num_groups": num_groups, "rdma_weight": w,
                                    "time_limit": ilp_time_limit, **(ilp_options or {})})
                 for w in iws]
    if progress:
        from tqdm.auto import tqdm  # lazy: tqdm only when progress is shown

        runs = tqdm(runs, desc="pareto", unit="solve")
    rows = []
    for label, name, w, kw in runs:
        row: dict[str, Any] = {"label": label, "solver": name,
                               "rdma_weight": np.nan if w is None else w}
        try:
            placement = solvers.solve(name, load, topology, seed=seed, **kw)
        except EplbError as exc:  # e.g. a policy that cannot place this load: a failed row
            rows.append({**row, "status": f"{type(exc).__name__}: {exc}"})
            continue
        row["solve_seconds"] = float(placement.meta["solver"]["seconds"])
        row.update(_measure(placement, load, counts, policy, sizes))
        rows.append({**row, "status": "ok"})
    out = pd.DataFrame(rows)
    out["on_front"] = False
    ok = out["status"] == "ok"
    if ok.any():
        out.loc[ok, "on_front"] = front(out.loc[ok, "rdma_bytes"],
                                        out.loc[ok, "step_max_over_mean"])
    out.attrs["params"] = {"topology": str(topology), "policy": policy,
                           "num_groups": num_groups, "weights": ws}
    return out


def sweep_traces(
    traces: Mapping[str, Trace],
    spec: CompareSpec,
    *,
    weights: Sequence[float] | None = None,
    ilp_time_limit: float | None = 10.0,
    progress: bool = False,
) -> list[pd.DataFrame]:
    """`sweep` for every trace (``{name: Trace}``) on every topology of ``spec`` (a
    `compare.CompareSpec`, checked when built, as `compare` takes it): one frame per (trace,
    topology), in that order, its rows labelled with ``trace`` and ``topology`` (the spec's
    text); ``pd.concat`` them for one table. The spec gives the traffic model's dispatch
    ``policy`` (`eplb compare --pareto` passes ``--pareto-dispatch``, default ``local_first``),
    ``seed``, the bandwidths (GB/s per GPU), ``traffic`` (``hidden``, ``dispatch_bytes``,
    ``combine_bytes``, ``top_k``) and the groups: per trace ``num_groups`` and ``topk_groups``
    default to its ``meta``, its ``top_k`` (if recorded and not in ``traffic``) goes to the
    traffic model, and its summed ``source_counts`` are used when their ranks divide the
    topology's GPUs. The sweep's solvers are its own (in sample): the spec's ``solvers``,
    ``solver_options``, ``holdout`` and ``time_limit`` are `compare`'s. ``weights`` default to
    `WEIGHTS`; ``ilp_time_limit`` 0 or ``None`` skips ilp.
    """
    from eplb.evaluation.compare import CompareSpec  # lazy: compare imports runners and plots

    check_mapping("traces", traces)
    if not isinstance(spec, CompareSpec):
        raise InputError(f"spec must be a CompareSpec (eplb.evaluation.compare), got "
                         f"{type(spec).__name__}")
    frames = []
    for name, trace in traces.items():
        check_trace(trace, f"traces[{str(name)[:30]!r}]")
        groups = spec.num_groups if spec.num_groups is not None else trace.meta.get("num_groups")
        for topology in spec.specs:
            topo = topology.resolve(trace.num_experts, nvlink_gbps=spec.nvlink_gbps,
                                    rdma_gbps=spec.rdma_gbps)
            src = trace.source_counts.sum(0) if trace.source_counts is not None and \
                topo.num_gpus % trace.source_counts.shape[2] == 0 else None
            kw = dict(spec.traffic)
            if trace.meta.get("top_k"):
                kw.setdefault("top_k", int(trace.meta["top_k"]))
            tg = spec.topk_groups or trace.meta.get("topk_groups")
            df = sweep(trace.load(), topo, weights=weights or WEIGHTS, num_groups=groups,
                       topk_groups=tg, source_counts=src, policy=spec.policy,
                       ilp_time_limit=ilp_time_limit or None, seed=spec.seed, progress=progress,
                       **kw)
            frames.append(df.assign(trace=name, topology=topology.text))
    if not frames:
        raise InputError("give at least one trace and one topology")
    return frames
