"""Load-oblivious and load-aware online policies: each request in arrival order goes to one rank
that fits (see `state` for "fits"); ``-1`` when none does.

- ``round_robin``: the next rank that fits at or after ``state.cursor`` (cyclic).
- ``random``: uniform over the ranks that fit.
- ``least_requests`` / ``least_tokens``: fewest requests / least token load (queued plus
  running tokens); ties to the lowest rank.
- ``power_of_two``: two distinct fitting ranks drawn at random, the less loaded one wins
  (``metric="requests"`` or ``"tokens"``); Mitzenmacher's power of two choices.
"""

from __future__ import annotations

import numpy as np

from eplb.errors import InputError
from eplb.evaluation.serving.balancers.registry import register
from eplb.evaluation.serving.balancers.state import Ledger, RankState, RequestBatch, make_rng

METRICS = ("requests", "tokens")


def metric_array(ledger: Ledger, metric: str) -> np.ndarray:
    """The ledger's live load array for ``metric`` (``requests`` or ``tokens``)."""
    if metric == "requests":
        return ledger.n
    if metric == "tokens":
        return ledger.tokens
    raise InputError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")


def _argmin_where(ok: np.ndarray, values: np.ndarray) -> int:
    """The rank with the least ``values: float[R]`` among ``ok: bool[R]`` (first on ties)."""
    return int(np.where(ok, values, np.inf).argmin())


@register("round_robin")
def round_robin(requests: RequestBatch, state: RankState, *, seed=0) -> np.ndarray:
    """The next fitting rank at or after the cursor; the cursor moves past it."""
    led = Ledger(state, requests)
    n, R = len(requests), state.num_ranks
    out = np.full(n, -1, dtype=np.int64)
    cur = state.cursor
    for i in range(n):
        ok = led.fits(i)
        idx = np.flatnonzero(ok)
        if not idx.size:
            continue
        k = int(np.searchsorted(idx, cur))
        r = int(idx[k if k < idx.size else 0])
        out[i] = r
        led.place(i, r)
        cur = (r + 1) % R
    return out


@register("random")
def random(requests: RequestBatch, state: RankState, *, seed=0) -> np.ndarray:
    """Uniform over the fitting ranks."""
    rng = make_rng(seed)
    led = Ledger(state, requests)
    n = len(requests)
    if led.unlimited:
        idx = np.flatnonzero(state.alive)
        if not idx.size:
            return np.full(n, -1, dtype=np.int64)
        return idx[rng.integers(0, idx.size, size=n)].astype(np.int64)
    out = np.full(n, -1, dtype=np.int64)
    for i in range(n):
        idx = np.flatnonzero(led.fits(i))
        if idx.size:
            r = int(idx[rng.integers(idx.size)])
            out[i] = r
            led.place(i, r)
    return out


def _least(requests: RequestBatch, state: RankState, metric: str) -> np.ndarray:
    led = Ledger(state, requests)
    load = metric_array(led, metric)
    out = np.full(len(requests), -1, dtype=np.int64)
    for i in range(len(requests)):
        ok = led.fits(i)
        if ok.any():
            r = _argmin_where(ok, load)
            out[i] = r
            led.place(i, r)
    return out


@register("least_requests")
def least_requests(requests: RequestBatch, state: RankState, *, seed=0) -> np.ndarray:
    """The fitting rank with the fewest requests (lowest rank on ties)."""
    return _least(requests, state, "requests")


@register("least_tokens")
def least_tokens(requests: RequestBatch, state: RankState, *, seed=0) -> np.ndarray:
    """The fitting rank with the least queued plus running tokens (lowest rank on ties)."""
    return _least(requests, state, "tokens")


@register("power_of_two")
def power_of_two(
    requests: RequestBatch, state: RankState, *, seed=0, metric: str = "requests"
) -> np.ndarray:
    """Two distinct fitting ranks at random; the one with the lower ``metric`` load (the first
    drawn on ties)."""
    rng = make_rng(seed)
    led = Ledger(state, requests)
    load = metric_array(led, metric)
    out = np.full(len(requests), -1, dtype=np.int64)
    for i in range(len(requests)):
        idx = np.flatnonzero(led.fits(i))
        m = idx.size
        if not m:
            continue
        if m == 1:
            r = int(idx[0])
        else:
            a = int(rng.integers(m))
            b = int(rng.integers(m - 1))
            b += b >= a
            ra, rb = int(idx[a]), int(idx[b])
            r = rb if load[rb] < load[ra] else ra
        out[i] = r
        led.place(i, r)
    return out
