"""DeepSeek's DP balancer objectives (DeepSeek-V3/R1 inference system overview, Day 6):

- ``deepseek_prefill``: balance the core-attention computation and the input tokens per GPU.
  Each request adds ``uncached * (cached + uncached / 2)`` attention cost and ``uncached``
  tokens (see `state`); the policy places the batch largest first (by the combined size below)
  on the fitting rank minimising ``attention / A + token_weight * tokens / T``, where ``A`` and
  ``T`` are the per-rank means after the batch (LPT greedy on the normalised sum).
- ``deepseek_decode``: balance KV-cache usage and request count per GPU: largest KV first onto
  the fitting rank minimising ``kv_blocks / K + request_weight * requests / N`` (``K``, ``N``
  the per-rank means after the batch).

DeepSeek publishes the objectives, not the algorithm; the greedy here is ours.
"""

from __future__ import annotations

import numpy as np

from eplb.errors import InputError
from evaluation.serving.balancers.registry import register
from evaluation.serving.balancers.state import Ledger, RankState, RequestBatch


def _mean_after(current: np.ndarray, added: np.ndarray, alive: np.ndarray) -> float:
    k = int(alive.sum())
    m = (float(current[alive].sum()) + float(added.sum())) / max(k, 1)
    return m if m > 0 else 1.0


def _greedy(
    led: Ledger, size: np.ndarray, a: np.ndarray, wa: float, b: np.ndarray, wb: float
) -> np.ndarray:
    """Place requests largest ``size`` first on the fitting rank minimising ``wa*a + wb*b``
    (``a``, ``b`` are the ledger's live arrays)."""
    n = size.size
    out = np.full(n, -1, dtype=np.int64)
    for i in np.argsort(-size, kind="stable"):
        ok = led.fits(i)
        if ok.any():
            r = int(np.where(ok, wa * a + wb * b, np.inf).argmin())
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
    size = led.datt / A + token_weight * led.dtok / T
    return _greedy(led, size, led.att, 1.0 / A, led.tokens, token_weight / T)


@register("deepseek_decode")
def deepseek_decode(
    requests: RequestBatch, state: RankState, *, seed=0, request_weight: float = 1.0
) -> np.ndarray:
    """Balance KV-cache blocks in use and request count per rank."""
    if not request_weight >= 0:
        raise InputError(f"request_weight must be >= 0, got {request_weight!r}")
    led = Ledger(state, requests)
    K = _mean_after(led.kv, led.dkv, state.alive)
    N = _mean_after(led.n, np.ones(len(requests)), state.alive)
    size = led.dkv / K + request_weight / N
    return _greedy(led, size, led.kv, 1.0 / K, led.n, request_weight / N)
