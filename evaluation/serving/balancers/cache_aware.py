"""``cache_aware``: SGLang router's cache-aware policy over DP ranks (``sgl-router``
``policies/cache_aware.rs``): prefix affinity unless the ranks are imbalanced, then the shortest
queue; only ranks a request fits are candidates (docs/serving.md, "DP balancers")."""

from __future__ import annotations

import numpy as np

from eplb.errors import InputError
from eplb.evaluation.serving.balancers.registry import register
from eplb.evaluation.serving.balancers.simple import metric_array
from eplb.evaluation.serving.balancers.state import Ledger, RankState, RequestBatch


@register("cache_aware")
def cache_aware(
    requests: RequestBatch,
    state: RankState,
    *,
    seed=0,
    cache_threshold: float = 0.3,
    balance_abs_threshold: float = 64,
    balance_rel_threshold: float = 1.5,
    metric: str = "requests",
    insert: bool = True,
) -> np.ndarray:
    """Prefix affinity while the load is balanced, shortest queue when it is not."""
    caches = state.caches
    if caches is None:
        raise InputError(
            "cache_aware needs the router's prefix view: RankState(..., "
            "caches=RankCaches(num_ranks, capacity_blocks))"
        )
    if not 0 <= cache_threshold <= 1:
        raise InputError(f"cache_threshold must be in [0, 1], got {cache_threshold!r}")
    if balance_abs_threshold < 0 or balance_rel_threshold < 1:
        raise InputError(
            "balance_abs_threshold must be >= 0 and balance_rel_threshold >= 1, "
            f"got {balance_abs_threshold!r} and {balance_rel_threshold!r}"
        )
    led = Ledger(state, requests)
    load = metric_array(led, metric)
    alive = state.alive
    bs = caches.block_size
    hashes = requests.block_hashes
    inp = requests.input_tokens
    out = np.full(len(requests), -1, dtype=np.int64)
    for i in range(len(requests)):
        ok = led.fits(i)
        if not ok.any():
            continue
        live = load[alive]
        hi, lo = float(live.max()), float(live.min())
        h = hashes[i] if hashes is not None else ()
        if hi - lo > balance_abs_threshold and hi > balance_rel_threshold * lo:
            r = int(np.where(ok, load, np.inf).argmin())
        else:
            matched = caches.match(h)
            rate = np.minimum(matched * bs, inp[i]) / inp[i]
            best = float(np.where(ok, rate, -1.0).max())
            if best > cache_threshold:
                pick = ok & (rate == best)
            else:
                sizes = caches.sizes()
                pick = ok & (sizes == sizes[ok].min())
            r = int(np.where(pick, load, np.inf).argmin())
        out[i] = r
        led.place(i, r)
        if insert and len(h):
            caches.insert(r, h)
    return out
