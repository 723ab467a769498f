"""All-to-all traffic of a placement: tokens per GPU, NVLink and RDMA bytes, modelled time.

Accounting (shared with `eplb.executor`; both must agree exactly on token-level input). For
one layer, a token from source GPU ``s`` on node ``a`` whose K picks were routed to slots on the
set ``D`` of distinct destination GPUs:

- ``gpu_tokens[g]`` counts (token, k) picks served by GPU ``g``.
- dispatch sends the token's hidden vector (``hidden * dispatch_bytes`` bytes) once to each
  ``g in D`` other than ``s``: over NVLink when ``g`` is on node ``a``; for each distinct
  remote node ``b`` touched by ``D``, one RDMA transfer to the *rail peer* of ``s`` on ``b``
  (the GPU with the same local index, DeepEP-style), then one NVLink forward from the rail
  peer to every other ``g in D`` on ``b``. Picks served on ``s`` itself cost nothing.
- combine is the reverse path with ``combine_bytes`` per element (same transfer counts).

Link structure (NVLink mesh per node, RDMA edges between rail peers) and bandwidths come from
`Topology.graph` (networkx).

**Time model.** Every GPU has one NVLink port and one NIC, each full duplex at the topology's
bandwidth (GB/s = 1e9 bytes/s) per direction, and all four directions work concurrently. In a
phase (dispatch, then combine) GPU ``g`` is busy for
``max(max(nvlink_out, nvlink_in) / nvlink_gbps, max(rdma_out, rdma_in) / rdma_gbps)``; the
slowest GPU decides the phase; ``alltoall_seconds = dispatch_seconds + combine_seconds``.
No latency or congestion term: it is a bandwidth lower bound on the all-to-all.

**Inputs.** Token-level (``topk_ids: int[N, L, K]`` + ``token_rank: int[N]``): layer ``l`` is
routed by `eplb.dispatch.route` with ``layer_index=l`` and ``seed``; every figure is an
exact count and ``slots`` records the slot of each pick. Counts-only (``source_counts:
float[L, G_src, E]`` tokens from each source rank, or ``load: float[L, E]`` with sources spread
evenly over the GPUs): figures are expectations over tokens under these assumptions. (A trace
recorded on ``G_src`` ranks runs on ``G`` GPUs when ``G_src`` divides ``G``: rank ``r`` owns a
block of ``G / G_src`` GPUs, in both modes; see `simulate_trace`.)

- *routing*: a pick of expert ``e`` goes to replica ``r`` with probability ``1 / logcnt[e]``
  (``even``, ``random``), ``replica_share`` (``weighted``), or to the fixed
  `dispatch_table` slot of its source (``local_first``), independently for every pick; for
  ``lp`` each layer's expected picks are split as one batch (`eplb.dispatch.lp_plan`) and a pick of
  ``e`` from source ``s`` lands on GPU ``g`` with the plan's fraction of those picks. For
  ``random``/``weighted``/``local_first`` this is exact. For ``even`` it assumes a pick's
  position ``n*K+k`` is independent of its expert; when ``logcnt`` divides ``K`` the hash
  depends only on ``k``, so score-sorted top-k lists can route very unevenly in token mode
  (measured on `traces.synth.token_level` lists, 8x8 GPUs, 320 slots: GPU tokens up to 15% of
  the mean away from the counts expectation; ``random`` and ``local_first`` stay within 4%).
- *co-occurrence* (needed to count distinct GPUs and nodes per token, i.e. the per-node RDMA
  dedup): a token from source ``s`` includes expert ``e`` independently of its other experts,
  with probability ``p[s, e] = K * count[s, e] / total[s]`` (its exact marginal; clipped at 1).
  Then ``P(token visits GPU g) = 1 - prod_e (1 - p[s, e] * w[e, g])`` with ``w[e, g]`` the
  routing probability of ``e`` to ``g``, and likewise per node; counts-mode figures are the
  exact expectations of this model (checked against brute-force enumeration in
  ``tests/test_eval_traffic.py``).

How close that is to real tokens (``tests/test_eval_traffic.py``, stated tolerances):

- tokens drawn as the model says (independent inclusion): within 1.5% of token-level
  transfers at 30k tokens (sampling noise);
- tokens with exactly K distinct experts drawn by weight, positions shuffled (no co-occurrence
  beyond distinctness): a fixed-size token spreads a little more than independent inclusion,
  so counts mode *under*-estimates; tested bound 8% below / 1% above on bytes, GPU tokens
  within 2% of the mean GPU load. Measured: NVLink -1.6%, RDMA -4.5% (4x4 GPUs, E=40, K=6);
  NVLink -1%, RDMA -2% to -4% (4x8 and 18x8 GPUs, 288 slots, E=256, K=8, deepseek placement);
- real routers correlate experts: DeepSeek-V3 picks the top ``topk_groups = 4`` of
  ``num_groups = 8`` expert groups first, so a placement that keeps groups on nodes saves RDMA
  that independent inclusion cannot see (measured +9% to +28% RDMA for deepseek hierarchical
  placements on group-limited tokens, 4x8 and 8x8 GPUs). Give ``num_groups`` and
  ``topk_groups`` to use the *group-limited* model instead: a token selects group ``j``
  independently with probability
  ``q[s, j] = clip(topk_groups * m[s, j] / K, max_{e in j} p[s, e], 1)`` (``m[s, j]`` the
  group's expected picks per token; ``topk_groups`` groups per token on average), and an
  expert ``e`` of a selected group with probability ``p[s, e] / q[s, g(e)]`` (marginals
  unchanged). Groups are contiguous expert-id blocks, as in DeepSeek-V3. On tokens routed
  DeepSeek-style (exactly 4 of 8 groups by top-2 group score, then top-8; also
  `traces.synth.token_level`) it is within -3% to -12% on RDMA and -3% to 0% on NVLink, and
  ranks hierarchical vs global placements as the tokens do (tested bound: -15% / +2%).

Use token-level input when exact figures matter. The co-occurrence model itself and each
policy's expected split live with the dispatch policies (`eplb.dispatch.expect`,
`Dispatch.expected_visits`). Counts mode with every source alike has a fast path
(`Dispatch.routing` + `eplb.dispatch.expect.visit_probabilities`, then `expected_copies`;
`visit_probability` in closed form): the serving step-time model's, the same model evaluated
once per GPU instead of per source.

The expected time is the time of the expected per-GPU bytes (not the expected maximum).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd

from eplb.args import (
    as_int_array,
    check_bool,
    check_int,
    check_number,
    check_opt_int,
    check_seed,
    check_str,
)
from eplb.dispatch import Dispatch, check_policy, get, route
from eplb.dispatch.expect import group_probs
from eplb.errors import InputError, TopologyError
from eplb.evaluation.align import align, check_counts_shape, check_placement
from eplb.loads import check_load
from eplb.placement import Placement
from eplb.topology import Topology

DEFAULT_TOP_K = 8  # DeepSeek-V3; used in counts mode when the caller gives no top_k


# ------------------------------------------------------------------ link structure
@dataclass(frozen=True)
class Links:
    """The link structure of a topology, read from its networkx graph.

    ``rail: int64[G, N]``: the GPU on node ``b`` that source GPU ``s`` reaches by RDMA
    (``rail[s, node_of(s)] == s``); ``nvlink_gbps``/``rdma_gbps: float64[G]`` the slowest
    edge of each kind at each GPU (``inf`` when a GPU has no edge of that kind).
    """

    node: np.ndarray
    rail: np.ndarray
    nvlink_gbps: np.ndarray
    rdma_gbps: np.ndarray


@lru_cache(maxsize=32)
def links(topology: Topology) -> Links:
    """`Links` of ``topology`` from `Topology.graph` (cached per topology)."""
    graph = topology.graph()
    G, N = topology.num_gpus, topology.num_nodes
    node = np.array([graph.nodes[g]["node"] for g in range(G)], dtype=np.int64)
    rail = np.full((G, N), -1, dtype=np.int64)
    rail[np.arange(G), node] = np.arange(G)
    bw = {"nvlink": np.full(G, np.inf), "rdma": np.full(G, np.inf)}
    for a, b, data in graph.edges(data=True):
        kind, gbps = data["kind"], float(data["gbps"])
        if not np.isfinite(gbps) or gbps <= 0:
            raise TopologyError(f"{kind} bandwidth must be a positive number of GB/s, got {gbps}")
        for x, y in ((a, b), (b, a)):
            bw[kind][x] = min(bw[kind][x], gbps)
            if kind == "rdma":
                if rail[x, node[y]] not in (-1, y):
                    raise TopologyError(f"GPU {x} has two RDMA peers on node {node[y]}")
                rail[x, node[y]] = y
            elif node[x] != node[y]:
                raise TopologyError(f"NVLink edge {x}-{y} crosses nodes")
    if (rail < 0).any():
        s, b = (int(i) for i in np.argwhere(rail < 0)[0])
        raise TopologyError(f"GPU {s} has no RDMA peer on node {b}")
    for arr in (node, rail, bw["nvlink"], bw["rdma"]):
        arr.flags.writeable = False
    return Links(node, rail, bw["nvlink"], bw["rdma"])


# --------------------------------------------------------------------------- report
@dataclass(frozen=True, eq=False)
class TrafficReport:
    """Per-layer traffic of one placement (exact counts or expectations, see ``mode``).

    - ``gpu_tokens: float64[L, G]`` picks served by each GPU.
    - ``nvlink_bytes``, ``rdma_bytes: float64[L]`` dispatch + combine bytes.
    - ``nvlink_transfers``, ``rdma_transfers: float64[L]`` hidden-vector copies per phase.
    - ``nvlink_out``/``nvlink_in``/``rdma_out``/``rdma_in: float64[L, G]`` dispatch-phase
      bytes leaving / entering each GPU per link class (combine is the reverse, scaled by
      ``combine_bytes / dispatch_bytes``).
    - ``dispatch_seconds``, ``combine_seconds``, ``alltoall_seconds: float64[L]``.
    - ``slots: int[N, L, K]`` slot of each pick (token-level input only), else ``None``.
    """

    layer_ids: np.ndarray
    gpu_tokens: np.ndarray
    nvlink_bytes: np.ndarray
    rdma_bytes: np.ndarray
    nvlink_transfers: np.ndarray
    rdma_transfers: np.ndarray
    nvlink_out: np.ndarray
    nvlink_in: np.ndarray
    rdma_out: np.ndarray
    rdma_in: np.ndarray
    dispatch_seconds: np.ndarray
    combine_seconds: np.ndarray
    alltoall_seconds: np.ndarray
    slots: np.ndarray | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def mode(self) -> str:
        return self.meta["mode"]

    def to_frame(self) -> pd.DataFrame:
        """One row per layer: ``layer``, token and byte totals, seconds, max/mean GPU tokens."""
        gt = self.gpu_tokens
        mean = gt.mean(-1)
        return pd.DataFrame({
            "layer": self.layer_ids,
            "tokens": gt.sum(-1),
            "gpu_tokens_max": gt.max(-1),
            "gpu_tokens_max_over_mean": np.divide(
                gt.max(-1), mean, out=np.ones_like(mean), where=mean > 0
            ),
            "nvlink_bytes": self.nvlink_bytes,
            "rdma_bytes": self.rdma_bytes,
            "nvlink_transfers": self.nvlink_transfers,
            "rdma_transfers": self.rdma_transfers,
            "dispatch_seconds": self.dispatch_seconds,
            "combine_seconds": self.combine_seconds,
            "alltoall_seconds": self.alltoall_seconds,
        })

    def summary(self) -> dict[str, float]:
        """Totals over layers (one forward step): bytes, transfers and seconds."""
        return {
            "nvlink_bytes": float(self.nvlink_bytes.sum()),
            "rdma_bytes": float(self.rdma_bytes.sum()),
            "nvlink_transfers": float(self.nvlink_transfers.sum()),
            "rdma_transfers": float(self.rdma_transfers.sum()),
            "dispatch_seconds": float(self.dispatch_seconds.sum()),
            "combine_seconds": float(self.combine_seconds.sum()),
            "alltoall_seconds": float(self.alltoall_seconds.sum()),
        }


# ----------------------------------------------------------------------- helpers
def check_sizes(hidden, dispatch_bytes, combine_bytes) -> None:
    check_number("hidden", hidden, 0, 2**31, lo_open=True)
    check_number("dispatch_bytes", dispatch_bytes, 0, 64, lo_open=True)
    check_number("combine_bytes", combine_bytes, 0, 64, lo_open=True)


def _check_top_k(top_k, num_experts: int) -> int:
    top_k = check_int("top_k", top_k, 1)
    if top_k > num_experts:
        raise InputError(f"top_k {top_k} exceeds the {num_experts} experts; a token picks "
                         "distinct experts")
    return top_k


PICK_SLACK = 1.5  # sampled (synthetic) counts may exceed the 1/top_k cap by noise; not by 50%


def _check_picks(load: np.ndarray, top_k: int) -> None:
    """Refuse a ``top_k`` the counts cannot come from: a token picks an expert at most once,
    so no expert gets more than 1/top_k of a layer's picks (beyond sampling noise: more than
    `PICK_SLACK` times that is refused; smaller excesses are clipped and counted in
    ``meta["clipped_inclusions"]``)."""
    total = load.sum(-1)  # [L]
    share = np.divide(load.max(-1), total, out=np.zeros_like(total), where=total > 0)
    worst = int(np.argmax(share))
    if share[worst] * top_k > PICK_SLACK:
        raise InputError(
            f"top_k {top_k} is impossible for these counts: layer row {worst}'s hottest expert "
            f"has {share[worst]:.1%} of the picks, but with top-{top_k} routing no expert can "
            f"have more than {1 / top_k:.1%} (a token picks an expert once); give the top_k "
            f"the counts were recorded with (at most {int(1 / share[worst] + 1e-9)})"
        )


def _check_groups(num_groups, topk_groups, num_experts: int) -> tuple[int, int] | None:
    """``(num_groups, topk_groups)`` of the group-limited model, or ``None`` (no groups)."""
    num_groups = check_opt_int("num_groups", num_groups, 1)
    topk_groups = check_opt_int("topk_groups", topk_groups, 1)
    if num_groups is None or topk_groups is None:
        return None
    if num_experts % num_groups:
        raise InputError(
            f"num_groups {num_groups} does not divide the {num_experts} experts; give the "
            "model's expert groups (DeepSeek-V3: 8 groups of 32) or leave them out"
        )
    if topk_groups >= num_groups:
        return None  # every group may be chosen: no limit
    return int(num_groups), int(topk_groups)


def counts_source(L: int, E: int, G: int, *, source_counts=None, load=None, top_k=None,
                  num_groups=None, topk_groups=None):
    """Checked counts-mode routing source for ``L`` layers x ``E`` experts on ``G`` GPUs:
    ``(src: float64[L, G, E] expected picks from each source GPU, label, top_k, groups)``
    (`simulate`'s rules; checked once, reusable for every placement of that shape)."""
    src, label = _sources(L, E, G, source_counts, load)
    if top_k is None:  # the default (DeepSeek-V3's 8) never exceeds the experts
        K = min(DEFAULT_TOP_K, E)
    else:  # a given top_k must be one the counts can come from
        K = _check_top_k(top_k, E)
        _check_picks(src.sum(1), K)
    return src, label, K, _check_groups(num_groups, topk_groups, E)


def _sources(L: int, E: int, G: int, source_counts, load) -> tuple[np.ndarray, str]:
    """``float64[L, G, E]`` expected picks from each source GPU, and a label."""
    if source_counts is not None:
        src = check_load(source_counts, name="source_counts", ndim=3)
        check_counts_shape(src[:, 0, :], L, E, "source_counts[:, rank, :]")
        gs = src.shape[1]
        if gs == G:
            return np.asarray(src), "source_counts"
        if G % gs:
            raise InputError(
                f"source_counts has {gs} source ranks, which do not divide the {G} GPUs; "
                f"evaluate on a topology with a multiple of {gs} GPUs or pass load= instead"
            )
        # each source rank's tokens spread evenly over a contiguous block of G / gs GPUs
        return np.repeat(np.asarray(src) / (G // gs), G // gs, axis=1), "source_counts"
    load = check_load(load)
    check_counts_shape(load, L, E, "load")
    return np.broadcast_to(load[:, None, :] / G, (load.shape[0], G, load.shape[1])), "load"


# ----------------------------------------------------------------- visit matrices
def _expected_visits(
    placement: Placement, src: np.ndarray, dispatch: Dispatch, top_k: int,
    groups: tuple[int, int] | None = None, tick=None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Counts mode: ``gpu_tokens [L, G]``, ``visits [L, G, G]`` (expected tokens from ``s``
    reaching GPU ``g``), ``node_visits [L, G, N]``, and the number of clipped inclusions: the
    co-occurrence model (`eplb.dispatch.expect`) through ``dispatch``'s expected split
    (`Dispatch.expected_visits`). ``tick(n)``, if given, is called as a ``per_batch`` policy
    finishes layers (progress)."""
    tokens = src.sum(-1) / top_k  # [L, G] tokens from each source
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(tokens[..., None] > 0, src / tokens[..., None], 0.0)  # [L, G, E]
    clipped = int((p > 1 + 1e-12).sum())
    p = np.minimum(p, 1.0)
    gid, q, r = group_probs(p, top_k, groups)
    gpu_tokens, miss_g, miss_n = dispatch.expected_visits(placement, src, r, q, gid, tick)
    visits = tokens[..., None] * -np.expm1(miss_g)
    node_visits = tokens[..., None] * -np.expm1(miss_n)
    return gpu_tokens, visits, node_visits, clipped


def expected_copies(src: np.ndarray, v: np.ndarray, vn: np.ndarray, topology: Topology):
    """Token copies per GPU in dispatch when the tokens ``src: float[G]`` of every source GPU
    route alike with visit probabilities ``v: float[L, G]``, ``vn: float[L, N]``: the
    accounting of `_account` (rail peer = same local index) as ``(nvlink_out, nvlink_in,
    rdma_out, rdma_in)``, each ``float64[L, G]``."""
    gpn, N = topology.gpus_per_node, topology.num_nodes
    loc = np.arange(topology.num_gpus) % gpn
    node = topology.node_of_gpu
    t_all = src.sum()
    t_loc = np.bincount(loc, src, gpn)  # [gpn] tokens of sources with each local index
    v_node = v.reshape(v.shape[0], N, gpn).sum(-1)  # [L, N]
    nv_in = v * (t_all - t_loc[loc])
    nv_out = t_loc[loc] * (v_node[:, node] - v)
    rd_out = src * (vn.sum(-1, keepdims=True) - vn[:, node])
    rd_in = (t_loc[loc] - src) * vn[:, node]
    return nv_out, nv_in, rd_out, rd_in


def visit_probability(
    experts_per_bin, *, num_experts: int, top_k: int, num_groups: int, topk_groups: int
):
    """Probability that one token visits a bin (GPU or node) holding ``experts_per_bin`` of
    ``num_experts`` experts, experts contiguous, routing uniform over experts: the model in
    closed form (each expert included with ``p = top_k / num_experts``; with groups, each of
    ``num_groups`` contiguous groups selected with ``q = topk_groups / num_groups`` and an
    expert of a selected group with ``p / q``). A bin of ``x`` experts spans
    ``x / min(x, group)`` groups (fractional ``x`` is the even spread of experts over bins).
    """
    x = np.asarray(experts_per_bin, dtype=np.float64)
    p = top_k / num_experts
    gs = num_experts / num_groups
    q = min(1.0, topk_groups / num_groups)
    r = min(1.0, p / q)
    h = np.minimum(x, gs)
    with np.errstate(divide="ignore", invalid="ignore"):
        miss = np.where(x > 0, (1 - q + q * (1 - r) ** h) ** (x / np.maximum(h, 1e-300)), 1.0)
    return 1.0 - miss


def _token_visits_layer(slots: np.ndarray, rank: np.ndarray, topo: Topology):
    """Token mode, one layer: ``gpu_tokens [G]``, ``visits [G, G]``, ``node_visits [G, N]``."""
    G, N = topo.num_gpus, topo.num_nodes
    dest = slots // topo.slots_per_gpu  # [n, K]
    gpu_tokens = np.bincount(dest.ravel(), minlength=G)
    dest.sort(axis=1)
    src = np.broadcast_to(rank[:, None], dest.shape)
    first = np.ones(dest.shape, dtype=bool)
    first[:, 1:] = dest[:, 1:] != dest[:, :-1]
    visits = np.bincount((src * G + dest)[first], minlength=G * G)
    node = dest // topo.gpus_per_node  # sorted too
    first[:, 1:] = node[:, 1:] != node[:, :-1]
    node_visits = np.bincount((src * N + node)[first], minlength=G * N)
    return gpu_tokens, visits.reshape(G, G), node_visits.reshape(G, N)


# -------------------------------------------------------------------- accounting
def _account(visits: np.ndarray, node_visits: np.ndarray, topo: Topology, lk: Links):
    """Transfers from visit matrices ``visits [L, G, G]`` and ``node_visits [L, G, N]``.

    Returns dispatch-phase transfer counts: ``nv_tr [L]``, ``rd_tr [L]`` and per-GPU
    ``nv_out, nv_in, rd_out, rd_in [L, G]``.
    """
    L, G, _ = visits.shape
    N = topo.num_nodes
    node = lk.node
    gpus = np.arange(G)
    same = node[:, None] == node[None, :]  # [s, g]
    rail_of = lk.rail[:, node]  # [s, g]: rail peer of s on g's node
    local = same & (gpus[:, None] != gpus[None, :])  # s -> g over NVLink directly
    forward = ~same & (rail_of != gpus[None, :])  # rail peer -> g over NVLink
    remote = node[:, None] != np.arange(N)[None, :]  # [s, b]
    v_local = visits * local
    v_fwd = visits * forward
    v_rdma = node_visits * remote
    nv_tr = v_local.sum((1, 2)) + v_fwd.sum((1, 2))
    rd_tr = v_rdma.sum((1, 2))
    # per-GPU endpoints
    nv_in = v_local.sum(1) + v_fwd.sum(1)  # received by g
    lrow = (np.arange(L) * G)[:, None, None]
    fwd_out = np.bincount((lrow + rail_of[None]).ravel(), v_fwd.ravel(), minlength=L * G)
    nv_out = v_local.sum(2) + fwd_out.reshape(L, G)
    rd_out = v_rdma.sum(2)
    rd_in = np.bincount((lrow + lk.rail[None]).ravel(), v_rdma.ravel(), minlength=L * G)
    return nv_tr, rd_tr, nv_out, nv_in, rd_out, rd_in.reshape(L, G)


def _phase_seconds(out_b: tuple, in_b: tuple, lk: Links) -> np.ndarray:
    """``float64[L]``: slowest GPU's busy time; ``out_b``/``in_b`` = (nvlink, rdma) bytes."""
    nv = np.maximum(out_b[0], in_b[0]) / (lk.nvlink_gbps * 1e9)
    rd = np.maximum(out_b[1], in_b[1]) / (lk.rdma_gbps * 1e9)
    return np.maximum(nv, rd).max(-1)


# ---------------------------------------------------------------------- simulate
def simulate(
    placement: Placement,
    *,
    topk_ids=None,
    token_rank=None,
    source_counts=None,
    load=None,
    policy: str = "even",
    hidden: int = 7168,
    dispatch_bytes: float = 1,
    combine_bytes: float = 2,
    seed: int = 0,
    top_k: int | None = None,
    num_groups: int | None = None,
    topk_groups: int | None = None,
    keep_slots: bool = True,
    progress: bool = False,
) -> TrafficReport:
    """Traffic of ``placement`` for one routing source (give exactly one):

    - ``topk_ids: int[N, L, K]`` with ``token_rank: int[N]`` (source GPU of each token): exact.
    - ``source_counts: float[L, G_src, E]`` picks from each source rank (``G_src`` must divide
      ``G``; each rank's tokens spread over a block of ``G / G_src`` GPUs): expectations.
    - ``load: float[L, E]`` with sources spread evenly over the GPUs: expectations.

    ``policy``: ``even``, ``random``, ``local_first``, ``weighted``, ``lp``
    (`eplb.dispatch`).
    ``hidden`` elements per token vector; ``dispatch_bytes``/``combine_bytes`` per element
    (FP8 dispatch, BF16 combine by default). ``top_k`` (counts mode; default min(8, E))
    converts picks to tokens and must be one the counts can come from (no expert above 1/top_k
    of a layer's picks); ``num_groups`` + ``topk_groups`` (counts mode) switch to the group-limited
    co-occurrence model. ``seed`` drives the ``random``/``weighted`` policies. See the module
    docstring for the accounting, the time model and the counts-mode assumptions.
    """
    check_placement(placement)
    check_policy(policy)
    check_sizes(hidden, dispatch_bytes, combine_bytes)
    seed = check_seed("seed", seed)
    keep_slots = check_bool("keep_slots", keep_slots)
    progress = check_bool("progress", progress)
    given = [n for n, v in (("topk_ids", topk_ids), ("source_counts", source_counts),
                            ("load", load)) if v is not None]
    if len(given) != 1:
        raise InputError(
            "give exactly one routing source: topk_ids (+ token_rank), source_counts or load; "
            f"got {', '.join(given) or 'none'}"
        )
    ids = rank = src = label = None
    K, groups = None, None
    if topk_ids is not None:
        ids, rank = _check_tokens(placement, topk_ids, token_rank)
    else:
        src, label, K, groups = counts_source(
            placement.num_layers, placement.num_experts, placement.topology.num_gpus,
            source_counts=source_counts, load=load, top_k=top_k, num_groups=num_groups,
            topk_groups=topk_groups)
    return _simulate(placement, ids=ids, rank=rank, src=src, label=label, policy=policy,
                     hidden=hidden, dispatch_bytes=dispatch_bytes, combine_bytes=combine_bytes,
                     seed=seed, top_k=K, groups=groups, keep_slots=keep_slots,
                     progress=progress)


def _simulate(placement: Placement, *, ids, rank, src, label, policy: str, hidden: int,
              dispatch_bytes: float, combine_bytes: float, seed: int, top_k, groups,
              keep_slots: bool = True, progress: bool = False) -> TrafficReport:
    """`simulate` on checked arguments: token mode with ``ids: int64[N, L, K]`` and ``rank:
    int64[N]``, else counts mode with ``src: float64[L, G, E]`` (labelled ``label``),
    ``top_k`` picks per token and ``groups`` (``(num_groups, topk_groups)`` or None)."""
    topo = placement.topology
    lk = links(topo)
    L, G = placement.num_layers, topo.num_gpus
    rule = get(policy)  # a checked per-pick policy
    meta: dict[str, Any] = {"policy": policy, "hidden": hidden, "dispatch_bytes": dispatch_bytes,
                            "combine_bytes": combine_bytes, "seed": seed, "topology": str(topo)}
    slots_out = None
    if ids is not None:
        N, _, K = ids.shape
        meta.update(mode="tokens", tokens=N, top_k=K)
        gpu_tokens = np.zeros((L, G))
        visits = np.zeros((L, G, G))
        node_visits = np.zeros((L, G, topo.num_nodes))
        if keep_slots:
            slots_out = np.empty((N, L, K), np.int16 if topo.num_slots < 2**15 else np.int32)
        layers = range(L)
        if progress:
            from tqdm.auto import tqdm  # lazy: tqdm only when progress is shown

            layers = tqdm(layers, desc="traffic", unit="layer")
        for layer in layers:
            slots = route(ids[:, layer, :], placement, layer_index=layer, policy=policy,
                          token_rank=rank, seed=seed)
            if slots_out is not None:
                slots_out[:, layer, :] = slots
            gpu_tokens[layer], visits[layer], node_visits[layer] = _token_visits_layer(
                slots, rank, topo
            )
    else:
        K = top_k
        # layers in chunks so the [layers, G, groups, G] scratch stays near 32 MB
        step = max(1, int(4e6 // (G * (groups or (1,))[0] * G)))
        parts = []
        bar = None
        if progress and rule.per_batch:  # one LP per layer: the slow counts-mode policy
            from tqdm.auto import tqdm  # lazy: tqdm only when progress is shown

            bar = tqdm(total=L, desc="lp dispatch", unit="layer")
        for lo in range(0, L, step):
            rows = slice(lo, min(L, lo + step))
            sub = Placement(placement.phy2log[rows], placement.num_experts, topo,
                            None if placement.replica_share is None
                            else placement.replica_share[rows])
            parts.append(_expected_visits(sub, src[rows], rule, K, groups,
                                          None if bar is None else bar.update))
        if bar is not None:
            bar.close()
        gpu_tokens, visits, node_visits = (np.concatenate([q[i] for q in parts])
                                           for i in range(3))
        clipped = sum(q[3] for q in parts)
        meta.update(mode=label, top_k=K, clipped_inclusions=clipped,
                    groups=None if groups is None else list(groups))
    nv_tr, rd_tr, nv_out, nv_in, rd_out, rd_in = _account(visits, node_visits, topo, lk)
    d, c = hidden * dispatch_bytes, hidden * combine_bytes
    dispatch = _phase_seconds((nv_out * d, rd_out * d), (nv_in * d, rd_in * d), lk)
    combine = _phase_seconds((nv_in * c, rd_in * c), (nv_out * c, rd_out * c), lk)
    return TrafficReport(
        layer_ids=placement.layer_ids.copy(),
        gpu_tokens=gpu_tokens,
        nvlink_bytes=nv_tr * (d + c),
        rdma_bytes=rd_tr * (d + c),
        nvlink_transfers=nv_tr,
        rdma_transfers=rd_tr,
        nvlink_out=nv_out * d,
        nvlink_in=nv_in * d,
        rdma_out=rd_out * d,
        rdma_in=rd_in * d,
        dispatch_seconds=dispatch,
        combine_seconds=combine,
        alltoall_seconds=dispatch + combine,
        slots=slots_out,
        meta=meta,
    )


def _check_tokens(placement: Placement, topk_ids, token_rank) -> tuple[np.ndarray, np.ndarray]:
    if token_rank is None:
        raise InputError("topk_ids needs token_rank (the source GPU of each token)")
    ids = as_int_array("topk_ids", topk_ids)
    rank = as_int_array("token_rank", token_rank)
    L, E, G = placement.num_layers, placement.num_experts, placement.topology.num_gpus
    if ids.ndim != 3:
        raise InputError(f"topk_ids must be int[N, L, K], got shape {ids.shape}")
    if ids.shape[1] != L:
        raise InputError(
            f"topk_ids has {ids.shape[1]} layers but the placement has {L}; use a placement "
            "solved for this trace"
        )
    if ids.size and (ids.min() < 0 or ids.max() >= E):
        raise InputError(f"topk_ids must hold expert ids in 0..{E - 1} (the placement's experts)")
    if rank.shape != (ids.shape[0],):
        raise InputError(f"token_rank must be int[{ids.shape[0]}], got shape {rank.shape}")
    if rank.size and (rank.min() < 0 or rank.max() >= G):
        raise InputError(
            f"token_rank holds source rank {int(rank.max())} but the topology has {G} GPUs "
            f"(ranks 0..{G - 1}); evaluate on a topology with at least {int(rank.max()) + 1} GPUs"
        )
    return ids, rank.astype(np.int64)


def trace_ranks(trace) -> int:
    """Source ranks of a trace: ``source_counts``' rank axis, else ``max(token_rank) + 1``."""
    if trace.source_counts is not None:
        return int(trace.source_counts.shape[2])
    if trace.token_rank is not None and trace.token_rank.size:
        return int(trace.token_rank.max()) + 1
    return 0


def token_gpus(token_rank: np.ndarray, ranks: int, num_gpus: int) -> np.ndarray:
    """``int64[N]`` source GPU of each token when a trace recorded on ``ranks`` ranks runs on
    ``num_gpus`` GPUs (``ranks`` must divide ``num_gpus``): rank ``r`` owns GPUs
    ``r * m .. r * m + m - 1`` (``m = num_gpus / ranks``), token ``n`` sits on ``r * m + n % m``
    -- the token-level counterpart of the block spread `simulate` applies to ``source_counts``.
    """
    m = num_gpus // ranks
    rank = np.asarray(token_rank, dtype=np.int64)
    return rank * m + np.arange(rank.size) % m


TRAFFIC_OPTIONS = ("hidden", "dispatch_bytes", "combine_bytes", "seed", "top_k", "num_groups",
                   "topk_groups", "keep_slots", "progress")  # `simulate` keywords callers pass on


def check_traffic_options(options, what: str = "traffic") -> dict:
    """``options`` as a dict after refusing keys `simulate` does not take (a typo would be a
    ``TypeError`` deep inside a sweep)."""
    options = dict(options or {})
    bad = sorted(str(k) for k in options if k not in TRAFFIC_OPTIONS)
    if bad:
        raise InputError(f"{what} option(s) {', '.join(map(repr, bad))} unknown; the traffic "
                         f"model takes {', '.join(TRAFFIC_OPTIONS)}")
    return options


def simulate_trace(
    placement: Placement, trace, *, windows=None, source: str = "auto", **kwargs: Any
) -> TrafficReport:
    """`simulate` on a `traces.Trace` after `align`.

    ``source``: ``"tokens"`` (token-level, all tokens), ``"source_counts"`` or ``"load"``
    (counts of the chosen ``windows``, default all); ``"auto"`` picks the most exact one the
    trace has. The trace's source ranks (`trace_ranks`) must divide the GPUs for ``tokens`` and
    ``source_counts``: each rank's tokens spread over a block of GPUs (`token_gpus`), so both
    modes see the same sources. ``top_k``, ``num_groups`` and ``topk_groups`` default to the
    trace's ``meta``.
    """

    placement = align(placement, trace)
    check_str("source", source, ("auto", "tokens", "source_counts", "load"))
    if windows is not None:
        windows = trace.window_index(windows)
    G = placement.topology.num_gpus
    R = trace_ranks(trace)
    fits = R > 0 and G % R == 0
    if source == "auto":
        if trace.topk_ids is not None and windows is None and fits:
            source = "tokens"
        elif trace.source_counts is not None and fits:
            source = "source_counts"
        else:
            source = "load"
    if source in ("tokens", "source_counts") and not fits:
        what = "token_rank" if source == "tokens" else "source_counts"
        if getattr(trace, "topk_ids" if source == "tokens" else "source_counts") is not None:
            raise InputError(
                f"the trace's {R} source ranks ({what}) do not divide the {G} GPUs; evaluate on "
                f"a multiple of {R} GPUs or use source='load'"
            )
    if source == "tokens":
        if trace.topk_ids is None:
            raise InputError("the trace has no token-level routing (topk_ids); use source='load'")
        return simulate(placement, topk_ids=trace.topk_ids,
                        token_rank=token_gpus(trace.token_rank, R, G), **kwargs)
    for key in ("top_k", "num_groups", "topk_groups"):
        if kwargs.get(key) is None:
            kwargs.pop(key, None)
            if trace.meta.get(key) is not None:
                kwargs[key] = int(trace.meta[key])
    if source == "source_counts":
        if trace.source_counts is None:
            raise InputError("the trace has no per-rank source_counts; use source='load'")
        sc = trace.source_counts if windows is None else trace.source_counts[windows]
        sc = sc[None] if sc.ndim == 3 else sc
        return simulate(placement, source_counts=sc.sum(0), **kwargs)
    if source != "load":
        raise InputError(f"source must be auto, tokens, source_counts or load, got {source!r}")
    return simulate(placement, load=trace.load(windows), **kwargs)
