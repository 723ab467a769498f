"""Requests onto prefill ranks (`route`), by ``scheduler.prefill_admission``:

- ``rank_queues`` (`dispatch`): every new (or requeued) request goes at once to the rank the
  prefill balancer picks, into that rank's unbounded first-come-first-served queue, as SGLang's
  PD prefill server runs it (sglang v0.5.23, ``python/sglang/srt/managers/
  data_parallel_controller.py``: the controller's event loop dispatches each request to one DP
  rank on receipt, no queue in front of the ranks; ``max_queued_requests`` "ignored when using
  disaggregation-mode", ``arg_groups/fields/schedule.py``). Under ``before_prefill`` a request
  whose decode KV is not reserved yet sits on its rank unready (`hold`), skipped by the steps,
  not blocking the ones behind it, as SGLang's ``PrefillBootstrapQueue.pop_bootstrapped``
  (``disaggregation/prefill.py``) moves every bootstrapped request on, whatever its place.
- ``global_queue``: the head of the waiting queue and the new requests offered to the prefill
  balancer in ``scheduler.policy`` order (``lpm``: longest cached prefix first), a rank taking
  at most ``token_budget`` queued tokens (the simulator's former rule, not SGLang's).

Either way a request's cached prefix comes from the store or the rank's own cache (loaded from
the store first) and the placed ones are handed to their unit's queue."""

from __future__ import annotations

import math
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
from eplb.evaluation.serving.steptime.chunking import CACHED, READY, TODO

__all__ = ["dispatch", "hold_cleared", "look_up", "route"]


def route(st: RouterState, req: Requests, rec: Records, units: Sequence[PrefillUnit], t: float,
          fresh=(), late=()) -> list[int]:
    """``rank_queues``: `dispatch` (``late`` must be empty). ``global_queue``: offer the head
    of the waiting queue (when the prefill view changed since it was last offered), the
    ``late`` requests (routed now) and the ``fresh`` arrivals (routed at their arrival) to the
    prefill balancer; the placed ones join their rank's queue (their cached prefix loading
    from the store first), the rest wait in order. Returns the units that were given
    requests, in index order."""
    if st.settings.rank_queues:
        return dispatch(st, req, rec, units, t, fresh)
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


def dispatch(st: RouterState, req: Requests, rec: Records, units: Sequence[PrefillUnit],
             t: float, fresh=()) -> list[int]:
    """``rank_queues``: the requeued requests (``p_wait``, routed now) and the ``fresh``
    arrivals (routed at their arrival) join the back of the queues of the ranks the prefill
    balancer picks; a rank's queue is unbounded, so only a unit with no live
    rank leaves any waiting (in ``p_wait``). Under ``before_prefill`` those whose decode KV is
    not reserved yet join unready (``held``). Returns the units given ready requests."""
    old = len(st.p_wait)
    offer = list(st.p_wait)
    offer.extend(fresh)
    if not offer:
        return []
    st.p_wait.clear()
    st.p_offered = st.p_version
    idx = np.fromiter(offer, dtype=np.int64, count=len(offer))
    ranks, store_tok = _balance(st, req, idx)
    started = _hand_over(st, req, rec, units, t, idx, ranks, store_tok, old)
    st.p_wait.extend(i for i, r in zip(offer, ranks.tolist(), strict=True) if r < 0)
    return started


def hold_cleared(st: RouterState, units: Sequence[PrefillUnit], idx, t: float) -> list[int]:
    """``rank_queues`` + ``before_prefill``: the requests ``idx`` hold their decode reservation
    (or need none) at ``t``: those waiting on a prefill rank become ready there (once their
    cached prefix is loaded), the others join a rank ready when dispatched. Returns the units
    with a request made ready."""
    woken = set()
    held = st.held
    for i in idx:
        got = held.pop(i, None)
        if got is None:
            st.cleared.add(i)
            continue
        u, entry, loaded = got
        if i not in st.unlooked:  # (else ready once `look_up` has looked it up)
            entry[READY] = loaded if loaded > t else t
        woken.add(u)
    return sorted(woken)


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
    if s.policy == "lpm" and idx.size > 1 and not s.rank_queues:
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
    # rank_queues: every live rank has room, so the balancer's placements stand as they are
    policy = "first_fit" if s.rank_queues else s.policy
    o_ranks = assign(policy, pu.balancer, batch, st.p_state, st.p_rng, pu.balancer_options)
    if perm is None:
        return o_ranks, store_tok
    ranks = np.empty_like(o_ranks)
    ranks[perm] = o_ranks
    return ranks, store_tok


