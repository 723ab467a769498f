"""Decode KV reservations: a request holds KV on its decode rank from its placement there
(``before_prefill``: before its prefill, as SGLang's PD decode server pre-allocates it; else
once prefilled) until it finishes, is retracted or loses its rank. `reserve` offers the
reservation queue, `place` runs the decode balancer, `unreserve` / `release` give KV back."""

from __future__ import annotations

import numpy as np

from eplb.evaluation.serving.balancers import RequestBatch
from eplb.evaluation.serving.simulator.requests import Requests
from eplb.evaluation.serving.simulator.router.queue_order import (
    OFFER_CAP,
    assign,
    offer_head,
    requeue,
)
from eplb.evaluation.serving.simulator.router.state import RouterState

__all__ = ["place", "release", "reservation", "reserve", "unreserve"]


def reservation(st: RouterState, req: Requests, idx: np.ndarray) -> np.ndarray:
    """``int64[m]``: decode KV tokens the requests ``idx`` reserve: prompt (+ tokens made so
    far) + the output still to come, at most ``reserved_decode_tokens`` of it."""
    rest = req.out[idx] - req.gen[idx]
    if st.settings.reserve_out is not None:
        rest = np.minimum(rest, st.settings.reserve_out)
    return req.p_len[idx] + rest


def place(st: RouterState, req: Requests, idx: np.ndarray) -> np.ndarray:
    """Offer the requests ``idx`` to the decode balancer with their reservations; the placed
    ones hold KV on their rank (``d_phase`` 1). ``int64[m]`` global decode ranks (-1: none)."""
    s = st.settings
    kv = reservation(st, req, idx)
    req.d_kv[idx] = kv
    batch = RequestBatch(
        req.p_len[idx],
        None,
        np.maximum(req.out[idx] - req.gen[idx], 0),
        kv,
        tuple(req.hashes[i] for i in idx.tolist())
        if st.d_state.caches is not None and req.hashes
        else None,
        idx,
    )
    du = s.decode
    ranks = assign(s.policy, du.balancer, batch, st.d_state, st.d_rng, du.balancer_options)
    sel = ranks >= 0
    if sel.any():
        got, g = idx[sel], ranks[sel]
        v, r = np.divmod(g, s.Gd)
        req.d_unit[got], req.d_rank[got] = v, r
        req.d_phase[got] = 1
        np.add.at(st.d_prompt, g, req.p_len[got].astype(np.float64))
        np.add.at(st.d_res_blocks, g, (-(-kv[sel] // s.block_size)).astype(np.float64))
    return ranks


def reserve(st: RouterState, req: Requests, fresh=()) -> tuple[list[int], list[int]]:
    """``before_prefill``: reserve decode KV for the head of the reservation queue (when the
    decode view changed since it was last offered) and the ``fresh`` arrivals (the decode
    balancer picks the rank). One-token outputs need no decode KV: they pass, in their turn
    (under ``fcfs`` not past a request still waiting). Returns the reserved ones, ``(late,
    fresh)``: from the queue and from ``fresh``; they go on to the prefill balancer."""
    policy = st.settings.policy
    changed = st.d_version != st.r_offered
    offer, old, skipped = offer_head(policy, st.r_wait, changed, fresh, OFFER_CAP * 4)
    if st.r_wait and changed:
        st.r_offered = st.d_version
    if offer:
        idx = np.fromiter(offer, dtype=np.int64, count=len(offer))
        one = (req.out[idx] - req.gen[idx]) <= 1
        ranks = np.zeros(idx.size, dtype=np.int64)  # one-token ones: placed (0)
        multi = np.flatnonzero(~one)
        if multi.size:
            ranks[multi] = place(st, req, idx[multi])
            if policy != "first_fit":
                miss = multi[ranks[multi] < 0]
                if miss.size:
                    later = one & (np.arange(idx.size) > miss[0])
                    ranks[later] = -1
        requeue(st.r_wait, offer, old, ranks)
        late = [i for j, i in enumerate(offer) if j < old and ranks[j] >= 0]
        placed = [i for j, i in enumerate(offer) if j >= old and ranks[j] >= 0]
    else:
        late = placed = []
    st.r_wait.extend(skipped)
    return late, placed


def unreserve(st: RouterState, g, kv) -> None:
    """Take reservations of ``kv`` tokens off decode ranks ``g`` (balancer view)."""
    state, bs = st.d_state, st.settings.block_size
    g = np.atleast_1d(np.asarray(g, dtype=np.int64))
    kv = np.atleast_1d(np.asarray(kv, dtype=np.float64))
    if g.size == 1:
        r, k = int(g[0]), float(kv[0])
        b = -(-k // bs)
        for arr, d in (
            (state.num_requests, 1.0),
            (state.running_tokens, k),
            (state.kv_blocks_used, b),
            (state.attention_cost, k),
            (st.d_res_blocks, b),
        ):
            arr[r] = max(arr[r] - d, 0.0)
        return
    lo = int(g.min())
    n = int(g.max()) - lo + 1
    gl = g - lo
    sl = slice(lo, lo + n)
    count = np.bincount(gl, minlength=n)
    toks = np.bincount(gl, kv, n)
    blocks = np.bincount(gl, -(-kv // bs), n)
    for arr, d in (
        (state.num_requests, count),
        (state.running_tokens, toks),
        (state.kv_blocks_used, blocks),
        (state.attention_cost, toks),
        (st.d_res_blocks, blocks),
    ):
        part = arr[sl]
        part -= d
        np.maximum(part, 0.0, out=part)


def release(st: RouterState, req: Requests, i: int) -> None:
    """Request ``i`` gives up its decode reservation (it is not running)."""
    g = int(req.d_unit[i] * st.settings.Gd + req.d_rank[i])
    if g < 0:
        return
    if req.d_phase[i] == 1:
        st.d_prompt[g] = max(st.d_prompt[g] - float(req.p_len[i]), 0.0)
    req.d_phase[i] = 0
    unreserve(st, g, float(req.d_kv[i]))
    st.d_version += 1
