"""Weighted placements: `optimal_shares` (the best ``replica_share`` of a fixed placement, an
LP per layer) and `chain_layout` (a structure designed for shares: every GPU boundary crossed
by one split expert). docs/solvers.md, "Weighted shares".
"""

from __future__ import annotations

import numpy as np

from eplb.tolerance import REL_TOL
from eplb.topology import Topology


def optimal_shares(
    load: np.ndarray, phy2log: np.ndarray, topology: Topology
) -> tuple[np.ndarray, np.ndarray]:
    """Best shares for ``phy2log: int64[L, P]`` on ``load: float[L, E]``.

    Returns ``replica_share: float64[L, P]`` (sums to 1 per expert) and ``float64[L]`` the
    resulting max GPU load.
    """
    L, P = phy2log.shape
    share = np.empty((L, P))
    best = np.empty(L)
    for layer in range(L):
        share[layer], best[layer] = _layer_shares(load[layer], phy2log[layer], topology)
    return share, best


def _layer_shares(w: np.ndarray, slots: np.ndarray, topology: Topology) -> tuple[np.ndarray, float]:
    from scipy.optimize import linprog  # lazy: scipy is heavy; start-up avoids it
    from scipy.sparse import coo_matrix

    G, S = topology.num_gpus, topology.slots_per_gpu
    P = slots.size
    E = w.size
    cnt = np.bincount(slots, minlength=E)
    even = 1.0 / cnt[slots]
    gpu = np.arange(P) // S
    free = (cnt[slots] >= 2) & (w[slots] > 0)
    fixed = np.bincount(gpu[~free], weights=(w[slots] * even)[~free], minlength=G)
    idx = np.nonzero(free)[0]
    share = even.copy()
    if idx.size == 0:
        return share, float(fixed.max())
    n = idx.size
    # the LP in units of the largest load: HiGHS' tolerances are absolute (1e-7), so raw loads
    # of 1e-9 would all be "feasible" anywhere and loads of 1e12 would carry noise
    unit = float(w.max())
    # variables: tokens f_i of free slot idx[i] (in units), then T
    rows_g = gpu[idx]
    a_ub = coo_matrix(
        (
            np.r_[np.ones(n), -np.ones(G)],
            (np.r_[rows_g, np.arange(G)], np.r_[np.arange(n), np.full(G, n)]),
        ),
        shape=(G, n + 1),
    ).tocsr()
    experts, col = np.unique(slots[idx], return_inverse=True)
    a_eq = coo_matrix((np.ones(n), (col, np.arange(n))), shape=(experts.size, n + 1)).tocsr()
    cost = np.zeros(n + 1)
    cost[n] = 1.0
    res = linprog(
        cost,
        A_ub=a_ub,
        b_ub=-fixed / unit,
        A_eq=a_eq,
        b_eq=w[experts] / unit,
        bounds=(0, None),
        method="highs",
    )
    if res.status != 0:  # cannot happen for a consistent input; keep the even split
        return share, float(
            (fixed + np.bincount(rows_g, weights=(w[slots] * even)[idx], minlength=G)).max()
        )
    f = np.maximum(res.x[:n], 0.0)  # in units: only the ratios below are used
    tot = np.bincount(col, weights=f, minlength=experts.size)
    ok = tot[col] > 0  # loads below the LP's tolerance may come back as zero flow: even split
    share[idx[ok]] = f[ok] / tot[col][ok]  # renormalise away solver round-off
    loads = fixed + np.bincount(rows_g, weights=w[slots][idx] * share[idx], minlength=G)
    return share, float(loads.max())


def chain_layout(load: np.ndarray, topology: Topology) -> np.ndarray | None:
    """``phy2log: int64[L, P]`` of the chain structure for ``load: float[L, E]``
    (docs/solvers.md), or None when the
    topology has too few spare slots (``P - E < G - 1``) or ``S < 3``."""
    L, E = load.shape
    G, S, P = topology.num_gpus, topology.slots_per_gpu, topology.num_slots
    if G < 2 or S < 3 or P - E < G - 1 or E < G - 1:
        return None
    T = load.sum(1) / G
    out = np.empty((L, G, S), dtype=np.int64)
    for layer in range(L):
        out[layer] = _chain_one(load[layer], T[layer], G, S, E)
    return out.reshape(L, P)


