"""Chain repair at two slots per GPU: re-pair the live placement's replicas by assignment.

When single moves get stuck (an overloaded pair needs a lighter partner, whose partner needs
another: an ejection chain), this repairs a layer at once: counts improved only until the
sorted pairing reaches the target, re-pointed slots, heavy replicas matched to light partners
by a min-cost assignment, pairs put on GPUs keeping replicas in place. docs/solvers.md,
"Chain repair at two slots per GPU".
"""

from __future__ import annotations

import numpy as np

from eplb.solvers.primitives import pairing
from eplb.solvers.primitives.layout import moved, replica_counts
from eplb.tolerance import REL_TOL

_BIG = 1e18  # assignment cost of a forbidden pair


def counts_to_target(
    load: np.ndarray, counts: np.ndarray, target: np.ndarray, cap: int, max_steps: int = 256
) -> np.ndarray:
    """``int64[L, E]``: ``counts: int64[L, E]`` improved one replica at a time (best move per
    step, no duplicate-forcing moves) until the sorted pairing's max pair of ``load: float[L,
    E]`` is ``<= target: float[L]`` or no move improves it."""
    c = counts.copy()
    obj = pairing.pair_objective(load, c)
    for _ in range(max_steps):
        act = np.nonzero(obj > target * (1 + REL_TOL))[0]
        if not act.size:
            break
        nxt = pairing.improve_counts(load[act], c[act], cap, budget=1, distinct=True)
        step = (nxt != c[act]).any(1)
        if not step.any():
            break
        c[act] = nxt
        obj[act] = pairing.pair_objective(load[act], nxt)
    return c


def _fill_counts(load: np.ndarray, counts: np.ndarray, slots: int, cap: int) -> np.ndarray:
    """``int64[L, E]``: ``counts`` of a live placement with empty slots raised to fill all
    ``slots`` of each row, one replica at a time to the expert with the largest per-replica
    load below ``cap`` replicas (water-filling)."""
    c = counts.copy()
    P = int(slots)
    rows = np.arange(c.shape[0])
    for _ in range(P - int(c.sum(1).min())):
        short = c.sum(1) < P
        per = np.where(c < cap, load / np.maximum(c, 1), -np.inf)
        e = per.argmax(1)
        c[rows[short], e[short]] += 1
    return c


