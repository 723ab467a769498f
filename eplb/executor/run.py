"""One checked run of a placement layer: route a batch, execute it on the simulated ranks and
compare the output with the dense single-device forward (what ``eplb execute`` prints).

`execute` builds the `MoELayer`, routes the tokens (given picks, or the router on random
activations, optionally biased towards an expert popularity) and returns an `ExecuteReport`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from eplb.args import as_float_array, as_int_array, check_int
from eplb.errors import InputError
from eplb.executor.blas import one_blas_thread
from eplb.executor.executor import ExecutorStats, ReferenceExecutor, even_token_rank
from eplb.executor.model import MoELayer
from eplb.executor.popularity import popularity_picks
from eplb.placement import Placement
from eplb.safeload import check_size

DEFAULT_TOP_K = 8  # DeepSeek-V3's experts per token
DEFAULT_TOKENS = 4096
# max abs error of the executor against the dense forward, relative to max(1, |reference|)
RELATIVE_TOLERANCE = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-9}
POPULARITY_FLOOR = 1e-12  # share of an expert nobody picked, before the log


def _dtype(dtype: DTypeLike) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError):
        raise InputError(f"dtype must be float32 or float64, got {dtype!r}") from None
    if dt not in RELATIVE_TOLERANCE:
        raise InputError(f"dtype must be float32 or float64, got {dt}")
    return dt


def tolerance(dtype: DTypeLike, reference: np.ndarray) -> float:
    """Largest max-abs error that passes for an output ``reference: float[N, H]`` computed in
    ``dtype``: 1e-5 (float32) or 1e-9 (float64) times ``max(1, max |reference|)``."""
    scale = max(1.0, float(np.abs(reference).max())) if reference.size else 1.0
    return RELATIVE_TOLERANCE[np.dtype(dtype)] * scale


def popularity_bias(expert_load: ArrayLike, dtype: DTypeLike = np.float32) -> np.ndarray:
    """Router bias ``float[E]`` steering top-k picks towards ``expert_load: float[E]``: the
    log of each expert's share of the load (floored at 1e-12)."""
    load = as_float_array("expert_load", expert_load, np.float64)
    share = load / max(load.sum(), 1e-300)
    return np.log(np.maximum(share, POPULARITY_FLOOR)).astype(dtype)


def row_of(placement: Placement, layer: int) -> int:
    """Placement row of model layer id ``layer``; `InputError` listing the ids otherwise."""
    hit = np.flatnonzero(placement.layer_ids == layer)
    if hit.size == 0:
        ids = placement.layer_ids
        raise InputError(f"layer {layer} is not a layer of the placement; its model layer ids "
                         f"are {int(ids.min())}..{int(ids.max())} ({len(ids)} layers)")
    return int(hit[0])


def default_row(placement: Placement, layer_ids: ArrayLike | None = None) -> int:
    """Row of the first MoE layer: the first whose model layer id is in ``layer_ids: int[L']``
    (e.g. a trace's), else the first row of the placement that is not SGLang's default map
    ``slot % E`` (what dense layers get), else row 0."""
    if layer_ids is not None:
        hit = np.flatnonzero(np.isin(placement.layer_ids, np.asarray(layer_ids)))
        if hit.size:
            return int(hit[0])
    dense = np.arange(placement.num_slots) % placement.num_experts
    moe = np.flatnonzero((placement.phy2log != dense).any(axis=1))
    return int(moe[0]) if moe.size else 0


@dataclass(frozen=True, eq=False)
class ExecuteReport:
    """What `execute` ran and measured.

    - ``layer``: the `MoELayer`; ``row``/``layer_id``: the placement row and its model layer id.
    - ``num_tokens``; ``routing``: ``"picks"`` (the given picks, weighted by the router's scores
      of them), ``"biased"`` (the router on random activations, biased towards an expert
      popularity) or ``"router"`` (the router on random activations).
    - ``policy``, ``seed``, ``dispatch_bytes``, ``combine_bytes``: as run.
    - ``stats``: the executor's `ExecutorStats`; ``max_abs_error`` against the dense forward and
      the ``tolerance`` it must stay within (`tolerance`); ``executor_seconds``,
      ``dense_seconds``: wall time of each.
    """

    placement: Placement
    layer: MoELayer
    row: int
    layer_id: int
    num_tokens: int
    routing: str
    policy: str
    seed: int
    dispatch_bytes: float
    combine_bytes: float
    stats: ExecutorStats
    max_abs_error: float
    tolerance: float
    executor_seconds: float
    dense_seconds: float

    @property
    def passed(self) -> bool:
        """The executor's output matched the dense forward within ``tolerance``."""
        return bool(self.max_abs_error <= self.tolerance)


