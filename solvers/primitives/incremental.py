"""Incremental rebalancing (``repair``, ``robust`` with ``tolerance``): single improving moves
(re-point a slot, swap two replicas) on the live placement, all layers at once, until within
``tolerance`` of a fresh greedy solve or ``migration_budget`` slots changed.
docs/solvers.md, "Incremental repair" and "How the building blocks work".
"""

from __future__ import annotations

import numpy as np

from eplb.placement import Placement
from eplb.solvers.primitives.chains import chain_repair
from eplb.solvers.primitives.layout import duplicates, moved
from eplb.solvers.primitives.relabel import relabel
from eplb.tolerance import REL_TOL
from eplb.topology import Topology

_NO_CAP = np.iinfo(np.int64).max // 4


def slots_changed(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """``int64[L]``: slots whose expert differs, for ``old, new: int64[L, P]``."""
    return (np.asarray(old) != np.asarray(new)).sum(1)


def repair(
    load: np.ndarray,
    phy2log: np.ndarray,
    topology: Topology,
    *,
    target: np.ndarray | None = None,
    budget: int | None = None,
    max_steps: int = 10_000,
) -> tuple[np.ndarray, int]:
    """Improve the live ``phy2log: int64[L, P]`` for ``load: float64[L, E]`` move by move.
    Empty slots (``-1``, as ``craft`` leaves them) may be filled by a move (a new replica, or a
    replica moved there), never created.

    ``target: float64[L]`` stops a layer once its max GPU load is ``<= target`` (default: run
    until no improving move); ``budget``: max slots differing from ``phy2log`` per layer.
    Returns the repaired ``int64[L, P]`` and the steps run (docs/solvers.md, "How the
    building blocks work").
    """
    L, E = load.shape
    G, S = topology.num_gpus, topology.slots_per_gpu
    P = G * S
    # an empty slot (-1) is a replica of a virtual expert E of no load that may lose its last
    # replica (a slot filled) but never gain one (no move empties a slot)
    prev = np.asarray(phy2log, dtype=np.int64).reshape(L, G, S)
    prev = np.where(prev < 0, E, prev)
    load = np.hstack([load, np.zeros((L, 1))])
    slot = prev.copy()
    # a layer within REL_TOL of its target is done (loads summed in another order differ)
    tgt = np.full(L, -np.inf) if target is None else np.asarray(target, float) * (1 + REL_TOL)
    cap = _NO_CAP if budget is None else int(budget)
    active = np.arange(L)
    steps = 0
    experts = np.arange(E + 1)
    while active.size and steps < max_steps:
        sl = slot[active].reshape(-1, P)
        c = _counts(sl, E + 1)  # [n, E + 1]
        s = load[active] / np.maximum(c, 1)
        gpu = np.take_along_axis(s, sl, 1).reshape(-1, G, S).sum(2)
        keep = gpu.max(1) > tgt[active]
        active = active[keep]
        if not active.size:
            break
        steps += 1
        moved = _step(
            load[active], slot, prev, active, gpu[keep], c[keep], s[keep], cap, experts, G, S
        )
        active = active[moved]
    out = slot.reshape(L, P)
    return np.where(out == E, -1, out), steps


def _counts(sl: np.ndarray, E: int) -> np.ndarray:
    """``int64[n, E]`` replicas per expert of slot rows ``sl: int64[n, P]``."""
    n = sl.shape[0]
    key = (np.arange(n)[:, None] * E + sl).ravel()
    return np.bincount(key, minlength=n * E).reshape(n, E)


def _holders(sl: np.ndarray, c: np.ndarray, S: int) -> tuple[np.ndarray, np.ndarray]:
    """GPUs holding each expert: ``int64[n, E, R]`` distinct GPUs (by ascending slot, ``-1``
    padded) and ``int64[n, E, R]`` copies of the expert on each (0 where padded).

    ``sl: int64[n, P]`` slot rows, ``c: int64[n, E]`` their replica counts.
    """
    n, P = sl.shape
    E = c.shape[1]
    R = int(c.max())
    order = np.argsort(sl, axis=1, kind="stable")  # slots grouped by expert, ascending
    e_sorted = np.take_along_axis(sl, order, 1)
    start = np.cumsum(c, 1) - c  # [n, E] first position of each expert
    rank = np.arange(P)[None, :] - np.take_along_axis(start, e_sorted, 1)
    g = order // S
    dup = np.zeros_like(g, dtype=bool)  # a further copy on the same GPU (adjacent slots)
    dup[:, 1:] = (e_sorted[:, 1:] == e_sorted[:, :-1]) & (g[:, 1:] == g[:, :-1])
    run = np.maximum.accumulate(np.where(dup, 0, np.arange(P)[None, :]), axis=1)
    first = np.take_along_axis(rank, run, 1)  # rank of the run's first copy
    rows = np.arange(n)[:, None]
    gpus = np.full((n, E, R), -1, dtype=np.int64)
    gpus[rows, e_sorted, rank] = np.where(dup, -1, g)
    key = ((rows * E + e_sorted) * R + first).ravel()
    copies = np.bincount(key, minlength=n * E * R).reshape(n, E, R)
    return gpus, copies


def _step(w, slot, prev, active, gpu, c, s, cap, experts, G, S) -> np.ndarray:
    """One move on every row of ``active`` (in place on ``slot``); ``bool[n]`` rows moved.

    ``w, c, s: [n, E]`` loads, replica counts and per-replica loads; ``gpu: float64[n, G]``.
    The last expert (``E - 1``) is the virtual one of empty slots (see `repair`).
    """
    n, E = w.shape
    V = E - 1  # empty slots
    P = G * S
    r = np.arange(n)
    r1, r2 = r[:, None], r[:, None, None]
    sl = slot[active]  # [n, G, S]
    pv = prev[active]
    h = gpu.argmax(1)
    M = gpu[r, h]
    room = None if cap >= _NO_CAP else (cap - (sl != pv).sum((1, 2)))[:, None]
    ah = sl[r, h]  # [n, S] experts on h
    pvh = pv[r, h]  # [n, S]
    same = sl[..., :, None] == sl[..., None, :]  # [n, G, S, S]
    Hag = same.sum(-1)  # [n, G, S] copies of a slot's expert on its own GPU
    Hh = _counts(ah, E)  # [n, E] copies of each expert on h
    Hbg = (sl[:, None] == ah[:, :, None, None]).sum(-1)  # [n, S(b), G] copies of b on g
    two = c >= 2
    two[:, V] = True  # an empty slot may always be filled
    ua = np.where(two, w / np.maximum(c - 1, 1) - s, 0.0)  # rise per replica if a loses one
    newb = w / (c + 1)  # per-replica load once b gains one
    vb = newb - s  # <= 0

    # Per expert, over the GPUs other than h holding it: heaviest load after the expert loses
    # a replica (a1, its GPU arg1; runner-up a2) and after it gains one (b1).
    hg, cnt = _holders(sl.reshape(n, P), c, S)  # [n, E, R]
    valid = (hg >= 0) & (hg != h[:, None, None])
    valid[:, V] = False  # filling an empty slot changes no other GPU
    gi = np.maximum(hg, 0)
    glo = np.take_along_axis(gpu, gi.reshape(n, -1), 1).reshape(gi.shape)
    val = np.where(valid, glo + ua[:, :, None] * cnt, -np.inf)
    k1 = val.argmax(2)
    a1 = np.take_along_axis(val, k1[..., None], 2)[..., 0]
    arg1 = np.take_along_axis(gi, k1[..., None], 2)[..., 0]
    np.put_along_axis(val, k1[..., None], -np.inf, 2)
    a2 = val.max(2)
    b1 = np.where(valid, glo + vb[:, :, None] * cnt, -np.inf).max(2)

    sa = s[r1, ah]
    ua_h = ua[r1, ah]
    Mx = M[:, None, None]
    # 1. re-point slot k of h from a = ah[k] to any expert b   [n, S, E]
    aff = (Mx - (sa - ua_h * (Hh[r1, ah] - 1))[:, :, None]) + newb[:, None, :]
    np.maximum(aff, a1[r1, ah][:, :, None], out=aff)
    np.maximum(aff, b1[:, None, :], out=aff)
    ok = two[r1, ah][:, :, None] & (Hh == 0)[:, None, :] & (experts != V)
    if room is not None:  # changed slots may grow by at most ``room``
        dd = (experts[None, None, :] != pvh[:, :, None]).astype(np.int64) - (ah != pvh)[:, :, None]
        ok &= dd <= room[:, :, None]
    gains = [_gain(aff, M, ok, 1)]

    # 2. re-point slot (g, k) from a = sl[g, k] to an expert b = ah[i] of h   [n, S, G, S]
    sa2 = s[r2, sl]  # [n, G, S]
    ua2 = ua[r2, sl]
    Hah = Hh[r2, sl]  # copies of a on h
    base_g = gpu[:, :, None] - sa2 + ua2 * (Hag - 1)
    aff = base_g[:, None] + newb[r1, ah][:, :, None, None]  # GPU g
    new_h = Mx[..., None] + (vb[r1, ah] * Hh[r1, ah])[:, :, None, None] + (ua2 * Hah)[:, None]
    np.maximum(aff, new_h, out=aff)
    a_rest = np.where(arg1[r2, sl] == np.arange(G)[None, :, None], a2[r2, sl], a1[r2, sl])
    np.maximum(aff, a_rest[:, None], out=aff)
    np.maximum(aff, b1[r1, ah][:, :, None, None], out=aff)
    free_b = (Hbg == 0)[..., None]  # [n, S, G, 1] b not yet on g
    ok = free_b & two[r2, sl][:, None] & (ah != V)[:, :, None, None]  # never empty a slot
    if room is not None:
        dd = (ah[:, :, None, None] != pv[:, None]).astype(np.int64) - (sl != pv)[:, None]
        ok &= dd <= room[:, :, None, None]
    gains.append(_gain(aff, M, ok, 1))

    # 3. swap slot i of h (expert x = ah[i]) with slot (g, j) (expert y = sl[g, j])
    d = sa[:, :, None, None] - sa2[:, None]  # [n, S, G, S]
    aff = Mx[..., None] - d
    np.maximum(aff, gpu[:, None, :, None] + d, out=aff)
    ok = (d > 0) & free_b & ((Hah == 0) | (sl == V))[:, None]  # into an empty slot: a move
    if room is not None:
        dd = (
            (sl[:, None] != pvh[:, :, None, None]).astype(np.int64)
            - (ah != pvh)[:, :, None, None]
            + (ah[:, :, None, None] != pv[:, None])
            - (sl != pv)[:, None]
        )
        ok &= dd <= room[:, :, None, None]
    gains.append(_gain(aff, M, ok, 2))

    # best move per row: largest gain per changed slot; ties to the earlier kind and index
    flat = [x.reshape(n, -1) for x in gains]
    idx = np.stack([x.argmax(1) for x in flat], 1)  # [n, 3]
    val = np.stack([x[r, i] for x, i in zip(flat, idx.T, strict=True)], 1)
    kind = val.argmax(1)
    best = idx[r, kind]
    moved = val[r, kind] > 0
    lay, best, kind, hh, ahm = active[moved], best[moved], kind[moved], h[moved], ah[moved]
    t1 = kind == 0
    k, b = np.divmod(best[t1], E)
    slot[lay[t1], hh[t1], k] = b
    t2 = kind == 1
    i, rest = np.divmod(best[t2], P)
    g, k = np.divmod(rest, S)
    slot[lay[t2], g, k] = ahm[t2, i]
    t3 = kind == 2
    i, rest = np.divmod(best[t3], P)
    g, j = np.divmod(rest, S)
    la, hx = lay[t3], hh[t3]
    x, y = slot[la, hx, i], slot[la, g, j]
    slot[la, hx, i], slot[la, g, j] = y, x
    return moved


def _gain(aff: np.ndarray, M: np.ndarray, ok: np.ndarray, cost: int) -> np.ndarray:
    """Gain per changed slot ``(M - aff) / cost`` (in place on ``aff``); ``-inf`` where not
    allowed or not improving (``aff >= M``, relative tolerance `REL_TOL`)."""
    Mb = M.reshape((-1,) + (1,) * (aff.ndim - 1))
    ok &= aff < Mb * (1 - REL_TOL)
    np.subtract(Mb, aff, out=aff)
    if cost != 1:
        aff /= cost
    aff[~ok] = -np.inf
    return aff


def incremental(
    load: np.ndarray,
    topology: Topology,
    previous: Placement,
    fresh: Placement,
    *,
    tolerance: float | None,
    migration_budget: int | None,
    max_steps: int = 10_000,
    chains: bool = True,
) -> Placement:
    """Repair ``previous`` for ``load: float64[L, E]``, ``fresh`` being the fresh greedy
    placement of the same load (docs/solvers.md, "How the building blocks work").
    ``meta["solver"]`` holds ``policy``, ``relabeled`` (True: `solvers.solve` must not relabel
    again) and ``incremental``
    (``tolerance``, ``migration_budget``, ``steps``, ``fresh_layers`` taken from ``fresh``,
    ``chain_layers`` taken from the chain repair).

    ``chains`` (two slots per GPU only): also run `solvers.primitives.chains.chain_repair` from
    ``previous``; a layer takes its result when it reaches the target within the budget and
    the single moves did not, or with fewer replicas moved.
    """
    L, E = load.shape
    previous.validate()  # the repair relies on every expert having a replica
    tol = 0.0 if tolerance is None else tolerance
    fresh_max = fresh.gpu_load(load).max(1)
    target = fresh_max * (1 + tol)
    out, steps = repair(
        load,
        previous.phy2log,
        topology,
        target=target,
        budget=migration_budget,
        max_steps=max_steps,
    )
    got = Placement(out, E, topology).gpu_load(load).max(1)
    S = topology.slots_per_gpu
    chained = np.zeros(L, dtype=bool)
    if chains and S == 2:
        alt, ok = chain_repair(load, previous.phy2log, fresh.phy2log, target, topology.num_gpus)
        if migration_budget is not None:
            ok &= slots_changed(previous.phy2log, alt) <= migration_budget
        reached = got <= target * (1 + REL_TOL)
        fewer = moved(previous.phy2log, alt, E, S) < moved(previous.phy2log, out, E, S)
        chained = ok & (~reached | fewer)
        out[chained] = alt[chained]
        got = np.where(chained, Placement(out, E, topology).gpu_load(load).max(1), got)
    miss = got > target * (1 + REL_TOL)
    # layers the single moves missed (repaired by chains or not): the relabeled fresh layer
    # where it reaches the target with fewer moves, or (no budget) wherever nothing else did
    look = np.nonzero(miss | chained)[0]
    take = np.zeros(L, dtype=bool)
    if look.size:
        sub_prev = Placement(previous.phy2log[look], E, topology)
        sub_fresh = relabel(Placement(fresh.phy2log[look], E, topology), sub_prev)
        if migration_budget is None:
            ok = np.ones(look.size, dtype=bool)
        else:
            ok = (slots_changed(sub_prev.phy2log, sub_fresh.phy2log) <= migration_budget) & (
                fresh_max[look] < got[look]
            )
        fm = moved(sub_prev.phy2log, sub_fresh.phy2log, E, S)
        ok &= miss[look] | (fm < moved(sub_prev.phy2log, out[look], E, S))
        take[look[ok]] = True
        out[look[ok]] = sub_fresh.phy2log[ok]
    info = {
        "policy": "global",
        "relabeled": True,
        "incremental": {
            "tolerance": tolerance,
            "migration_budget": migration_budget,
            "steps": int(steps),
            "fresh_layers": np.nonzero(take)[0].tolist(),
            "chain_layers": np.nonzero(chained & ~take)[0].tolist(),
        },
        "duplicates": int(duplicates(out, topology.slots_per_gpu).sum()),
    }
    return Placement(out, E, topology, meta={"solver": info})
