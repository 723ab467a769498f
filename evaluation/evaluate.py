"""One placement scored on one trace: balance per layer and the modelled all-to-all traffic.

`evaluate` is what ``eplb evaluate`` prints: `metrics.score` joined with `traffic.simulate_trace`,
the per-token figures and the GPU picks as the dispatch policy routes them. See docs/evaluation.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from eplb.args import check_str
from eplb.dispatch import check_policy
from eplb.errors import InputError
from eplb.evaluation.align import align, check_placement, check_trace
from eplb.evaluation.metrics import score, summarize
from eplb.evaluation.traffic import TrafficReport, simulate_trace
from eplb.placement import Placement
from eplb.traces.model import Trace

SOURCES = ("auto", "tokens", "source_counts", "load")
DEFAULT_HIDDEN = 7168  # DeepSeek-V3's hidden size, elements per token vector


def dispatched_max_over_mean(gpu_tokens: np.ndarray) -> float:
    """Step max/mean of ``gpu_tokens: float[L, G]`` (picks per GPU as dispatched): the sum over
    layers of the busiest GPU over the sum of the mean (an idle step counts as 0)."""
    gt = np.asarray(gpu_tokens, dtype=np.float64)
    return float(gt.max(1).sum() / max(gt.mean(1).sum(), 1e-300))


@dataclass(frozen=True, eq=False)
class Evaluation:
    """What `evaluate` measured.

    - ``placement``: the placement as scored (rows aligned to the trace's layers).
    - ``layers``: one row per layer, `metrics.score`'s columns joined with the traffic columns
      of `TrafficReport.to_frame` (less ``layer`` and ``tokens``).
    - ``balance``: `metrics.summarize` of the balance columns (the placement's even split).
    - ``traffic``: the `TrafficReport` (``gpu_tokens: float[L, G]`` as dispatched).
    - ``windows``: the window selection scored (``None``: all windows).
    - ``assumed``: figures the traffic used that neither the trace nor the caller gave:
      ``top_k`` (a counts trace without one: ``min(8, E)``), ``hidden`` (none given:
      DeepSeek-V3's 7168); empty when nothing was assumed.
    """

    placement: Placement
    layers: pd.DataFrame
    balance: pd.Series
    traffic: TrafficReport
    windows: Any = None
    assumed: dict[str, int] = field(default_factory=dict)

    @property
    def mode(self) -> str:
        """``tokens`` (exact), ``source_counts`` or ``load`` (expectations)."""
        return self.traffic.mode

    @property
    def top_k(self) -> int:
        return int(self.traffic.meta["top_k"])

    @property
    def totals(self) -> dict[str, float]:
        """Traffic totals over layers (`TrafficReport.summary`)."""
        return self.traffic.summary()

    @property
    def layer_tokens(self) -> np.ndarray:
        """``float64[L]`` tokens through each layer (picks / top_k)."""
        return self.traffic.gpu_tokens.sum(-1) / self.traffic.meta["top_k"]

    @property
    def per_token_layer(self) -> dict[str, float]:
        """``nvlink_bytes``, ``rdma_bytes`` and ``alltoall_seconds`` per token per layer: totals
        over layers divided by the tokens through all layers (NaN with no tokens)."""
        totals = self.totals
        token_layers = float(self.layer_tokens.sum())
        return {k: (totals[k] / token_layers if token_layers > 0 else float("nan"))
                for k in ("nvlink_bytes", "rdma_bytes", "alltoall_seconds")}

    @property
    def dispatched_max_over_mean(self) -> float:
        """Step max/mean of the GPU picks as the dispatch policy routes them (the balance rows
        use the placement's even split)."""
        return dispatched_max_over_mean(self.traffic.gpu_tokens)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready ``topology``, ``balance`` (NaN as ``None``), ``traffic`` (totals, the
        report's meta and the per-token figures), ``layers`` (records) and ``assumed``."""
        per = self.per_token_layer
        return {
            "topology": self.placement.topology.to_dict(),
            "balance": {k: (None if np.isnan(v) else v) for k, v in self.balance.to_dict().items()},
            "traffic": {**self.totals, **self.traffic.meta,
                        "tokens_per_layer_mean": float(self.layer_tokens.mean()),
                        "nvlink_bytes_per_token_per_layer": per["nvlink_bytes"],
                        "rdma_bytes_per_token_per_layer": per["rdma_bytes"],
                        "alltoall_seconds_per_token_per_layer": per["alltoall_seconds"]},
            "layers": json.loads(self.layers.to_json(orient="records")),
            "assumed": dict(self.assumed),
        }


def evaluate(
    placement: Placement,
    trace: Trace,
    *,
    policy: str = "even",
    source: str = "auto",
    windows: Any = None,
    num_groups: int | None = None,
    topk_groups: int | None = None,
    hidden: int | None = None,
    dispatch_bytes: float = 1,
    combine_bytes: float = 2,
    top_k: int | None = None,
    seed: int = 0,
    progress: bool = False,
) -> Evaluation:
    """Score ``placement`` on ``trace``: balance per layer and all-to-all traffic.

    ``windows``: score only these windows (counts modes; `Trace.window_index` selections);
    with windows, ``source="auto"`` on a token-level trace uses its ``source_counts`` if it has
    them, else its load (token-level traffic uses every token). ``num_groups``: expert groups
    of the lower bound and, with ``topk_groups``, of the traffic model's group-limited routing
    (default: the trace's ``num_groups``; ``topk_groups`` and ``top_k`` default to the trace's
    as in `traffic.simulate_trace`). ``hidden``: elements per token vector (None: DeepSeek-V3's
    7168, recorded in ``Evaluation.assumed``). ``policy``, ``dispatch_bytes``,
    ``combine_bytes``, ``seed``, ``progress`` (a bar on stderr for the per-layer loops:
    token-level traffic, the ``lp`` policy): `traffic.simulate`'s.
    """
    check_placement(placement)
    check_trace(trace)
    check_policy(policy)
    check_str("source", source, SOURCES)
    placement = align(placement, trace)
    if windows is not None:
        trace.window_index(windows)  # an out-of-range selection fails here, by name
    load = trace.load(windows)
    groups = num_groups if num_groups is not None else trace.meta.get("num_groups")
    layers = score(placement, load, num_groups=groups)
    balance = summarize(layers)
    assumed: dict[str, int] = {}
    if hidden is None:
        hidden = assumed["hidden"] = DEFAULT_HIDDEN
    kw: dict[str, Any] = dict(policy=policy, hidden=hidden, dispatch_bytes=dispatch_bytes,
                              combine_bytes=combine_bytes, seed=seed, num_groups=groups,
                              topk_groups=topk_groups, progress=progress)
    if top_k is not None:
        kw["top_k"] = top_k
    if windows is not None and source == "auto" and trace.topk_ids is not None:
        source = "source_counts" if trace.source_counts is not None else "load"
    if source == "tokens" and windows is not None:
        raise InputError("windows apply to counts; token-level traffic (source='tokens') uses "
                         "every token")
    report = simulate_trace(placement, trace, windows=windows, source=source, **kw)
    frame = report.to_frame().drop(columns=["layer", "tokens"])
    if report.mode != "tokens" and top_k is None and trace.meta.get("top_k") is None:
        assumed = {"top_k": int(report.meta["top_k"]), **assumed}
    return Evaluation(placement, layers.join(frame), balance, report, windows, assumed)
