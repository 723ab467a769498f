"""Requests onto prefill ranks: the head of the waiting queue and the new requests offered to
the prefill balancer in ``scheduler.policy`` order (``lpm``: longest cached prefix first), their
cached prefix from the store or the rank's own cache (loaded from the store first), the placed
ones handed to their unit's queue (`route`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from eplb.evaluation.serving.balancers import RequestBatch
from eplb.evaluation.serving.simulator.prefill import PrefillUnit
from eplb.evaluation.serving.simulator.records import Records
from eplb.evaluation.serving.simulator.requests import Requests
from eplb.evaluation.serving.simulator.router.queue_order import (
    OFFER_CAP,
    assign,
    offer_head,
    requeue,
)
from eplb.evaluation.serving.simulator.router.state import RouterState

__all__ = ["route"]


def route(st: RouterState, req: Requests, rec: Records, units: Sequence[PrefillUnit], t: float,
          fresh=(), late=()) -> list[int]:
    """Offer the head of the waiting queue (when the prefill view changed since it was last
    offered), the ``late`` requests (routed now) and the ``fresh`` arrivals (routed at their
    arrival) to the prefill balancer; the placed ones join their rank's queue (their cached
    prefix loading from the store first), the rest wait in order. Returns the units that were
    given requests, in index order."""
    changed = st.p_version != st.p_offered
    offer, old, skipped = offer_head(st.settings.policy, st.p_wait, changed, [*late, *fresh],
                                     OFFER_CAP)
    if st.p_wait and changed:
        st.p_offered = st.p_version
    if not offer:
        st.p_wait.extend(skipped)
        return []
    idx = np.fromiter(offer, dtype=np.int64, count=len(offer))
    ranks, store_tok = _balance(st, req, idx)
    n_late = len(late) if not skipped else 0
    started = _hand_over(st, req, rec, units, t, idx, ranks, store_tok, old + n_late)
    requeue(st.p_wait, offer, old, ranks)
    st.p_wait.extend(skipped)
    return started


def _balance(st: RouterState, req: Requests, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The prefill balancer's ranks for the requests ``idx: int64[m]`` (-1: none; ``lpm``
    offers the longest cached prefix first) and their prefix tokens in the store,
    ``(ranks, store_tok): int64[m]`` in ``idx``'s order."""
    s = st.settings
    L = req.p_len[idx]
    if req.hashes is not None:
        match = st.store.match
        hs = req.hashes
        store_blocks = np.array([match(hs[i], touch=False) for i in idx.tolist()],
                                dtype=np.int64)
    else:
        store_blocks = np.zeros(idx.size, dtype=np.int64)
    store_tok = np.minimum(store_blocks * s.block_size, L - 1)
    perm = None
    if s.policy == "lpm" and idx.size > 1:
        perm = np.argsort(-store_tok, kind="stable")  # longest cached prefix first
        if (perm == np.arange(perm.size)).all():
            perm = None
    o_idx = idx if perm is None else idx[perm]
    o_store = store_tok if perm is None else store_tok[perm]
    o_L = L if perm is None else L[perm]
    cache_aware = st.p_state.caches is not None
    batch = RequestBatch(
        o_L,
        o_store,
        np.maximum(req.out[o_idx] - req.gen[o_idx], 1),
        None,
        tuple(req.hashes[i] for i in o_idx.tolist()) if cache_aware and req.hashes else None,
        o_idx,
    )
    pu = s.prefill
    o_ranks = assign(s.policy, pu.balancer, batch, st.p_state, st.p_rng, pu.balancer_options)
    if perm is None:
        return o_ranks, store_tok
    ranks = np.empty_like(o_ranks)
    ranks[perm] = o_ranks
    return ranks, store_tok


def _hand_over(st: RouterState, req: Requests, rec: Records, units: Sequence[PrefillUnit],
               t: float, idx: np.ndarray, ranks: np.ndarray, store_tok: np.ndarray,
               first_fresh: int) -> list[int]:
    """The requests ``idx`` placed on ``ranks`` (global; -1: not placed) join their unit's
    queue at ``t``: their cached prefix is the store's (``store_tok``) or the rank's own
    cache's if longer (the balancer's view corrected), the store's part loads first (one load
    at a time per rank); recorded. ``idx[first_fresh:]`` not retried are routed at their
    arrival. Returns the units given requests, in index order."""
    s = st.settings
    state = st.p_state
    L = req.p_len[idx]
    started = set()
    ranks_l, store_l, L_l = ranks.tolist(), store_tok.tolist(), L.tolist()
    fresh_l = (req.retries[idx] == 0).tolist()
    arrival, hashes, local = req.arrival_l, req.hashes, st.local
    store_match = st.store.match
    Gp, bs, kvb, load_bw, loader_busy = s.Gp, s.block_size, s.kv_bytes, s.load_bw, st.loader_busy
    sel, cached, loaded, routed_s, units_, ranks_ = [], [], [], [], [], []
    for j, i in enumerate(idx.tolist()):
        g = ranks_l[j]
        if g < 0:
            continue
        u, r = divmod(g, Gp)
        c_store = store_l[j]
        c = c_store
        c_local = 0
        Lj = L_l[j]
        if hashes is not None:
            store_match(hashes[i])  # the counted, touching lookup
            if local is not None:
                c_local = min(local.touch(g, hashes[i]) * bs, Lj - 1)
                c = max(c, c_local)
        if c != c_store:  # the local cache covered more than the router knew
            u0, u1 = Lj - c_store, Lj - c
            state.queued_tokens[g] -= u0 - u1
            state.attention_cost[g] += u1 * (c + u1 / 2) - u0 * (c_store + u0 / 2)
        routed = arrival[i] if j >= first_fresh and fresh_l[j] else t
        ready = routed
        load_tok = c_store - c_local if c_store > c_local else 0
        if load_tok > 0:
            busy = float(loader_busy[g])
            ready = (routed if routed >= busy else busy) + load_tok * kvb / load_bw
            loader_busy[g] = ready
        sel.append(j)
        cached.append(c)
        loaded.append(load_tok)
        routed_s.append(routed)
        units_.append(u)
        ranks_.append(r)
        units[u].enqueue(r, i, Lj - c, c, ready)
        started.add(u)
    if sel:
        got = idx[sel]
        rec.cached[got] = cached
        rec.store_tokens[got] = loaded
        rec.routed_s[got] = routed_s
        req.p_unit[got] = units_
        req.p_rank[got] = ranks_
        req.p_blocks[got] = -(-L[sel] // bs)
    return sorted(started)
