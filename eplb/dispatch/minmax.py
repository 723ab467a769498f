"""Exact min-max integer split of a batch's picks over replicas (the ``lp`` dispatch's solver).

``fixed: int[G]`` picks per GPU, ``demand: int[J]`` picks of each flexible expert over its arcs
``(arc_j, arc_g): int[A]``; `split` minimises the largest GPU load ``T`` by max-flow and
min-cut (exact, integer), then places picks node-local first. See docs/core.md, section
"The exact min-max split".
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike
from ortools.graph.python import max_flow

from eplb.errors import InputError

__all__ = ["plan", "split", "split_lp"]


def _lower_bound(demand: np.ndarray, fixed: np.ndarray) -> int:
    G = fixed.size
    total = int(demand.sum()) + int(fixed.sum())
    return max(int(fixed.max(initial=0)), -(-total // G))


def _newton(demand, fixed, arc_j, arc_g) -> tuple[int, np.ndarray]:
    """Optimal ``T`` and an integer flow ``int64[A]``: max-flow at ``T``, raised to the bound
    the minimum cut proves until every pick flows (docs/core.md)."""
    J, G = demand.size, fixed.size
    total = int(demand.sum())
    T = _lower_bound(demand, fixed)
    if total == 0:
        return T, np.zeros(arc_j.size, dtype=np.int64)
    src, sink = J + G, J + G + 1
    tails = np.concatenate([np.full(J, src), arc_j, J + np.arange(G)]).astype(np.int32)
    heads = np.concatenate([np.arange(J), J + arc_g, np.full(G, sink)]).astype(np.int32)
    caps = np.concatenate([demand, np.full(arc_j.size, total), T - fixed]).astype(np.int64)
    mf = max_flow.SimpleMaxFlow()
    mf.add_arcs_with_capacity(tails, heads, caps)
    sink_arcs = np.arange(J + arc_j.size, J + arc_j.size + G, dtype=np.int32)
    for _ in range(G + 2):
        status = mf.solve(src, sink)
        if status != mf.OPTIMAL:  # pragma: no cover - capacities are small non-negative ints
            raise RuntimeError(f"max-flow failed with status {status}")
        if mf.optimal_flow() == total:
            flows = np.asarray(mf.flows(np.arange(J, J + arc_j.size, dtype=np.int32)))
            return T, flows.astype(np.int64)
        side = np.asarray(mf.get_source_side_min_cut(), dtype=np.int64)
        Y = side[side < J]
        X = side[(side >= J) & (side < J + G)] - J
        nxt = -(-(int(demand[Y].sum()) + int(fixed[X].sum())) // max(X.size, 1))
        if nxt <= T:  # pragma: no cover - excluded by the cut argument
            raise RuntimeError("min-max split: the cut did not raise the bound")
        T = nxt
        mf.set_arcs_capacity(sink_arcs, (T - fixed).astype(np.int64))
    raise RuntimeError("min-max split did not converge")  # pragma: no cover


def _check(demand, fixed, arc_j, arc_g) -> tuple[np.ndarray, ...]:
    demand = np.asarray(demand, dtype=np.int64)
    fixed = np.asarray(fixed, dtype=np.int64)
    arc_j = np.asarray(arc_j, dtype=np.int64)
    arc_g = np.asarray(arc_g, dtype=np.int64)
    if demand.ndim != 1 or fixed.ndim != 1 or fixed.size == 0:
        raise InputError("demand must be int[J] and fixed int[G] with G >= 1")
    if (demand < 0).any() or (fixed < 0).any():
        raise InputError("demand and fixed must be picks >= 0")
    if arc_j.shape != arc_g.shape or arc_j.ndim != 1:
        raise InputError("arc_j and arc_g must be int[A] of the same length")
    if arc_j.size and (
        arc_j.min() < 0
        or arc_j.max() >= demand.size
        or arc_g.min() < 0
        or arc_g.max() >= fixed.size
    ):
        raise InputError("arcs must join experts 0..J-1 to GPUs 0..G-1")
    served = np.bincount(arc_j, minlength=demand.size) > 0
    if (demand[~served] > 0).any():
        raise InputError("every expert with picks needs at least one arc (a replica GPU)")
    return demand, fixed, arc_j, arc_g


def _localise(flow, arc_j, arc_g, per_node, J, G) -> np.ndarray:
    """``int64[A, N]``: the picks from each source node on each arc, for the fixed split
    ``flow: [A]``: each node's picks of an expert fill that expert's arcs on the node first,
    the rest fill the remaining arcs in order (optimal for this split). GPUs of a node are
    consecutive."""
    N = per_node.shape[1]
    F = np.zeros((J, G), dtype=np.int64)
    F[arc_j, arc_g] = flow
    Fn = F.reshape(J, N, G // N)
    cum = np.cumsum(Fn, axis=2)
    m = np.minimum(per_node, cum[:, :, -1])  # [J, N] picks served on their own node
    take = np.minimum(np.maximum(m[:, :, None] - (cum - Fn), 0), Fn)  # [J, N, gpn]
    rest_s = per_node - m
    rest_f = (Fn - take).reshape(J, G)
    s_hi = np.cumsum(rest_s, axis=1)
    d_hi = np.cumsum(rest_f, axis=1)
    lo = np.maximum((s_hi - rest_s)[:, :, None], (d_hi - rest_f)[:, None, :])
    out = np.minimum(s_hi[:, :, None], d_hi[:, None, :]) - lo  # [J, N, G] north-west corner
    np.maximum(out, 0, out=out)
    own = out.reshape(J, N, N, G // N)  # [J, source node, GPU node, GPU in node]
    own[:, np.arange(N), np.arange(N)] += take
    return out[arc_j, :, arc_g]


def split(
    demand: ArrayLike,
    fixed: ArrayLike,
    arc_j: ArrayLike,
    arc_g: ArrayLike,
    *,
    source_nodes: ArrayLike | None = None,
    gpu_node: ArrayLike | None = None,
) -> tuple[int, np.ndarray]:
    """Exact min-max integer split (docs/core.md, section "The exact min-max split").

    ``demand: int[J]``, ``fixed: int[G]``, arcs ``arc_j``/``arc_g: int[A]`` (distinct pairs).
    Returns ``(T, flow)``: the optimal largest GPU load and ``flow: int64[A]``.

    With ``source_nodes: int[J, N]`` (each expert's picks by source node, rows summing to
    ``demand``) and ``gpu_node: int[G]`` (GPUs of a node consecutive), returns ``(T, flow)``
    with ``flow: int64[A, N]``: the picks from each source node on each arc, node-local first
    (each node's picks of an expert fill its arcs on that node, the rest the others in order).
    """
    demand, fixed, arc_j, arc_g = _check(demand, fixed, arc_j, arc_g)
    T, flow = _newton(demand, fixed, arc_j, arc_g)
    if source_nodes is None:
        return T, flow
    per_node = np.asarray(source_nodes, dtype=np.int64)
    J, G, A = demand.size, fixed.size, arc_j.size
    N = per_node.shape[1]
    if per_node.shape != (J, N) or not np.array_equal(per_node.sum(1), demand):
        raise InputError("source_nodes must be int[J, N] with rows summing to demand")
    if G % N or not np.array_equal(np.asarray(gpu_node), np.arange(G) // (G // N)):
        raise InputError(f"gpu_node must put the {G} GPUs on {N} nodes in consecutive blocks")
    out = np.zeros((A, N), dtype=np.int64)
    if demand.sum() == 0:
        return T, out
    return T, _localise(flow, arc_j, arc_g, per_node, J, G)


def split_lp(
    demand: ArrayLike, fixed: ArrayLike, arc_j: ArrayLike, arc_g: ArrayLike
) -> tuple[float, np.ndarray]:
    """The LP relaxation of the problem of `split` (same ``demand: int[J]``, ``fixed: int[G]``,
    ``arc_j``/``arc_g: int[A]``) with scipy's HiGHS (``min T`` s.t. flow
    conservation and ``fixed + inflow <= T``): ``(T, flow: float64[A])``. Its optimum rounded up
    equals `split`'s ``T`` (the flow polytope is integral for integer ``T``); used as an
    independent check and as the generic-LP baseline of ``benchmarks/bench_dispatch.py``."""
    from scipy.optimize import linprog  # lazy: scipy is heavy; start-up avoids it
    from scipy.sparse import coo_matrix, vstack

    demand, fixed, arc_j, arc_g = _check(demand, fixed, arc_j, arc_g)
    J, G, A = demand.size, fixed.size, arc_j.size
    cols = np.arange(A)
    eq = coo_matrix((np.ones(A), (arc_j, cols)), shape=(J, A + 1))
    ub = vstack(
        [
            coo_matrix((np.ones(A), (arc_g, cols)), shape=(G, A + 1)),
        ]
    ).tolil()
    ub[:, A] = -1.0
    c = np.zeros(A + 1)
    c[A] = 1.0
    res = linprog(
        c,
        A_ub=ub.tocsr(),
        b_ub=-fixed.astype(float),
        A_eq=eq.tocsr(),
        b_eq=demand.astype(float),
        bounds=[(0, None)] * (A + 1),
        method="highs",
    )
    if res.status != 0:  # pragma: no cover
        raise RuntimeError(f"HiGHS failed: {res.message}")
    return float(res.x[A]), res.x[:A]


def plan(
    amounts: np.ndarray,
    flow: np.ndarray,
    arc_j: np.ndarray,
    arc_g: np.ndarray,
    gpu_node: np.ndarray,
) -> np.ndarray:
    """Who sends what where: ``z: [J, G_src, G]`` picks of flexible expert ``j`` from source GPU
    ``s`` served on GPU ``g``, given ``amounts: [J, G_src]`` (picks per source GPU) and the
    node-resolved optimal split ``flow: [A, N]`` of `split` (``flow[a, n]``: picks from node
    ``n`` on arc ``a``; arcs ``arc_j``/``arc_g: int[A]``, ``gpu_node: int[G]``). Each source
    GPU's picks go to its own GPU first (up to that arc's flow from its node), then to the
    other GPUs of its node, then to other nodes (ascending GPU order inside each tier, sources
    in ascending order): the fewest picks leave their GPU among the plans with this ``flow``.
    Works on integers (exact) and floats alike."""
    J, G = amounts.shape
    N = flow.shape[1]
    gpn = G // N
    dtype = np.result_type(amounts.dtype, flow.dtype)
    F = np.zeros((J, G, N), dtype=dtype)  # flow of arc (j, g) from node n
    F[arc_j, arc_g] = flow
    c = amounts.astype(dtype)
    src = np.arange(G)
    same = np.minimum(c, F[:, src, gpu_node])  # [J, G] served on the source GPU itself
    c = c - same
    F[:, src, gpu_node] -= same
    # per (j, source node a): sources s of node a in order against destinations by tier
    order = np.lexsort(
        (np.broadcast_to(src, (N, G)), (gpu_node[None, :] != np.arange(N)[:, None]))
    )  # [N, G] local first
    cap = np.take_along_axis(F.transpose(0, 2, 1), order[None], 2)  # [J, N, G] by tier
    d_hi = np.cumsum(cap, axis=2)
    d_lo = d_hi - cap
    sup = c.reshape(J, N, gpn)  # sources of node a are GPUs a*gpn .. a*gpn+gpn-1
    s_hi = np.cumsum(sup, axis=2)
    s_lo = s_hi - sup
    lo = np.maximum(s_lo[..., :, None], d_lo[..., None, :])
    hi = np.minimum(s_hi[..., :, None], d_hi[..., None, :])
    part = np.maximum(hi - lo, 0).astype(dtype)  # [J, N, gpn, G] in tier order
    z = np.zeros((J, N, gpn, G), dtype=dtype)
    np.put_along_axis(z, np.broadcast_to(order[None, :, None, :], part.shape), part, axis=3)
    z = z.reshape(J, G, G)
    z[:, src, src] += same
    return z
