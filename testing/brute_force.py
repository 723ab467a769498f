"""Brute-force oracle for tiny placement problems, written independently of `solvers`.

It enumerates slot tables and evaluates every objective the solvers optimise, vectorised with
numpy; nothing here imports `solvers`. Sizes must stay tiny (a few thousand tables).

- even split: GPU load = sum over its slots of ``w_e / count_e``;
- free shares (weighted): by max-flow/min-cut (Hall's theorem) the best max GPU load of a
  fixed table is ``max over expert sets A of w(A) / |GPUs holding some expert of A|``;
- traffic: ``+ rdma_weight / G * sum_e w_e (1 - nodes holding e / N)``;
- migration: ``+ migration_weight * moved``, ``moved`` = replicas a GPU holds that it did not
  hold before (per GPU, per expert, the positive part of new minus old copies: the ilp's
  migration term; what a rebalance transfers is `eplb.moves`).

Tests, benchmarks and scripts share it (``from eplb.testing import brute_force``); so can a
test of your own policy on tiny problems.
"""

from __future__ import annotations

from itertools import combinations, combinations_with_replacement, product

import numpy as np


def tables(
    E: int, N: int, gpn: int, S: int, *, ordered: bool = False, duplicates: bool = True
) -> np.ndarray:
    """``int64[T, N*gpn*S]`` every slot table holding each of the ``E`` experts at least once.

    GPU order inside a node is canonical unless ``ordered`` (then every table); nodes are
    always kept in order. ``duplicates=False`` leaves out GPUs holding an expert twice.
    """
    pick = combinations_with_replacement if duplicates else combinations
    gpus = np.array(list(pick(range(E), S)), dtype=np.int64).reshape(-1, S)  # [K, S]
    K = len(gpus)
    if ordered:
        node = np.array(list(product(range(K), repeat=gpn)), dtype=np.int64)
    else:
        node = np.array(list(combinations_with_replacement(range(K), gpn)), dtype=np.int64)
    node_tab = gpus[node].reshape(len(node), gpn * S)  # [M, gpn*S]
    idx = np.array(list(product(range(len(node_tab)), repeat=N)), dtype=np.int64)
    tab = node_tab[idx].reshape(len(idx), N * gpn * S)
    cnt = np.stack([(tab == e).sum(1) for e in range(E)], 1)
    return tab[(cnt >= 1).all(1)]


def counts(tab: np.ndarray, E: int) -> np.ndarray:
    """``int64[T, E]`` replicas of each expert."""
    return np.stack([(tab == e).sum(1) for e in range(E)], 1)


def even_loads(w: np.ndarray, tab: np.ndarray, S: int) -> np.ndarray:
    """``float64[T, G]`` GPU loads with an even split."""
    c = counts(tab, w.size)
    per = w[tab] / np.take_along_axis(c, tab, 1)
    return per.reshape(len(tab), -1, S).sum(2)