def _repoint(w: np.ndarray, row: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``row: int64[P]`` with slots re-pointed so the replica counts become ``counts``
    (``counts.sum() == P``); empty slots (``-1``) are the first to take a gained replica."""
    E = w.size
    G = row.size // 2
    row = row.copy()
    have = np.bincount(row[row >= 0], minlength=E)
    lose = np.repeat(np.arange(E), np.maximum(have - counts, 0))
    gain = np.repeat(np.arange(E), np.maximum(counts - have, 0))
    empty = np.nonzero(row < 0)[0]
    if not lose.size and not empty.size:
        return row
    size = w / np.maximum(counts, 1)
    held = np.where(row >= 0, size[np.maximum(row, 0)], 0.0)  # [P] an empty slot weighs 0
    pair = held.reshape(G, 2).sum(1)
    freed: list[int] = empty.tolist()
    for e in lose:
        slots = [s for s in np.nonzero(row == e)[0] if s not in freed]
        freed.append(max(slots, key=lambda s: (pair[s // 2], -s)))  # heaviest GPU, lowest slot
    slots = np.array(freed)
    by_partner = slots[np.argsort(held[slots ^ 1], kind="stable")]  # lightest partner 1st
    by_size = gain[np.argsort(-size[gain], kind="stable")]
    row[by_partner] = by_size
    return row


def repair_pairs(w: np.ndarray, live: np.ndarray, counts: np.ndarray, target: float):
    """One layer: ``int64[P]`` re-paired from ``live: int64[P]`` (two slots per GPU) with replica
    counts ``counts: int64[E]`` and every GPU load ``<= target`` for expert loads ``w:
    float[E]``; None if no such pairing was found (docs/solvers.md, chain repair, steps 2-4)."""
    from scipy.optimize import linear_sum_assignment  # lazy: scipy is heavy; start-up avoids it

    P = live.size
    G = P // 2
    row = _repoint(w, live, counts)
    size = (w / np.maximum(counts, 1))[row]
    T = target * (1 + REL_TOL)
    partner = np.arange(P) ^ 1
    heavy = np.nonzero(size > T / 2)[0]
    light = np.nonzero(size <= T / 2)[0]
    if heavy.size > light.size:
        return None
    fits = size[heavy][:, None] + size[light][None, :] <= T
    fits &= row[heavy][:, None] != row[light][None, :]
    own = partner[heavy][:, None] == light[None, :]
    orphan = (size[partner[light]] <= T / 2)[None, :]  # taking l leaves a light alone
    cost = np.where(own, 0.0, 1.0 + 0.5 * orphan)
    cost = np.where(fits, cost, _BIG)
    hi, li = linear_sum_assignment(cost)
    if heavy.size and (cost[hi, li] >= _BIG).any():
        return None
    pairs = [(int(heavy[a]), int(light[b])) for a, b in zip(hi, li, strict=True)]
    free = np.ones(P, dtype=bool)
    free[heavy] = False
    free[light[li]] = False
    for s in np.nonzero(free)[0]:  # light pairs that survive intact
        t = partner[s]
        if s < t and free[t] and row[s] != row[t]:
            pairs.append((int(s), int(t)))
            free[s] = free[t] = False
    rest = np.nonzero(free)[0]
    rest = list(rest[np.argsort(-size[rest], kind="stable")])
    while rest:  # heaviest with the lightest of a different expert (light: always fits)
        s = rest.pop(0)
        j = next((i for i in range(len(rest) - 1, -1, -1) if row[rest[i]] != row[s]), len(rest) - 1)
        pairs.append((int(s), int(rest.pop(j))))
    a = np.array(pairs)  # [G, 2] slot indices of the live row
    stay = np.zeros((G, G))
    np.add.at(stay, (np.arange(G), a[:, 0] // 2), 1)
    np.add.at(stay, (np.arange(G), a[:, 1] // 2), 1)
    pi, gi = linear_sum_assignment(-stay)
    out = np.empty(P, dtype=np.int64)
    for p, g in zip(pi, gi, strict=True):
        x, y = a[p]
        if x // 2 != g and y // 2 == g:
            x, y = y, x
        # a replica that stays keeps its slot; else the first free one
        if x // 2 == g:
            out[x], out[x ^ 1] = row[x], row[y]
        else:
            out[2 * g], out[2 * g + 1] = row[x], row[y]
    return out


def chain_repair(
    load: np.ndarray, live: np.ndarray, fresh: np.ndarray, target: np.ndarray, num_gpus: int
) -> tuple[np.ndarray, np.ndarray]:
    """Chain repair of ``live: int64[L, P]`` (two slots per GPU) for ``load: float64[L, E]``:
    ``(phy2log: int64[L, P], ok: bool[L])``; layers with ``ok`` have every GPU load ``<=
    target: float64[L]`` and move as few replicas as the candidates allow (the live counts
    improved to the target, the counts of ``fresh: int64[L, P]``); the others keep ``live``."""
    L, E = load.shape
    G = live.shape[1] // 2
    c0 = _fill_counts(load, replica_counts(live, E), live.shape[1], num_gpus)
    candidates = [counts_to_target(load, c0, target, num_gpus), replica_counts(fresh, E)]
    out = live.copy()
    ok = np.zeros(L, dtype=bool)
    for layer in range(L):
        best = None
        for counts in candidates:
            got = repair_pairs(load[layer], live[layer], counts[layer], float(target[layer]))
            if got is None:
                continue
            pair = (load[layer] / np.maximum(counts[layer], 1))[got].reshape(G, 2).sum(1)
            if pair.max() > target[layer] * (1 + REL_TOL):  # safety: never accept a miss
                continue
            cost = int(moved(live[layer : layer + 1], got[None], E, 2)[0])
            if best is None or cost < best[0]:
                best = (cost, got)
        if best is not None:
            out[layer] = best[1]
            ok[layer] = True
    return out, ok