def execute(
    placement: Placement,
    *,
    layer: int | None = None,
    num_tokens: int = DEFAULT_TOKENS,
    hidden: int = 512,
    ffn: int | None = None,
    top_k: int | None = None,
    num_groups: int | None = None,
    topk_groups: int | None = None,
    scoring: str = "softmax",
    policy: str = "even",
    dtype: DTypeLike = "float32",
    dispatch_bytes: float = 1.0,
    combine_bytes: float = 2.0,
    seed: int = 0,
    topk_ids: ArrayLike | None = None,
    token_rank: ArrayLike | None = None,
    expert_load: ArrayLike | None = None,
) -> ExecuteReport:
    """Run model layer ``layer`` of ``placement`` (default `default_row`) with the reference
    executor on ``num_tokens`` tokens and check it against the dense forward.

    The layer: `MoELayer` with the placement's experts, ``hidden``, ``ffn`` (default
    ``hidden // 4``), ``top_k`` (default: the picks' width, else 8), ``num_groups``,
    ``topk_groups``, ``scoring``, ``dtype`` and weights from ``seed``. The batch: activations
    ``N(0, 1)`` from ``default_rng([seed, 1])``; then

    - ``topk_ids: int[N', K]`` with ``token_rank: int[N']`` (source GPU per token): the first
      ``min(num_tokens, N')`` of those picks are replayed, weighted by the router's scores of
      them normalised per token;
    - else, with ``expert_load: float[E]``, each token's picks are drawn so that every expert's
      expected share of the picks is its share of the load (`popularity.popularity_picks`,
      group limits kept), weighted by the router's scores biased by `popularity_bias`;
      without it the router picks; the tokens are spread evenly over the GPUs.

    ``policy``, ``seed``, ``dispatch_bytes``, ``combine_bytes``: `ReferenceExecutor`'s.
    """
    if not isinstance(placement, Placement):
        raise InputError(f"placement must be a Placement, got {type(placement).__name__}")
    num_tokens = check_int("num_tokens", num_tokens, 1)
    hidden = check_int("hidden", hidden, 1)
    ffn = max(hidden // 4, 1) if ffn is None else check_int("ffn", ffn, 1)
    topo = placement.topology
    E, G = placement.num_experts, topo.num_gpus
    ids = rank = None
    if topk_ids is not None:
        ids = as_int_array("topk_ids", topk_ids, ndim=2)
        if token_rank is None:
            raise InputError("topk_ids needs token_rank (the source GPU of each token)")
        if expert_load is not None:
            raise InputError("give topk_ids (replayed picks) or expert_load (router bias), "
                             "not both")
        rank = as_int_array("token_rank", token_rank, ndim=1)
        if rank.shape != ids.shape[:1]:
            raise InputError(f"token_rank must be int[{ids.shape[0]}] (one source GPU per row "
                             f"of topk_ids), got shape {rank.shape}")
        width = ids.shape[1]
        if top_k is not None and top_k != width:
            raise InputError(f"top_k {top_k} disagrees with the {width} picks per token of "
                             "topk_ids; leave top_k out")
        top_k = width
    elif token_rank is not None:
        raise InputError("token_rank goes with topk_ids (replayed picks)")
    top_k = DEFAULT_TOP_K if top_k is None else check_int("top_k", top_k, 1)
    itemsize = _dtype(dtype).itemsize
    # activations, receive buffers (<= K rows a token) and expert outputs (K rows a token)
    check_size(f"num_tokens {num_tokens}, hidden {hidden}", (num_tokens, 2 * top_k + 4, hidden),
               itemsize, fix="use fewer tokens or a smaller hidden")
    check_size(f"expert weights (hidden {hidden}, ffn {ffn}, {topo.num_slots} slots)",
               (topo.num_slots + E, 3, hidden, ffn), itemsize, fix="use a smaller hidden or ffn")
    row = default_row(placement) if layer is None else row_of(placement, layer)
    lay = MoELayer(E, hidden, ffn, top_k, num_groups=num_groups, topk_groups=topk_groups,
                   seed=seed, dtype=np.dtype(dtype), scoring=scoring)
    rng = np.random.default_rng([seed, 1])
    if ids is not None:
        n = min(num_tokens, ids.shape[0])
        ids, rank = ids[:n], rank[:n]
        if n and (rank.min() < 0 or rank.max() >= G):
            raise InputError(f"token_rank holds rank {int(rank.max())} but the placement has "
                             f"{G} GPUs (ranks 0..{G - 1})")
        x = rng.standard_normal((n, hidden)).astype(lay.dtype)
        s = np.take_along_axis(lay.scores(x), ids, axis=1)  # router scores of the given picks
        w = (s / s.sum(axis=1, keepdims=True)).astype(lay.dtype)
        routing = "picks"
    else:
        n = num_tokens
        routing = "router"
        if expert_load is not None:
            load = as_float_array("expert_load", expert_load, np.float64)
            if load.shape != (E,):
                raise InputError(f"expert_load must be float[{E}] (one load per expert), got "
                                 f"shape {load.shape}")
            lay.router_bias = popularity_bias(load, lay.dtype)
            routing = "biased"
        x = rng.standard_normal((n, hidden)).astype(lay.dtype)
        if expert_load is None:
            ids, w = lay.route(x)
        else:  # picks drawn with the popularity as inclusion probabilities (converge to it)
            ids = popularity_picks(load, n, top_k, np.random.default_rng([seed, 2]),
                                   num_groups=num_groups, topk_groups=topk_groups)
            s = np.take_along_axis(lay.scores(x), ids, axis=1)  # the biased router's scores
            w = (s / s.sum(axis=1, keepdims=True)).astype(lay.dtype)
        rank = even_token_rank(n, G)

    executor = ReferenceExecutor(lay, placement, policy, seed, dispatch_bytes=dispatch_bytes,
                                 combine_bytes=combine_bytes)
    with one_blas_thread():  # many small matmuls: BLAS threads cost more than they give
        t0 = time.perf_counter()
        out, stats = executor.forward(x, ids, w, rank, layer_index=row)
        t1 = time.perf_counter()
        ref = lay.dense_forward(x, ids, w)
        t2 = time.perf_counter()
    err = float(np.abs(out - ref).max()) if out.size else 0.0
    return ExecuteReport(
        placement=placement, layer=lay, row=row, layer_id=int(placement.layer_ids[row]),
        num_tokens=n, routing=routing, policy=executor.policy, seed=executor.seed,
        dispatch_bytes=executor.dispatch_bytes, combine_bytes=executor.combine_bytes,
        stats=stats, max_abs_error=err, tolerance=tolerance(lay.dtype, ref),
        executor_seconds=t1 - t0, dense_seconds=t2 - t1,
    )
