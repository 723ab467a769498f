"""DeepSeek's DP balancer objectives (Day 6): ``deepseek_prefill`` balances core-attention cost
and input tokens per rank, ``deepseek_decode`` KV blocks and requests per rank, both by one
two-objective largest-first greedy of ours (DeepSeek publishes the objectives, not the
algorithm; docs/serving.md, "DP balancers")."""

from __future__ import annotations

import numpy as np

from eplb.errors import InputError
from eplb.evaluation.serving.balancers.registry import register
from eplb.evaluation.serving.balancers.state import Ledger, RankState, RequestBatch

_TIE = 1e-9  # weight of the sum in the score: breaks ties of the maximum only


def _mean_after(current: np.ndarray, added: np.ndarray, alive: np.ndarray) -> float:
    k = int(alive.sum())
    m = (float(current[alive].sum()) + float(added.sum())) / max(k, 1)
    return m if m > 0 else 1.0


def argmin_from(x: np.ndarray, cursor: int) -> int:
    """The first minimum of ``x: float[R]`` at or after ``cursor``, cyclically (ties rotate
    over the ranks instead of always going to rank 0)."""
    r = int(x.argmin())
    if r >= cursor:  # the first minimum overall lies at or after the cursor
        return r
    j = int(x[cursor:].argmin()) + cursor
    return j if x[j] == x[r] else r


def _greedy(
    led: Ledger,
    a: np.ndarray,
    da: np.ndarray,
    A: float,
    b: np.ndarray,
    db: np.ndarray,
    B: float,
    w: float,
    cursor: int = 0,
) -> np.ndarray:
    """Largest first onto the fitting rank minimising ``max((a + da) / A, w * (b + db) / B)``;
    ``a``, ``b: float64[R]`` are the ledger's live load arrays, ``da``, ``db: float64[n]`` the
    requests' increments; returns ``int64[n]`` ranks (``-1``: waits). Ties go to the first
    tied rank at or after ``cursor`` (cyclic; it moves past each placed request), so equal
    ranks share the work over a run (at light load every rank is empty between steps).

    The decisions of scoring every rank with ``Ledger.fits`` per request (the reference in
    tests/test_serving_balancers.py), in fewer array operations: each score is computed with
    the reference's floating-point operations (so it is bit-equal); the parts of the fit test
    that change only where a request lands (alive, room for a request, an empty token queue)
    and the second objective when every request adds the same to it (decode: one request)
    are kept per rank and updated where a request goes; a capacity test is skipped when the
    most loaded rank passes it (rounding is monotone, so then every rank does)."""
    n = da.size
    out = np.full(n, -1, dtype=np.int64)
    wb = w / B
    order = np.argsort(-np.maximum(da / A, wb * db), kind="stable").tolist()
    if not n:
        return out
    add, div, mul, maximum, greater, putmask = (
        np.add,
        np.divide,
        np.multiply,
        np.maximum,
        np.greater,
        np.putmask,
    )
    inf, tie = np.inf, np.float64(_TIE)
    R = a.size
    alive = led.alive
    unlimited = led.unlimited
    req, kvcap, tok = (led._req, led._kv, led._tok) if not unlimited else (False,) * 3
    n_arr, max_req = led.n, led.max_requests
    # not alive, or (with a request limit) no room for one more request
    nbase = ~alive
    if req:
        nbase |= ~(n_arr + 1 <= max_req)
    nbase_any = bool(nbase.any())
    queued, budget, kv, cap = led.queued, led.budget, led.kv, led.kv_cap
    kv_is_a = a is led.kv and da is led.dkv  # decode: the KV test reuses a + da
    if kvcap:
        kv_top, cap_min = float(kv.max()), float(cap.min())
    if tok:
        nempty = queued != 0
        q_top, budget_min = float(queued.max()), float(budget.min())
        if q_top + float(led.dq.max()) > budget_min:
            # prompts no rank takes now fit nowhere later in the batch either (loads only
            # grow): they wait without being scored
            fit = (queued + led.dq[:, None] <= budget) | ~nempty  # [n, R]
            fit &= ~nbase
            if kvcap:
                fit &= kv + led.dkv[:, None] <= cap
            fits_now = np.logical_or.reduce(fit, 1).tolist()
            order = [i for i in order if fits_now[i]]
    const_b = bool((db == db[0]).all())
    if const_b:
        db0 = db[0]
        yv = wb * (b + db0)  # [R] second objective after placing any request
    da_l, db_l, dq_l, dkv_l = da.tolist(), db.tolist(), led.dq.tolist(), led.dkv.tolist()
    S, X, T = np.empty(R), np.empty(R), np.empty(R)
    NOK, TB = np.empty(R, dtype=bool), np.empty(R, dtype=bool)
    place = led.place
    for i in order:
        add(a, da_l[i], S)
        # NOK: ranks request i does not fit (Ledger.fits negated); None: it fits every rank
        mask = nbase if nbase_any else None
        if kvcap and kv_top + dkv_l[i] > cap_min:
            if kv_is_a:
                greater(S, cap, NOK)
            else:
                add(kv, dkv_l[i], T)
                greater(T, cap, NOK)
            NOK |= nbase
            mask = NOK
        if tok and q_top + dq_l[i] > budget_min:
            add(queued, dq_l[i], T)
            greater(T, budget, TB)
            TB &= nempty
            if mask is None:
                mask = TB
            else:
                if mask is nbase:
                    np.copyto(NOK, nbase)
                    mask = NOK
                mask |= TB
        # score: max(x, y) + TIE * (x + y)
        div(S, A, X)
        if const_b:
            y = yv
        else:
            add(b, db_l[i], T)
            mul(T, wb, T)
            y = T
        maximum(X, y, out=S)
        add(X, y, X)
        mul(X, tie, X)
        add(X, S, X)
        if mask is not None:
            putmask(X, mask, inf)
            r = argmin_from(X, cursor)
            if mask[r] and mask[mask.argmin()]:  # every rank is full for it: it waits
                continue
        else:
            r = argmin_from(X, cursor)
        cursor = r + 1 if r + 1 < R else 0
        out[i] = r
        place(i, r)
        if req:
            full = not (alive[r] and n_arr[r] + 1 <= max_req[r])
            nbase[r] = full
            nbase_any = nbase_any or full
        if kvcap and kv[r] > kv_top:
            kv_top = float(kv[r])
        if tok:
            nempty[r] = queued[r] != 0
            if queued[r] > q_top:
                q_top = float(queued[r])
        if const_b:
            yv[r] = wb * (b[r] + db0)
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
    return _greedy(
        led, led.att, led.datt, A, led.tokens, led.dtok, T, token_weight, state.cursor
    )


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
    return _greedy(led, led.kv, led.dkv, K, led.n, ones, N, request_weight, state.cursor)