def _hand_over(st: RouterState, req: Requests, rec: Records, units: Sequence[PrefillUnit],
               t: float, idx: np.ndarray, ranks: np.ndarray, store_tok: np.ndarray,
               first_fresh: int) -> list[int]:
    """The requests ``idx`` placed on ``ranks`` (global; -1: not placed) join their unit's
    queue at ``t``; ``idx[first_fresh:]`` not retried are routed at their arrival; recorded.
    ``global_queue``: their cached prefix is looked up now (`_look_up`). ``rank_queues``: it
    is looked up when their rank may schedule them (`look_up`, as SGLang matches a prefix
    when it builds a batch), the balancer's view holding the store's estimate
    (``store_tok``) until then; under ``before_prefill`` those not ``cleared`` join unready
    (``held``). Returns the units given ready requests, in index order."""
    s = st.settings
    holding = s.rank_queues and s.before
    lazy = s.rank_queues and req.hashes is not None
    held, cleared, unlooked = st.held, st.cleared, st.unlooked
    L = req.p_len[idx]
    started = set()
    ranks_l, store_l, L_l = ranks.tolist(), store_tok.tolist(), L.tolist()
    fresh_l = (req.retries[idx] == 0).tolist()
    arrival = req.arrival_l
    Gp = s.Gp
    sel, cached, loaded, routed_s, units_, ranks_ = [], [], [], [], [], []
    for j, i in enumerate(idx.tolist()):
        g = ranks_l[j]
        if g < 0:
            continue
        u, r = divmod(g, Gp)
        Lj = L_l[j]
        routed = arrival[i] if j >= first_fresh and fresh_l[j] else t
        if lazy:  # unready until `look_up`
            c, load_tok, ready = store_l[j], 0, math.inf
            unlooked.add(i)
        else:
            c, load_tok, ready = _look_up(st, req, g, i, Lj, store_l[j], routed)
        sel.append(j)
        cached.append(c)
        loaded.append(load_tok)
        routed_s.append(routed)
        units_.append(u)
        ranks_.append(r)
        hold = holding and i not in cleared
        entry = units[u].enqueue(r, i, Lj - c, c, math.inf if hold else ready)
        if hold:
            held[i] = (u, entry, ready)
        else:
            cleared.discard(i)
            started.add(u)
    if sel:
        got = idx[sel]
        rec.cached[got] = cached
        rec.store_tokens[got] = loaded
        rec.routed_s[got] = routed_s
        req.p_unit[got] = units_
        req.p_rank[got] = ranks_
        req.p_blocks[got] = -(-L[sel] // s.block_size)
    return sorted(started)


def _look_up(st: RouterState, req: Requests, g: int, i: int, L: int, c_est: int,
             t: float) -> tuple[int, int, float]:
    """Request ``i`` (``L`` prompt tokens) on global prefill rank ``g`` looks up its prefix at
    ``t``: cached tokens are the larger of the store's hit and the rank's own cache's (at most
    ``L - 1``), the balancer's view corrected from its estimate ``c_est``; the store's part
    beyond the rank's own loads first (one load at a time per rank). Returns ``(cached,
    loaded_tokens, ready_s)``."""
    s, hashes, local = st.settings, req.hashes, st.local
    bs = s.block_size
    c_store = c_est
    c_local = 0
    if hashes is not None:
        c_store = min(st.store.match(hashes[i]) * bs, L - 1)  # the counted, touching lookup
        if local is not None:
            c_local = min(local.touch(g, hashes[i]) * bs, L - 1)
    c = c_store if c_store >= c_local else c_local
    if c != c_est:  # the caches cover more (or less) than the router estimated
        state = st.p_state
        u0, u1 = L - c_est, L - c
        state.queued_tokens[g] -= u0 - u1
        state.attention_cost[g] += u1 * (c + u1 / 2) - u0 * (c_est + u0 / 2)
    ready = t
    load_tok = c_store - c_local if c_store > c_local else 0
    if load_tok > 0:
        busy = float(st.loader_busy[g])
        ready = (t if t >= busy else busy) + load_tok * s.kv_bytes / s.load_bw
        st.loader_busy[g] = ready
    return c, load_tok, ready


LOOK_AHEAD = 2  # steps' token budgets at the head of a rank's queue that have looked up


def look_up(st: RouterState, req: Requests, rec: Records, unit: PrefillUnit, t: float) -> None:
    """``rank_queues``: before ``unit``'s next step at ``t``, the prompts within `LOOK_AHEAD`
    steps' token budgets of each rank's queue head (past the ``held`` ones) look up their
    cached prefix (`_look_up`), as SGLang matches a request's prefix when it comes up for a
    batch: only then may a prompt be scheduled (its entry is unready before), once its
    cached blocks have loaded from the store (the next step's prompts load during this one).
    Their entries and records follow."""
    unlooked = st.unlooked
    if not unlooked:
        return
    g0 = unit.index * unit.G
    window = LOOK_AHEAD * unit.budget
    held, p_len = st.held, req.p_len
    for r, q in enumerate(unit.queues):
        left = window
        for e in q:
            i = e[0]
            if i in held:  # no decode reservation yet: skipped, not blocking
                continue
            if i in unlooked:
                unlooked.discard(i)
                L = int(p_len[i])
                c, load_tok, ready = _look_up(st, req, g0 + r, i, L, e[CACHED], t)
                e[CACHED], e[TODO], e[READY] = c, L - c, ready
                rec.cached[i], rec.store_tokens[i] = c, load_tok
            left -= e[TODO]
            if left <= 0:
                break
