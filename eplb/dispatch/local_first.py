"""``local_first``: SGLang's static dispatch, a fixed table per source GPU (`dispatch_table`: a
replica on the token's GPU, else on its node, else any; source ``g`` takes candidate ``g %
count``). Its split depends on the source, so its expectations are per source."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from eplb.dispatch import expect
from eplb.dispatch.base import Dispatch
from eplb.dispatch.tables import dispatch_stack, dispatch_table, dispatch_tables
from eplb.placement import Placement

__all__ = ["LocalFirst"]


@dataclass(frozen=True)
class LocalFirst(Dispatch):
    """``local_first``: every pick of expert ``e`` from source GPU ``s`` goes to
    ``dispatch_table[s, e]``."""

    name = "local_first"
    needs_rank = True
    alike = False

    def route(self, ids, placement, layer, rank, seed):
        return dispatch_table(placement, layer)[rank[:, None], ids]

    def slot_picks(self, placement: Placement, source_counts: np.ndarray, *, num_groups: int,
                   topk_groups: int) -> np.ndarray:
        L, P = placement.num_layers, placement.topology.num_slots
        dest = dispatch_tables(placement)  # [L, G, E]
        key = (np.arange(L)[:, None, None] * P + dest).ravel()
        return np.bincount(key, source_counts.ravel(), L * P).reshape(L, -1)

    def expected_visits(self, placement, src, r, q, gid, tick=None):
        topo = placement.topology
        L, G, _ = src.shape
        N, S = topo.num_nodes, topo.slots_per_gpu
        lrow = np.arange(L)[:, None, None]
        base = expect.source_keys(L, G, q.shape[2])
        with np.errstate(divide="ignore"):
            dest = dispatch_stack(placement) // S  # [L, G, E]
            gpu_tokens = np.bincount((lrow * G + dest).ravel(), src.ravel(),
                                     minlength=L * G).reshape(L, G)
            term = np.log1p(-r)  # [L, G, E]
            grp = base + gid[None, None, :]
            miss_g = expect.log_miss(term, grp * G + dest, q, G)
            miss_n = expect.log_miss(term, grp * N + topo.node_of_gpu[dest], q, N)
        return gpu_tokens, miss_g, miss_n
