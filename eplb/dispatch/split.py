"""The fixed splits: ``even`` (vLLM's hash), ``random`` (SGLang's dynamic dispatch) and
``weighted`` (by the placement's ``replica_share``). Every source splits an expert's picks over
its replicas in the same proportions, so the expected shares are one ``float64[L, P]`` table
(docs/core.md, "Dispatch policies")."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from eplb.dispatch.base import Dispatch
from eplb.dispatch.tables import even_share
from eplb.placement import Placement

__all__ = ["Even", "Random", "Weighted"]


@dataclass(frozen=True)
class Even(Dispatch):
    """``even``: pick ``n * K + k`` of an expert with ``c`` replicas goes to replica
    ``(n * K + k) % c`` in ascending slot order; expected share ``1 / c`` per replica."""

    name = "even"
    placement_split = True

    def route(self, ids, placement, layer, rank, seed):
        N, K = ids.shape
        cnt = placement.logcnt[layer][ids]
        replica = np.arange(N * K, dtype=np.int64).reshape(N, K) % cnt
        return placement.log2phy[layer][ids, replica]

    def shares(self, placement: Placement, load=None) -> np.ndarray:
        return even_share(placement)


@dataclass(frozen=True)
class Random(Even):
    """``random``: replica ``floor(u * c)``, ``u ~ U[0, 1)`` from ``default_rng([seed,
    layer])``; expected share ``1 / c`` per replica."""

    name = "random"
    placement_split = False

    def route(self, ids, placement, layer, rank, seed):
        cnt = placement.logcnt[layer][ids]
        u = np.random.default_rng([seed, layer]).random(ids.shape)
        replica = np.minimum((u * cnt).astype(np.int64), cnt - 1)
        return placement.log2phy[layer][ids, replica]


@dataclass(frozen=True)
class Weighted(Dispatch):
    """``weighted``: the same ``u`` as ``random`` through the cumulative ``replica_share`` of
    the expert's replicas; expected share the placement's ``share`` (even without shares)."""

    name = "weighted"

    def route(self, ids, placement, layer, rank, seed):
        l2p = placement.log2phy[layer]
        cnt = placement.logcnt[layer][ids]
        u = np.random.default_rng([seed, layer]).random(ids.shape)
        share = placement.share[layer]  # [P]
        shares = np.where(l2p >= 0, share[np.maximum(l2p, 0)], 0.0)  # [E, R]
        cum = np.cumsum(shares, axis=1)
        cum /= cum[:, -1:]
        # first replica whose cumulative share exceeds u
        replica = np.minimum((u[..., None] >= cum[ids]).sum(-1), cnt - 1)
        return l2p[ids, replica]

    def shares(self, placement: Placement, load=None) -> np.ndarray:
        return placement.share
