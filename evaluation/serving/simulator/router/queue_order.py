"""The waiting queues' order (``scheduler.policy``, `SchedulerConfig`): which requests are
offered to a balancer (`offer_head`), which of them it places (`assign`: ``first_fit`` as the
balancer placed them, ``fcfs`` / ``lpm`` a prefix of the queue only) and the queue after it
(`requeue`)."""

from __future__ import annotations

from collections import deque

import numpy as np

from eplb.evaluation.serving import balancers
from eplb.evaluation.serving.balancers import RankState, RequestBatch

__all__ = ["OFFER_CAP", "assign", "offer_head", "requeue"]

OFFER_CAP = 256  # waiting requests offered to a balancer at once (head of the queue)
_FCFS_RUNS = 6  # balancer runs per offer at most under fcfs / lpm (`assign`)


def assign(policy: str, name: str, batch: RequestBatch, state: RankState, rng,
           options: dict) -> np.ndarray:
    """``int64[m]``: the ranks balancer ``name`` gives ``batch`` (-1: none; committed to
    ``state``). ``first_fit``: as the balancer placed them (a newer request that fits may
    overtake an older one that does not). ``fcfs`` / ``lpm``: only a prefix of the queue is
    placed: the balancer's placements before the first request it left out are kept (valid:
    dropping the later ones only lowers loads), then the rest is offered again, its head alone
    if it does not fit beside the others, until the head fits nowhere (at most ``_FCFS_RUNS``
    runs)."""
    if policy == "first_fit":
        ranks = balancers.assign(name, batch, state, seed=rng, commit=False, **options)
        state.add(batch, ranks)
        return ranks
    n = len(batch)
    out = np.full(n, -1, dtype=np.int64)
    pos = 0
    for _ in range(_FCFS_RUNS):
        sub = batch if pos == 0 else batch.take(np.arange(pos, n))
        ranks = balancers.assign(name, sub, state, seed=rng, commit=False, **options)
        miss = np.flatnonzero(ranks < 0)
        k = int(miss[0]) if miss.size else ranks.size
        if k == 0:  # the head did not fit beside the others: alone, so it never starves
            ranks = balancers.assign(
                name, batch.take(np.arange(pos, pos + 1)), state, seed=rng, commit=False,
                **options,
            )
            k = 1 if ranks[0] >= 0 else 0
            if not k:
                break
        out[pos:pos + k] = ranks[:k]
        state.add(batch.take(np.arange(pos, pos + k)), ranks[:k])
        pos += k
        if pos >= n or not miss.size:
            break
    return out


def offer_head(policy: str, queue: deque, changed: bool, fresh,
               cap: int) -> tuple[list[int], int, list[int]]:
    """``(offer, old, skipped)``: the head of ``queue`` (``old`` requests, when something
    changed) and the ``fresh`` requests to offer; under ``fcfs``/``lpm`` fresh requests join
    the back unoffered (``skipped``) while older ones wait unoffered (nothing overtakes)."""
    old = 0
    offer: list[int] = []
    if queue and changed:
        old = min(len(queue), cap)
        offer = [queue[j] for j in range(old)]
    fresh = list(fresh)
    if policy != "first_fit" and len(queue) > old:
        return offer, old, fresh
    offer.extend(fresh)
    return offer, old, []


def requeue(queue: deque, offer: list[int], old: int, ranks) -> None:
    """``queue`` keeps its order: the offered old ones not placed (``ranks < 0``) stay at its
    head, the new ones not placed join its back."""
    if old:
        keep = [queue.popleft() for _ in range(old)]
        for j in range(old - 1, -1, -1):
            if ranks[j] < 0:
                queue.appendleft(keep[j])
    for j in range(old, len(offer)):
        if ranks[j] < 0:
            queue.append(offer[j])
