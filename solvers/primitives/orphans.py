"""Re-homing orphans: after GPUs fail, an expert whose every replica was on them has none left.
`rehome_orphans` gives each such (layer, expert) one slot back with the fewest moves there are,
for the serving simulator's emergency patch and for `solve` with a live placement that lost
replicas (`solvers.analysis.failures`)."""

from __future__ import annotations

import numpy as np

from eplb.errors import InfeasibleError

__all__ = ["rehome_orphans"]


def rehome_orphans(
    phy2log: np.ndarray,
    num_experts: int,
    load: np.ndarray,
    slots_per_gpu: int,
    share: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """``(phy2log, share)`` with one replica for every expert that has none: one move per
    orphaned (layer, expert); every other slot keeps its expert.

    ``phy2log: int64[L, P]`` (``-1``: an empty or failed slot, never taken), ``load:
    float[L, E]``, slot ``p`` on GPU ``p // slots_per_gpu``; ``share: float[L, P]`` the replica
    shares (None: even split, and None is returned). Per layer, orphans heaviest first
    (ties: the lowest expert), each takes the slot of a replica whose expert keeps at least one
    other, the slot that leaves the layer's max GPU load lowest (ties: the lowest slot); the
    donor's other replicas take its share (renormalised). `InfeasibleError` when a layer has no
    such slot (fewer used slots than experts)."""
    phy2log = np.array(phy2log, dtype=np.int64, copy=True)
    load = np.asarray(load, dtype=np.float64)
    L, P = phy2log.shape
    E, S = int(num_experts), int(slots_per_gpu)
    G = P // S
    flat = np.maximum(phy2log, 0) + (np.arange(L) * E)[:, None]
    cnt = np.bincount(flat[phy2log >= 0], minlength=L * E).reshape(L, E)  # [L, E]
    if share is None:
        even = 1.0 / np.maximum(np.take_along_axis(cnt, np.maximum(phy2log, 0), 1), 1)
        sh_all = np.where(phy2log >= 0, even, 0.0)
    else:
        sh_all = np.array(share, dtype=np.float64, copy=True)
    for layer in np.flatnonzero((cnt == 0).any(1)):
        ph, sh, c, w = phy2log[layer], sh_all[layer], cnt[layer], load[layer]
        orphans = np.flatnonzero(c == 0)
        for o in orphans[np.argsort(-w[orphans], kind="stable")]:
            slot_load = np.where(ph >= 0, w[np.maximum(ph, 0)] * sh, 0.0)
            gpu = slot_load.reshape(G, S).sum(1)
            cand = np.flatnonzero((ph >= 0) & (c[np.maximum(ph, 0)] >= 2))  # [C]
            if cand.size == 0:
                raise InfeasibleError(
                    f"layer {layer}: no slot left for expert {int(o)}; {int((ph >= 0).sum())} "
                    f"used slots for {E} experts, every expert needs a slot"
                )
            d = ph[cand]
            sigma = sh[cand]
            rest = 1.0 - sigma
            # the donor's other replicas: share / (1 - sigma), or even when sigma was all of it
            same = (ph[None, :] == d[:, None]) & (np.arange(P)[None, :] != cand[:, None])
            flat_even = rest <= 1e-12
            new_share = np.where(
                flat_even[:, None], 1.0 / np.maximum(c[d] - 1, 1)[:, None],
                sh[None, :] / np.where(flat_even, 1.0, rest)[:, None],
            )
            delta = np.where(same, w[d][:, None] * new_share - slot_load[None, :], 0.0)
            delta[np.arange(cand.size), cand] = w[o] - slot_load[cand]
            peak = (gpu[None, :] + delta.reshape(-1, G, S).sum(2)).max(1)
            k = int(np.argmin(peak))
            s_k, d_k = int(cand[k]), int(d[k])
            others = same[k]
            sh[others] = new_share[k, others]
            ph[s_k], sh[s_k] = o, 1.0
            c[d_k] -= 1
            c[o] = 1
    return phy2log, (None if share is None else sh_all)
