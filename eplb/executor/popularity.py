"""Token picks that reproduce an expert popularity: `popularity_picks` draws each token's
``top_k`` distinct experts so that expert ``e`` is picked by a share ``top_k * p_e`` of the
tokens exactly in expectation (``p``: the popularity), hence executed loads converge to the
trace's as tokens grow. Systematic (Madow) sampling over a per-token random expert order;
with expert groups, ``topk_groups`` groups are drawn first the same way (inclusion
``topk_groups * P_g``), then the picks inside them (inclusion ``top_k p_e / (topk_groups
P_g)``, which sums to ``top_k`` over the chosen groups), so every token also keeps the
group limit. Inclusion probabilities above 1 (an expert hotter than one pick per token) are
capped at 1 and the excess spread over the others.
"""

from __future__ import annotations

import numpy as np

from eplb.errors import InputError


def inclusion(weights: np.ndarray, k: int) -> np.ndarray:
    """``float64[..., E]`` inclusion probabilities ``k * w / sum(w)`` per row, capped at 1 with
    the excess spread proportionally over the uncapped entries (rows sum to ``k``)."""
    w = np.asarray(weights, np.float64)
    out = np.zeros_like(w)
    free = w > 0
    need = np.full(w.shape[:-1], float(k))
    for _ in range(w.shape[-1] + 1):
        total = np.where(free, w, 0).sum(-1)
        share = np.divide(need, total, out=np.zeros_like(need), where=total > 0)[..., None]
        pi = np.where(free, w * share, 0.0)
        over = free & (pi >= 1.0)
        if not over.any():
            return out + pi
        out[over] = 1.0
        free &= ~over
        need = k - out.sum(-1)
    return out  # pragma: no cover - every pass caps at least one entry


def _systematic(pi: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """``int64[N, k]`` distinct column indices per row of ``pi: float[N, M]`` (rows summing to
    ``k``, entries <= 1): column ``j`` is chosen with probability ``pi[i, j]``."""
    N, M = pi.shape
    order = np.argsort(rng.random((N, M)), axis=1)  # a random order per row
    cum = np.cumsum(np.take_along_axis(pi, order, axis=1), axis=1)
    cum[:, -1] = k  # exact end despite rounding
    u = rng.random((N, 1)) + np.arange(k)[None, :]  # one point in each unit interval
    pos = np.minimum((cum[:, :, None] <= u[:, None, :]).sum(1), M - 1)  # [N, k]
    return np.take_along_axis(order, pos, axis=1)


def popularity_picks(
    expert_load: np.ndarray,
    num_tokens: int,
    top_k: int,
    rng: np.random.Generator,
    *,
    num_groups: int | None = None,
    topk_groups: int | None = None,
) -> np.ndarray:
    """``int64[num_tokens, top_k]`` distinct expert ids per token whose expected pick counts
    are ``num_tokens * top_k * expert_load / expert_load.sum()`` (where no expert exceeds one
    pick per token); with ``num_groups`` and ``topk_groups`` each token's picks lie in
    ``topk_groups`` of the ``num_groups`` equal blocks of experts (module docstring)."""
    load = np.asarray(expert_load, np.float64)
    E = load.shape[0]
    if not (load >= 0).all() or not np.isfinite(load).all() or load.sum() <= 0:
        raise InputError("expert_load must be finite, >= 0 and not all zero")
    if (load > 0).sum() < top_k:
        raise InputError(f"expert_load has {(load > 0).sum()} experts with load but top_k is "
                         f"{top_k}: each token picks {top_k} distinct experts")
    if num_groups is None or topk_groups is None or topk_groups >= num_groups:
        pi = inclusion(load, top_k)
        return _systematic(np.broadcast_to(pi, (num_tokens, E)).copy(), top_k, rng)
    if E % num_groups:
        raise InputError(f"num_groups {num_groups} does not divide the {E} experts")
    M = E // num_groups
    glo = load.reshape(num_groups, M).sum(1)
    if (glo > 0).sum() < topk_groups:
        raise InputError(f"only {(glo > 0).sum()} expert groups have load but topk_groups is "
                         f"{topk_groups}")
    pg = inclusion(glo, topk_groups)
    groups = _systematic(np.broadcast_to(pg, (num_tokens, num_groups)).copy(), topk_groups, rng)
    # experts of the chosen groups, inclusion top_k * p_e / (topk_groups * P_g) each
    cols = (groups[:, :, None] * M + np.arange(M)[None, None, :]).reshape(num_tokens, -1)
    w = load[cols] / np.repeat(pg[groups], M, axis=1)  # p_e / pi_g: sums to top_k/tg... scaled
    pi = inclusion(w, top_k)
    picks = _systematic(pi, top_k, rng)
    return np.take_along_axis(cols, picks, axis=1)