def weighted_max(w: np.ndarray, tab: np.ndarray, S: int) -> np.ndarray:
    """``float64[T]`` best max GPU load with free shares (Hall / min-cut formula)."""
    T, P = tab.shape
    G = P // S
    E = w.size
    holds = np.zeros((T, E, G), dtype=bool)
    holds[np.arange(T)[:, None], tab, np.arange(P)[None, :] // S] = True
    best = np.zeros(T)
    for r in range(1, E + 1):
        for A in combinations(range(E), r):
            A = list(A)
            nbr = holds[:, A, :].any(1).sum(1)
            val = np.where(nbr > 0, w[A].sum() / np.maximum(nbr, 1), np.inf)
            best = np.maximum(best, val)
    return best


def nodes_holding(tab: np.ndarray, E: int, N: int) -> np.ndarray:
    """``int64[T, E]`` distinct nodes holding each expert."""
    T, P = tab.shape
    node = np.arange(P) // (P // N)
    held = np.zeros((T, E, N), dtype=bool)
    held[np.arange(T)[:, None], tab, node[None, :]] = True
    return held.sum(2)


def moved(tab: np.ndarray, prev: np.ndarray, E: int, S: int) -> np.ndarray:
    """``int64[T]`` slots of each table whose GPU held no replica of their expert in
    ``prev: int[P]`` (a local copy is no move: `eplb.moves`' meaning, counted with sets)."""
    T, P = tab.shape
    held = [set(prev[g * S:(g + 1) * S].tolist()) - {-1} for g in range(P // S)]
    out = np.zeros(T, dtype=np.int64)
    for t in range(T):
        out[t] = sum(1 for p in range(P) if tab[t, p] >= 0 and int(tab[t, p]) not in held[p // S])
    return out


def groups_ok(tab: np.ndarray, num_groups: int, E: int, N: int) -> np.ndarray:
    """``bool[T]``: every group of ``E / num_groups`` consecutive experts on a single node."""
    T, P = tab.shape
    node = np.arange(P) // (P // N)
    grp = tab // (E // num_groups)
    ok = np.ones(T, dtype=bool)
    for k in range(num_groups):
        on = np.zeros((T, N), dtype=bool)
        on[np.nonzero(grp == k)[0], node[np.nonzero(grp == k)[1]]] = True
        ok &= on.sum(1) <= 1
    return ok


def no_duplicates(tab: np.ndarray, S: int) -> np.ndarray:
    """``bool[T]``: no GPU holds two replicas of one expert."""
    g = np.sort(tab.reshape(len(tab), -1, S), axis=2)
    return ~(g[:, :, 1:] == g[:, :, :-1]).any((1, 2))


def objective(
    w, tab, N, S, *, weighted=False, rdma_weight=0.0, migration_weight=0.0, previous=None
) -> np.ndarray:
    """``float64[T]`` the solvers' objective of every table."""
    w = np.asarray(w, dtype=float)
    G = tab.shape[1] // S
    val = weighted_max(w, tab, S) if weighted else even_loads(w, tab, S).max(1)
    if rdma_weight:
        rdma = (w[None, :] * (1 - nodes_holding(tab, w.size, N) / N)).sum(1)
        val = val + rdma_weight * rdma / G
    if migration_weight:
        val = val + migration_weight * moved(tab, previous, w.size, S)
    return val


def optimum(
    w,
    N,
    gpn,
    S,
    *,
    weighted=False,
    rdma_weight=0.0,
    num_groups=None,
    duplicates=True,
    migration_weight=0.0,
    migration_budget=None,
    previous=None,
) -> float:
    """The optimal objective of the problem class described by the options."""
    w = np.asarray(w, dtype=float)
    E = w.size
    ordered = previous is not None
    tab = tables(E, N, gpn, S, ordered=ordered, duplicates=duplicates)
    keep = np.ones(len(tab), dtype=bool)
    if num_groups is not None:
        keep &= groups_ok(tab, num_groups, E, N)
    if migration_budget is not None:
        keep &= moved(tab, previous, E, S) <= migration_budget
    tab = tab[keep]
    if not len(tab):
        return np.inf
    return float(
        objective(
            w,
            tab,
            N,
            S,
            weighted=weighted,
            rdma_weight=rdma_weight,
            migration_weight=migration_weight,
            previous=previous,
        ).min()
    )


def group_optimum(w, N: int, gpn: int, S: int, num_groups: int) -> float:
    """Optimal max GPU load (even split) keeping every group on one node, for larger nodes:
    every assignment of groups to nodes (each node at least one group), each node solved by
    enumerating its own tables."""
    w = np.asarray(w, dtype=float)
    M = w.size // num_groups
    memo: dict[tuple[int, ...], float] = {}

    def node_opt(groups: tuple[int, ...]) -> float:
        if groups not in memo:
            experts = np.concatenate([np.arange(g * M, (g + 1) * M) for g in groups])
            if experts.size > gpn * S:
                memo[groups] = np.inf
            else:
                tab = tables(experts.size, 1, gpn, S)
                memo[groups] = float(even_loads(w[experts], tab, S).max(1).min())
        return memo[groups]

    best = np.inf
    for assign in product(range(N), repeat=num_groups):
        if len(set(assign)) < N:
            continue
        val = max(node_opt(tuple(g for g in range(num_groups) if assign[g] == n)) for n in range(N))
        best = min(best, val)
    return best
