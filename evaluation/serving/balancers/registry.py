"""Registry of DP balancers and the entry point `assign`.

A balancer is a function ``fn(requests: RequestBatch, state: RankState, *, seed, **options) ->
int64[n]``: the rank of each request, ``-1`` when it fits no rank now (it waits; the caller
offers it again later, so nothing is dropped or duplicated). It leaves ``state``'s loads alone
(`assign` commits them); ``cache_aware`` updates the router's prefix view ``state.caches`` as it
routes, as SGLang's router does.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from eplb.errors import InputError
from eplb.evaluation.serving.balancers.state import RankState, RequestBatch
from eplb.registry import Registry

BalancerFn = Callable[..., np.ndarray]
_REGISTRY: Registry[BalancerFn] = Registry("balancer")


def register(name: str) -> Callable[[BalancerFn], BalancerFn]:
    """Decorator adding a balancer to the registry under ``name``."""

    def deco(fn: BalancerFn) -> BalancerFn:
        return _REGISTRY.add(name, fn)

    return deco


def unregister(name: str) -> None:
    """Remove balancer ``name`` from the registry."""
    _REGISTRY.remove(name)


def available() -> list[str]:
    """Names of the registered balancers, sorted."""
    return sorted(_REGISTRY)


def get(name: str) -> BalancerFn:
    """The balancer registered as ``name``."""
    return _REGISTRY.get(name)


def options(name: str) -> list[str]:
    """The keyword options balancer ``name`` takes besides ``seed``."""
    params = inspect.signature(get(name)).parameters.values()
    return [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.name != "seed"]


def assign(
    name: str, requests, state: RankState, *, seed=0, commit: bool = True, **opts: Any
) -> np.ndarray:
    """Assign ``requests`` (a `RequestBatch`, a request frame or a `Workload`) to the ranks of
    ``state`` with balancer ``name``; ``int64[n]`` ranks, ``-1`` = waits.

    ``seed``: int, sequence of ints or ``np.random.Generator`` (for ``random`` and
    ``power_of_two``). ``commit``: add the assigned requests' loads to ``state``
    (`RankState.add`), so the next call sees them.
    """
    fn = get(name)
    if not isinstance(state, RankState):
        raise InputError(f"state must be a RankState, got {type(state).__name__}")
    if not isinstance(requests, RequestBatch):
        requests = RequestBatch.from_frame(requests)
    unknown = sorted(set(opts) - set(options(name)))
    if unknown:
        known = options(name)
        raise InputError(
            f"balancer {name} does not take {', '.join(unknown)}; its options are "
            f"{', '.join(known) if known else 'none'}"
        )
    ranks = np.asarray(fn(requests, state, seed=seed, **opts), dtype=np.int64)
    if ranks.shape != (len(requests),):  # pragma: no cover - a policy bug
        raise AssertionError(
            f"balancer {name} returned shape {ranks.shape} for {len(requests)} requests"
        )
    if ranks.size:
        sel = ranks >= 0
        if ranks.min() < -1 or ranks.max() >= state.num_ranks or not state.alive[ranks[sel]].all():
            raise AssertionError(
                f"balancer {name} assigned a request to a dead or unknown rank"
            )  # pragma: no cover - a policy bug
    if commit:
        state.add(requests, ranks)
    return ranks
