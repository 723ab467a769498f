"""Replay of periodic rebalancing over a trace's windows, with no peeking.

Window ``t`` is scored with the placement live *before* its counts were seen; each rebalance
reports replicas and bytes moved, and with ``policy`` the dispatched traffic. Rules:
docs/evaluation.md, section "`eplb replay`".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from eplb import solvers
from eplb.args import check_bool, check_mapping, check_number, check_opt_number, check_str
from eplb.dispatch import check_policy
from eplb.errors import InputError, TraceError
from eplb.evaluation.align import align, check_num_groups, check_trace, with_layers
from eplb.evaluation.metrics import score_windows, summarize
from eplb.evaluation.traffic import check_traffic_options, simulate_trace
from eplb.moves import replicas_moved
from eplb.placement import Placement
from eplb.topology import NVLINK_GBPS, RDMA_GBPS, Topology
from eplb.traces.model import Trace

EXPERT_BYTES = 3 * 7168 * 2048  # DeepSeek-V3 routed expert, FP8 weights


def _positive_int(name: str, value, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InputError(f"{name} must be a positive integer, got {str(value)[:40]}")
    return int(value)


def _solve(solver, load, topology, *, layer_ids, previous, num_groups, seed, time_limit, options):
    placement = solvers.solve(solver, load, topology, num_groups=num_groups,
                              previous=previous, seed=seed, time_limit=time_limit, **options)
    return with_layers(placement, layer_ids)


def replay(
    trace: Trace,
    topology: Topology,
    *,
    solver: str = "greedy",
    interval: int = 1,
    history: int | None = 1,
    ema: float | None = None,
    num_groups: int | None = None,
    initial: Placement | None = None,
    expert_bytes: float = EXPERT_BYTES,
    policy: str | None = None,
    oracle: bool = False,
    seed: int = 0,
    time_limit: float | None = None,
    solver_options: Mapping[str, Any] | None = None,
    progress: bool = False,
    tokens: Sequence[Trace] | None = None,
    **traffic: Any,
) -> pd.DataFrame:
    """Replay ``trace`` (a `traces.Trace`, >= 2 windows) with periodic rebalancing.

    ``interval``: windows between rebalances. ``history``: windows each rebalance looks back
    (``None``: all past windows). ``ema``: exponential weight of the latest window (``None``:
    plain sum). ``num_groups`` defaults to ``trace.meta["num_groups"]``. ``policy``: also
    model all-to-all traffic per window with that dispatch policy (`evaluation.traffic`,
    counts mode; extra keyword arguments go to `simulate`). ``oracle``: also score each window
    with a placement solved on that very window (it peeks on purpose: a reference line).

    Returns one row per window: ``window``, ``version`` (rebalances so far), ``rebalanced``
    (a new placement went live at this window), ``fit_start``/``fit_stop`` (windows the live
    placement was solved from, ``-1`` for the initial one), the `summarize` columns
    (``step_max_over_mean``, ``balancedness_mean``, ...), ``replicas_moved``,
    ``bytes_moved``, ``solve_seconds`` (non-zero on rebalance windows), and with ``policy``
    ``nvlink_bytes``, ``rdma_bytes``, ``alltoall_seconds``, ``dispatch_step_max_over_mean``
    (sum over layers of the busiest GPU's picks under that dispatch over the sum of the mean);
    with ``oracle`` ``oracle_step_max_over_mean``.

    ``tokens``: a sequence of ``T`` token-level traces (``topk_ids`` + ``token_rank``), one
    per window, each with one window whose counts equal that window of ``trace`` (as
    `traces.synth.token_windows` makes them); needs ``policy``; the traffic columns then come
    from those tokens.
    """
    check_trace(trace)
    if not isinstance(topology, Topology):
        raise InputError(f"topology must be an eplb.Topology, got {type(topology).__name__}")
    check_str("solver", solver)
    T = trace.num_windows
    if T < 1:
        raise TraceError("the trace has no windows; replay needs at least 2 windows of counts")
    if T < 2:
        raise TraceError(
            f"the trace has {T} window; replay needs at least 2 (one to learn from, one to "
            "score): stack dumps taken at different times (eplb trace stack A.json B.json "
            "... -o windows.npz; traces.stack)"
        )
    interval = _positive_int("interval", interval)
    history = _positive_int("history", history, allow_none=True)
    ema = check_opt_number("ema", ema, 0, 1, lo_open=True)
    expert_bytes = check_number("expert_bytes", expert_bytes, 0)
    oracle = check_bool("oracle", oracle)
    progress = check_bool("progress", progress)
    if num_groups is None:
        num_groups = trace.meta.get("num_groups")
    num_groups = check_num_groups(num_groups, trace.num_experts)
    options = check_mapping("solver_options", solver_options)
    traffic = check_traffic_options(traffic, "replay keyword")
    if policy is not None:
        check_policy(policy)
    tokens = _check_tokens(tokens, trace, policy)
    windowed = solvers.takes_windows(solver)
    if windowed and ema is not None:
        raise InputError(f"solver {solver} takes the history windows and weights them itself; "
                         "leave ema unset")
    ids = trace.layer_ids
    L, E = trace.num_layers, trace.num_experts
    kw = dict(layer_ids=ids, num_groups=num_groups, seed=seed, time_limit=time_limit,
              options=options)
    if initial is None:
        live = _solve(solver, np.ones((L, E)), topology, previous=None, **kw)
    else:
        live = align(initial, trace)
        if live.topology != topology:
            raise InputError(f"initial placement is on {live.topology}, replay on {topology}")

    rows: list[dict[str, Any]] = []
    version, fit = 0, (-1, -1)
    steps = range(T)
    if progress:
        from tqdm.auto import tqdm  # lazy: tqdm only when progress is shown

        steps = tqdm(steps, desc=f"replay {solver}", unit="window")
    for t in steps:
        row: dict[str, Any] = {"window": t, "rebalanced": False, "replicas_moved": 0,
                               "bytes_moved": 0.0, "solve_seconds": 0.0}
        if t >= 1 and t % interval == 0:
            start = 0 if history is None else max(0, t - history)
            if windowed:
                past = trace.counts[start:t]  # windows strictly before t
            else:
                past = trace.load(slice(start, t), ema=ema)
            new = _solve(solver, past, topology, previous=live, **kw)
            moved = int(replicas_moved(live, new).sum())
            row.update(rebalanced=True, replicas_moved=moved,
                       bytes_moved=moved * float(expert_bytes),
                       solve_seconds=float(new.meta["solver"]["seconds"]))
            live, version, fit = new, version + 1, (start, t)
        row.update(version=version, fit_start=fit[0], fit_stop=fit[1])
        frame = score_windows(live, trace.counts[t : t + 1], windows=[t])
        row.update(summarize(frame).drop("layers").to_dict())
        if policy is not None:
            traffic.setdefault("num_groups", num_groups)
            if tokens is not None:
                rep = simulate_trace(live, tokens[t], policy=policy, source="tokens",
                                     seed=seed, keep_slots=False,
                                     **{k: v for k, v in traffic.items()
                                        if k not in ("num_groups", "topk_groups", "top_k")})
            else:
                ranked = trace.source_counts is not None and \
                    topology.num_gpus % trace.source_counts.shape[2] == 0
                rep = simulate_trace(live, trace, windows=slice(t, t + 1), policy=policy,
                                     source="source_counts" if ranked else "load", **traffic)
            row.update({k: v for k, v in rep.summary().items()
                        if k in ("nvlink_bytes", "rdma_bytes", "alltoall_seconds")})
            gt = rep.gpu_tokens
            row["dispatch_step_max_over_mean"] = float(gt.max(1).sum() / max(gt.mean(1).sum(),
                                                                               1e-300))
        if oracle:
            best = _solve(solver, trace.counts[t : t + 1] if windowed else trace.counts[t],
                          topology, previous=None, **kw)
            oframe = score_windows(best, trace.counts[t : t + 1], windows=[t])
            row["oracle_step_max_over_mean"] = float(summarize(oframe)["step_max_over_mean"])
        rows.append(row)
    out = pd.DataFrame(rows)
    lead = ["window", "version", "rebalanced", "fit_start", "fit_stop"]
    out = out[lead + [c for c in out.columns if c not in lead]]
    out.attrs["params"] = {"solver": solver, "interval": interval, "history": history, "ema": ema,
                           "num_groups": num_groups, "topology": str(topology),
                           "expert_bytes": float(expert_bytes), "policy": policy, "seed": seed,
                           "tokens": tokens is not None}
    return out


def _check_tokens(tokens, trace, policy):
    """``tokens`` as a list of one token-level trace per window of ``trace`` (or None)."""
    if tokens is None:
        return None
    if policy is None:
        raise InputError("tokens are dispatched under a policy: give policy= (e.g. 'lp')")
    try:
        tokens = list(tokens)
    except TypeError:
        raise InputError("tokens must be a sequence of token-level traces, one per window"
                         ) from None
    if len(tokens) != trace.num_windows:
        raise InputError(f"tokens has {len(tokens)} traces but the trace has "
                         f"{trace.num_windows} windows; give one token-level trace per window")
    for t, tok in enumerate(tokens):
        if not isinstance(tok, Trace) or tok.topk_ids is None:
            raise InputError(f"tokens[{t}] must be a token-level traces.Trace (topk_ids)")
        if tok.num_windows != 1 or not np.array_equal(tok.layer_ids, trace.layer_ids) or \
                not np.array_equal(tok.token_counts(), trace.counts[t]):
            raise InputError(f"tokens[{t}]'s pick counts differ from window {t} of the trace; "
                             "build both with traces.synth.token_windows")
    return tokens


def replay_summary(frame: pd.DataFrame) -> dict[str, float]:
    """Totals of a `replay` frame: mean step max/mean, rebalances, replicas and bytes moved."""
    out = {
        "windows": float(len(frame)),
        "step_max_over_mean_mean": float(frame["step_max_over_mean"].mean()),
        "step_max_over_mean_worst": float(frame["step_max_over_mean"].max()),
        "balancedness_mean": float(frame["balancedness_mean"].mean()),
        "rebalances": float(frame["rebalanced"].sum()),
        "replicas_moved": float(frame["replicas_moved"].sum()),
        "bytes_moved": float(frame["bytes_moved"].sum()),
    }
    for col in ("rdma_bytes", "alltoall_seconds", "oracle_step_max_over_mean",
                "dispatch_step_max_over_mean"):
        if col in frame:
            out[f"{col}_mean"] = float(frame[col].mean())
    return out


DEFAULT_TOPOLOGY = "4x8"


def replay_topology(
    num_experts: int,
    spec: str | None = None,
    slots: int | None = None,
    *,
    nvlink_gbps: float = NVLINK_GBPS,
    rdma_gbps: float = RDMA_GBPS,
) -> Topology:
    """The topology ``eplb replay`` runs on: ``spec`` (default ``"4x8"``; `Topology.parse`) with
    ``slots`` in all; for ``NxG`` without ``slots``, the experts rounded up to the GPUs plus one
    redundant slot per GPU."""
    spec = DEFAULT_TOPOLOGY if spec is None else spec
    parts = spec.lower().replace("*", "x").split("x") if isinstance(spec, str) else []
    if slots is None and len(parts) == 2 and all(v.strip().isdigit() for v in parts):
        G = int(parts[0]) * int(parts[1])
        if G > 0:  # experts rounded up to the GPUs, plus one redundant slot per GPU
            slots = -(-num_experts // G) * G + G
    return Topology.parse(spec, slots, nvlink_gbps=nvlink_gbps, rdma_gbps=rdma_gbps,
                          min_slots=num_experts)
