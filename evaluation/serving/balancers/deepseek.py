"""DeepSeek's DP balancer objectives (DeepSeek-V3/R1 inference system overview, Day 6):

- ``deepseek_prefill``: balance the core-attention computation and the input tokens per GPU.
  Each request adds ``uncached * (cached + uncached / 2)`` attention cost and ``uncached``
  tokens (see `state`).
- ``deepseek_decode``: balance KV-cache usage and request count per GPU (each request adds its
  KV blocks and 1 request).

Both are the same two-objective greedy: normalise each load by its per-rank mean after the batch
(``A``, ``B``), take the requests largest first (by ``max(a_i / A, w * b_i / B)``), and put each
on the fitting rank that minimises the larger of its two normalised loads *after* placing it,
``max((a_r + a_i) / A, w * (b_r + b_i) / B)`` (ties: the smaller sum, then the lower rank). That
is LPT scheduling on the bottleneck of the two objectives; ``w`` (``token_weight`` /
``request_weight``, default 1, 0 ignores the second objective) weighs them.

DeepSeek publishes the objectives, not the algorithm; this greedy is ours.
"""

from __future__ import annotations

import numpy as np

from eplb.errors import InputError
from evaluation.serving.balancers.registry import register
from evaluation.serving.balancers.state import Ledger, RankState, RequestBatch

_TIE = 1e-9  # weight of the sum in the score: breaks ties of the maximum only


def _mean_after(current: np.ndarray, added: np.ndarray, alive: np.ndarray) -> float:
    k = int(alive.sum())
    m = (float(current[alive].sum()) + float(added.sum())) / max(k, 1)
    return m if m > 0 else 1.0


def _greedy(
    led: Ledger,
    a: np.ndarray,
    da: np.ndarray,
    A: float,
    b: np.ndarray,
    db: np.ndarray,
    B: float,
    w: float,
) -> np.ndarray:
    """Largest first onto the fitting rank minimising ``max((a + da) / A, w * (b + db) / B)``;
    ``a``, ``b`` are the ledger's live load arrays, ``da``, ``db`` the requests' increments."""
    n = da.size
    out = np.full(n, -1, dtype=np.int64)
    wb = w / B
    for i in np.argsort(-np.maximum(da / A, wb * db), kind="stable"):
        ok = led.fits(i)
        if ok.any():
            x, y = (a + da[i]) / A, wb * (b + db[i])
            score = np.maximum(x, y) + _TIE * (x + y)
            r = int(np.where(ok, score, np.inf).argmin())
            out[i] = r
            led.place(i, r)
    return out


@register("deepseek_prefill")
def deepseek_prefill(
    requests: RequestBatch, state: RankState, *, seed=0, token_weight: float = 1.0
) -> np.ndarray:
    """Balance core-attention cost and computed (uncached) input tokens per rank."""
    if not token_weight >= 0:
        raise InputError(f"token_weight must be >= 0, got {token_weight!r}")
    led = Ledger(state, requests)
    A = _mean_after(led.att, led.datt, state.alive)
    T = _mean_after(led.tokens, led.dtok, state.alive)
    return _greedy(led, led.att, led.datt, A, led.tokens, led.dtok, T, token_weight)


@register("deepseek_decode")
def deepseek_decode(
    requests: RequestBatch, state: RankState, *, seed=0, request_weight: float = 1.0
) -> np.ndarray:
    """Balance KV-cache blocks in use and request count per rank."""
    if not request_weight >= 0:
        raise InputError(f"request_weight must be >= 0, got {request_weight!r}")
    led = Ledger(state, requests)
    ones = np.ones(len(requests))
    K = _mean_after(led.kv, led.dkv, state.alive)
    N = _mean_after(led.n, ones, state.alive)
    return _greedy(led, led.kv, led.dkv, K, led.n, ones, N, request_weight)