def _chain_one(w: np.ndarray, T: float, G: int, S: int, E: int) -> np.ndarray:
    order = np.argsort(-w, kind="stable")
    chain = order[: G - 1]  # heaviest, descending
    own = order[G - 1 :]
    # alternate heavy and light chain experts: h1, l1, h2, l2, ...
    half = (G - 1 + 1) // 2
    heavy, light = chain[:half], chain[half:][::-1]
    seq = np.empty(G - 1, dtype=np.int64)
    seq[0::2] = heavy
    seq[1::2] = light[: (G - 1) // 2]
    cw = w[seq]
    target = np.full(G, T)
    target[:-1] -= cw / 2  # right neighbour chain expert b_{g+1} = seq[g]
    target[1:] -= cw / 2  # left neighbour b_g = seq[g-1]
    room = np.full(G, S - 2)
    room[0] = room[-1] = S - 1
    slots = [[] for _ in range(G)]
    for g in range(G - 1):
        slots[g].append(int(seq[g]))
        slots[g + 1].append(int(seq[g]))
    acc = np.zeros(G)
    for e in own:  # heaviest own expert to the GPU with the most remaining target (with room)
        left = np.where(room > 0, target - acc, -np.inf)
        g = int(np.argmax(left))
        slots[g].append(int(e))
        acc[g] += w[e]
        room[g] -= 1
    # spare slots: extra replicas of the heaviest experts a GPU does not hold yet
    for g in range(G):
        k = 0
        while len(slots[g]) < S:
            e = int(order[k % E])
            k += 1
            if e not in slots[g] or k > 2 * E:
                slots[g].append(e)
    return np.array(slots, dtype=np.int64)


def wrap_layout(w: np.ndarray, num_gpus: int, slots_per_gpu: int, order: np.ndarray):
    """``int64[G * S]`` slots reaching ``total / G`` with shares for ``w: float[E]``, or None:
    the experts laid end to end in ``order: int[E]`` and cut into ``G`` equal pieces
    (McNaughton's wrap-around rule), an expert cut by a boundary held on both sides; None when
    a piece meets more than ``S`` experts or the experts do not fill the slots. Spare slots
    hold extra replicas (share 0 is allowed). Used to test claims that ``total / G`` is out
    of reach."""
    G, S = num_gpus, slots_per_gpu
    E = w.size
    total = float(w.sum())
    if total <= 0 or E > G * S:
        return None
    v = w[order]
    end = np.cumsum(v)
    begin = end - v
    tol = REL_TOL * total
    edges = np.arange(G + 1) * (total / G)
    slots: list[list[int]] = []
    for g in range(G):
        hit = (begin < edges[g + 1] - tol) & (end > edges[g] + tol) & (v > 0)
        slots.append([int(e) for e in order[hit]])
    for e in order[v <= 0]:  # zero loads take any free slot
        g = min(range(G), key=lambda k: len(slots[k]))
        slots[g].append(int(e))
    if max(len(s) for s in slots) > S:
        return None
    heavy = int(np.argmax(w))
    for s in slots:
        s.extend([s[0] if s else heavy] * (S - len(s)))
    return np.array(slots, dtype=np.int64).reshape(-1)


def wrap_orders(w: np.ndarray, tries: int = 16, seed: int = 0) -> list[np.ndarray]:
    """Orders of the experts of ``w: float[E]`` that `wrap_layout` tries: descending,
    ascending, heavy and light alternating, then seeded random permutations."""
    desc = np.argsort(-w, kind="stable")
    alt = np.empty_like(desc)
    half = (desc.size + 1) // 2
    alt[0::2] = desc[:half]
    alt[1::2] = desc[half:][::-1]
    rng = np.random.default_rng(seed)
    return [desc, desc[::-1], alt] + [rng.permutation(w.size) for _ in range(tries)]
