"""A single MoE layer: router plus E routed SwiGLU experts, and its dense single-device forward.

`MoELayer` is the ground truth the reference executor is checked against. Router contract: every
token picks ``K`` distinct experts (`check_topk` refuses duplicates). See docs/core.md, section
"The layer".
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, DTypeLike
from scipy.special import expit

from eplb.args import as_float_array, as_int_array, check_seed
from eplb.errors import InputError
from eplb.safeload import check_size

SCORINGS = ("softmax", "sigmoid")
DTYPES = (np.float32, np.float64)


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InputError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def swiglu(x: np.ndarray, w1: np.ndarray, w3: np.ndarray, w2: np.ndarray) -> np.ndarray:
    """One expert's FFN: ``(silu(x @ w1) * (x @ w3)) @ w2``.

    ``x: float[n, H]``, ``w1, w3: float[H, F]``, ``w2: float[F, H]`` -> ``float[n, H]``.
    ``silu(z) = z * sigmoid(z)`` (computed with a stable sigmoid, no overflow warnings).
    """
    gate = x @ w1
    gate *= expit(gate)
    gate *= x @ w3
    return gate @ w2


def check_topk(
    topk_ids: ArrayLike,
    topk_weights: ArrayLike,
    *,
    num_tokens: int,
    num_experts: int,
    dtype: DTypeLike = np.float64,
) -> tuple[np.ndarray, np.ndarray]:
    """Check routing decisions; returns ``(int64[N, K], dtype[N, K])``.

    ``topk_ids: int[N, K]`` expert ids in ``0..E-1``, distinct within each token;
    ``topk_weights: float[N, K]`` finite router weights. Raises `InputError` naming the token.
    """
    ids = as_int_array("topk_ids", topk_ids)
    if ids.ndim != 2 or ids.shape[0] != num_tokens:
        raise InputError(
            f"topk_ids must be int[{num_tokens}, K] (one row per token), got {ids.shape}"
        )
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise InputError(f"topk_ids must hold integer expert ids, got dtype {ids.dtype}")
    ids = ids.astype(np.int64, copy=False)
    if ids.size and (ids.min() < 0 or ids.max() >= num_experts):
        bad = np.argwhere((ids < 0) | (ids >= num_experts))[0]
        raise InputError(
            f"topk_ids[{bad[0]}, {bad[1]}] is {ids[tuple(bad)]}, "
            f"outside experts 0..{num_experts - 1}"
        )
    if ids.shape[1] > 1 and ids.size:
        srt = np.sort(ids, axis=1)
        dup = srt[:, 1:] == srt[:, :-1]
        if dup.any():
            n, j = (int(i) for i in np.argwhere(dup)[0])
            e = int(srt[n, j])
            ks = np.flatnonzero(ids[n] == e).tolist()
            raise InputError(
                f"token {n} picks expert {e} more than once (top-k positions {ks}); the router "
                "contract gives K distinct experts per token, so deduplicate topk_ids"
            )
    w = as_float_array("topk_weights", topk_weights, dtype)
    if w.shape != ids.shape:
        raise InputError(f"topk_weights has shape {w.shape}, expected {ids.shape} like topk_ids")
    if w.size and not np.isfinite(w).all():
        n, k = (int(i) for i in np.argwhere(~np.isfinite(w))[0])
        raise InputError(f"topk_weights[{n}, {k}] is {w[n, k]}; router weights must be finite")
    return ids, w


class MoELayer:
    """``E`` routed SwiGLU experts (hidden ``H``, FFN width ``F``) with a top-``K`` router.

    Public arrays (dtype ``dtype``): ``w1, w3: [E, H, F]``, ``w2: [E, F, H]``, router
    ``gate: [H, E]`` and ``router_bias: [E]`` (added to the logits; zeros unless set, e.g. to
    skew expert popularity). Weights are ``N(0, 1/fan_in)`` from ``default_rng(seed)``.

    Routing (`route`): ``softmax`` scores (DeepSeek-V2/Qwen style, weights are the raw
    probabilities of the picks) or ``sigmoid`` scores (DeepSeek-V3 style, weights normalised to
    sum 1 per token). With ``num_groups``, experts form ``num_groups`` equal groups of
    consecutive ids; each token first keeps its ``topk_groups`` best groups (group score: best
    expert for softmax, sum of the best two for sigmoid, as DeepSeek-V2/V3) and picks its top-K
    inside them. Ties break towards the lower id (stable sort), so routing is deterministic.
    """

    def __init__(
        self,
        num_experts: int,
        hidden: int,
        ffn: int,
        top_k: int,
        num_groups: int | None = None,
        topk_groups: int | None = None,
        seed: int = 0,
        dtype: DTypeLike = np.float32,
        scoring: str = "softmax",
    ) -> None:
        E = self.num_experts = _positive_int("num_experts", num_experts)
        H = self.hidden = _positive_int("hidden", hidden)
        F = self.ffn = _positive_int("ffn", ffn)
        K = self.top_k = _positive_int("top_k", top_k)
        if K > E:
            raise InputError(f"top_k {K} exceeds num_experts {E}; a token picks distinct experts")
        try:
            dt = np.dtype(dtype)
        except (TypeError, ValueError):
            raise InputError(f"dtype must be float32 or float64, got {dtype!r}") from None
        if dt not in [np.dtype(d) for d in DTYPES]:
            raise InputError(f"dtype must be float32 or float64, got {dt}")
        self.dtype = dt
        check_size(f"MoELayer weights ({E} experts, hidden {H}, ffn {F})", (E, 3 * H, F),
                   dt.itemsize, error=InputError)
        if not isinstance(scoring, str) or scoring not in SCORINGS:
            raise InputError(f"scoring must be one of {', '.join(SCORINGS)}, got {scoring!r}")
        self.scoring = scoring
        if num_groups is None:
            if topk_groups is not None:
                raise InputError(
                    "topk_groups needs num_groups (experts per group = E / num_groups)"
                )
        else:
            num_groups = _positive_int("num_groups", num_groups)
            if E % num_groups:
                raise InputError(f"num_groups {num_groups} does not divide num_experts {E}")
            topk_groups = num_groups if topk_groups is None else topk_groups
            topk_groups = _positive_int("topk_groups", topk_groups)
            if topk_groups > num_groups:
                raise InputError(f"topk_groups {topk_groups} exceeds num_groups {num_groups}")
            if topk_groups * (E // num_groups) < K:
                raise InputError(
                    f"topk_groups {topk_groups} x {E // num_groups} experts per group is fewer "
                    f"than top_k {K}; raise topk_groups"
                )
        self.num_groups, self.topk_groups = num_groups, topk_groups
        self.seed = check_seed("seed", seed)
        rng = np.random.default_rng(seed)
        self.gate = (rng.standard_normal((H, E)) / np.sqrt(H)).astype(dt)
        self.router_bias = np.zeros(E, dtype=dt)
        self.w1 = (rng.standard_normal((E, H, F)) / np.sqrt(H)).astype(dt)
        self.w3 = (rng.standard_normal((E, H, F)) / np.sqrt(H)).astype(dt)
        self.w2 = (rng.standard_normal((E, F, H)) / np.sqrt(F)).astype(dt)

    # ------------------------------------------------------------------ sizes
    @property
    def expert_bytes(self) -> int:
        """Bytes of one expert's weights (``w1``, ``w3``, ``w2``)."""
        return 3 * self.hidden * self.ffn * self.dtype.itemsize

    @property
    def flops_per_pick(self) -> int:
        """FLOPs of one token through one expert: three ``H x F`` matmuls, 2 FLOPs per MAC."""
        return 6 * self.hidden * self.ffn

    def __repr__(self) -> str:
        groups = f", {self.num_groups} groups (top {self.topk_groups})" if self.num_groups else ""
        return (
            f"MoELayer({self.num_experts} experts, hidden {self.hidden}, ffn {self.ffn}, "
            f"top-{self.top_k} {self.scoring}{groups}, {self.dtype})"
        )

    # ---------------------------------------------------------------- inputs
    def check_x(self, x: ArrayLike) -> np.ndarray:
        """``x: float[N, H]`` as a C-contiguous array of the layer's dtype."""
        arr = as_float_array("x", x, self.dtype)
        if arr.ndim != 2 or arr.shape[1] != self.hidden:
            raise InputError(f"x must be [tokens, hidden={self.hidden}], got shape {arr.shape}")
        return np.ascontiguousarray(arr)

    # ---------------------------------------------------------------- router
    def scores(self, x: ArrayLike) -> np.ndarray:
        """``float[N, E]``: router scores of ``x: float[N, H]`` (softmax or sigmoid of
        ``x @ gate + router_bias``)."""
        x = self.check_x(x)
        logits = x @ self.gate + self.router_bias
        if self.scoring == "sigmoid":
            return expit(logits)
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        return p

    def route(self, x: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        """Top-K routing of ``x: float[N, H]``: ``(topk_ids: int64[N, K], topk_weights:
        float[N, K])``, distinct ids per token."""
        s = self.scores(x)
        N, E, K = s.shape[0], self.num_experts, self.top_k
        choice = s
        if self.num_groups is not None and self.topk_groups < self.num_groups:
            ng = self.num_groups
            grouped = s.reshape(N, ng, E // ng)
            if self.scoring == "softmax" or E // ng == 1:
                gscore = grouped.max(axis=-1)
            else:
                gscore = np.sort(grouped, axis=-1)[..., -2:].sum(-1)
            keep = np.argsort(-gscore, axis=1, kind="stable")[:, : self.topk_groups]
            mask = np.zeros((N, ng), dtype=bool)
            np.put_along_axis(mask, keep, True, axis=1)
            choice = np.where(np.repeat(mask, E // ng, axis=1), s, -np.inf)
        ids = np.argsort(-choice, axis=1, kind="stable")[:, :K].astype(np.int64)
        w = np.take_along_axis(s, ids, axis=1)
        if self.scoring == "sigmoid":
            w = w / w.sum(axis=1, keepdims=True)
        return ids, w.astype(self.dtype, copy=False)

    # ------------------------------------------------------------ the truth
    def expert(self, e: int, x: np.ndarray) -> np.ndarray:
        """Expert ``e`` applied to ``x: float[n, H]`` -> ``float[n, H]``."""
        return swiglu(x, self.w1[e], self.w3[e], self.w2[e])

    def dense_forward(
        self, x: ArrayLike, topk_ids: ArrayLike, topk_weights: ArrayLike
    ) -> np.ndarray:
        """Single-device reference: ``out[n] = sum_k w[n, k] * expert_{ids[n, k]}(x[n])``.

        ``x: float[N, H]``, ``topk_ids: int[N, K]`` (distinct per token), ``topk_weights:
        float[N, K]`` -> ``float[N, H]`` in the layer's dtype. Loops over experts, each one
        applied to the tokens that picked it.
        """
        x = self.check_x(x)
        ids, w = check_topk(
            topk_ids, topk_weights, num_tokens=x.shape[0], num_experts=self.num_experts,
            dtype=self.dtype,
        )
        out = np.zeros_like(x)
        for e in np.unique(ids):
            tok, k = np.nonzero(ids == e)
            out[tok] += w[tok, k, None] * self.expert(int(e), x[tok])
        return out
