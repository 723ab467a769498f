"""``lp``: per batch and layer, the picks of every expert on two or more GPUs split over those
GPUs so that the busiest GPU serves as few as possible (exact min-max, `minmax`), node-local
first (`minmax.plan`); as DeepSeek's LPLB does per batch. `lp_plan` is the plan of one batch,
`LpShares` its counts-mode form when every source routes alike. Rules: docs/core.md,
"Dispatch policies"."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from eplb.dispatch import expect, minmax
from eplb.dispatch.base import Dispatch
from eplb.dispatch.lp_shares import LpShares, lp_shares
from eplb.dispatch.split import Even
from eplb.dispatch.tables import gpu_slots, layer_row
from eplb.errors import InputError
from eplb.placement import Placement

__all__ = ["Lp", "lp_plan"]

_EVEN = Even()  # the slots' tables of the fast path, before each step's shares


@dataclass(frozen=True)
class Lp(Dispatch):
    """``lp`` with ``solve_s``: seconds per MoE layer and micro-batch its per-batch solve adds
    on the critical path (0 unless a unit sets it). Keeps the `LpShares` of the last placement
    it split (``_last``), so a stream of steps re-solves one network."""

    name = "lp"
    needs_rank = True
    per_batch = True
    solve_s: float = 0.0
    _last: list = field(default_factory=list, init=False, compare=False, repr=False)

    def route(self, ids, placement, layer, rank, seed):
        return _lp_route(ids, rank, placement, layer)

    def batch_shares(self, placement: Placement) -> LpShares:
        """`LpShares` of ``placement`` (kept for the last placement asked)."""
        if not self._last or self._last[0] is not placement:
            self._last[:] = [placement, LpShares(placement)]
        return self._last[1]

    def shares(self, placement: Placement, load: np.ndarray | None = None) -> np.ndarray:
        return self.batch_shares(placement)(load)

    def routing(self, placement, num_groups, topk_groups, load=None):
        rt = _EVEN.routing(placement, num_groups, topk_groups)
        return expect.with_share(rt, self.shares(placement, load), placement.topology)

    def slot_picks(self, placement, source_counts, *, num_groups, topk_groups):
        # the min-max split of the step's picks (GPU loads as `expected_visits`')
        total = source_counts.sum(1)  # [L, E]
        return np.take_along_axis(total, np.maximum(placement.phy2log, 0), 1) * lp_shares(
            placement, total
        )

    def expected_visits(self, placement, src, r, q, gid, tick=None):
        """Each layer's expected picks ``src [G, E]`` are split as one batch (`lp_plan`); a
        pick of ``e`` from ``s`` then lands on GPU ``g`` with probability ``plan[s, e, g] /
        src[s, e]``."""
        topo = placement.topology
        L, G, E = src.shape
        N = topo.num_nodes
        NG = q.shape[2]
        gpu_tokens = np.zeros((L, G))
        miss_g = np.zeros((L, G, G))
        miss_n = np.zeros((L, G, N))
        node = topo.node_of_gpu
        base = (np.arange(G)[:, None] * NG + gid[None, :])[..., None]  # [G, E, 1]
        with np.errstate(divide="ignore"):
            for layer in range(L):
                plan = lp_plan(src[layer], placement, layer)  # [G, E, G]
                gpu_tokens[layer] = plan.sum((0, 1))
                with np.errstate(divide="ignore", invalid="ignore"):
                    w = np.where(src[layer][..., None] > 0, plan / src[layer][..., None], 0.0)
                w = np.minimum(w, 1.0)
                wn = np.zeros((G, E, N))
                np.add.at(wn.transpose(2, 0, 1), node, w.transpose(2, 0, 1))
                # a pick lands on one GPU, so its node shares sum to at most 1; float sums of
                # the GPU shares may exceed that by an ulp, which with r = 1 (an expert in every
                # token's top-k) made log1p(-r * wn) NaN: clipped, a certain pick gives log 0 =
                # -inf (exact)
                wn = np.minimum(wn, 1.0)
                rr = r[layer][..., None]
                ql = q[layer : layer + 1]
                miss_g[layer] = expect.log_miss(np.log1p(-rr * w)[None],
                                                (base * G + np.arange(G))[None], ql, G)[0]
                miss_n[layer] = expect.log_miss(np.log1p(-rr * wn)[None],
                                                (base * N + np.arange(N))[None], ql, N)[0]
                if tick is not None:
                    tick(1)
        return gpu_tokens, miss_g, miss_n

    def exposed(self, layers, micro_batches, layer_s, copy_s=None):
        if not self.solve_s:
            return None
        extra = self.solve_s * layers * micro_batches
        return extra, {"lp_s": extra}


def lp_plan(amounts: np.ndarray, placement: Placement, layer_index: int = 0) -> np.ndarray:
    """The ``lp`` policy's plan for one batch: ``int64[G, E, G]`` (``float64`` for float
    ``amounts``) picks of expert ``e`` from source
    GPU ``s`` served on GPU ``g``, for ``amounts: [G, E]`` picks per (source GPU, expert) of
    layer ``layer_index``. Integers (whole picks) are split exactly; floats (e.g. expected
    counts) follow the same rule on amounts scaled to integers (about 2**40 picks in all) and
    back, so within about 1e-12 of the layer's picks. Rules: docs/core.md, "Dispatch policies"."""
    layer = layer_row(placement, layer_index)
    G, E = placement.topology.num_gpus, placement.num_experts
    amounts = np.asarray(amounts)
    if amounts.shape != (G, E):
        raise InputError(f"amounts must be [{G}, {E}] (source GPU x expert), got {amounts.shape}")
    if amounts.dtype.kind in "iub":
        if (amounts < 0).any():
            raise InputError("amounts must be picks >= 0")
        return _plan(amounts.astype(np.int64), placement, layer)[0]
    amounts = amounts.astype(np.float64)
    if not np.isfinite(amounts).all() or (amounts < 0).any():
        raise InputError("amounts must be finite picks >= 0")
    total = float(amounts.sum())
    scale = 2.0**40 / total if total > 0 else 1.0
    out = _plan(np.rint(amounts * scale).astype(np.int64), placement, layer)[0]
    return out / scale


def _plan(work: np.ndarray, placement: Placement, layer: int):
    """`lp_plan` on integer ``work: int64[G, E]``; also returns the flexible experts
    ``int64[J]`` (on two or more GPUs) and each expert's home GPU ``int64[E]`` (-1 if
    flexible)."""
    topo = placement.topology
    G, E, N = topo.num_gpus, placement.num_experts, topo.num_nodes
    held = gpu_slots(placement, layer) >= 0  # [E, G]
    ngpu = held.sum(1)
    flex = np.nonzero(ngpu >= 2)[0]
    home = np.where(ngpu == 1, held.argmax(1), -1)
    single = np.nonzero(ngpu == 1)[0]
    out = np.zeros((G, E, G), dtype=np.int64)
    out[:, single, home[single]] = work[:, single]
    fixed = np.bincount(home[single], weights=work[:, single].sum(0), minlength=G)
    if flex.size:
        arc_j, arc_g = np.nonzero(held[flex])
        node = topo.node_of_gpu
        per_node = np.zeros((N, flex.size), dtype=np.int64)
        np.add.at(per_node, node, work[:, flex])
        _, flow = minmax.split(
            work[:, flex].sum(0),
            fixed.astype(np.int64),
            arc_j,
            arc_g,
            source_nodes=per_node.T,
            gpu_node=node,
        )
        out[:, flex, :] = minmax.plan(work[:, flex].T, flow, arc_j, arc_g, node).transpose(1, 0, 2)
    return out, flex, home


def _lp_route(ids: np.ndarray, rank: np.ndarray, placement: Placement, layer: int) -> np.ndarray:
    """``lp`` slots ``int64[N, K]`` of one batch: `lp_plan` of its pick counts; the picks of a
    (source GPU, flexible expert) group take the plan's GPUs in ascending order, in token
    order."""
    topo = placement.topology
    G, E = topo.num_gpus, placement.num_experts
    N, K = ids.shape
    flat = ids.ravel()
    key = np.repeat(rank, K) * E + flat  # (source GPU, expert) of every pick
    amounts = np.bincount(key, minlength=G * E).reshape(G, E)
    table, flex, home = _plan(amounts, placement, layer)
    dest = home[flat]
    moving = np.nonzero(dest < 0)[0]
    if moving.size:
        sub = key[moving]
        sub = sub.astype(np.uint16) if G * E <= 2**16 else sub  # radix sort for 16 bits
        order = np.argsort(sub, kind="stable")
        per = table[:, flex, :].reshape(-1)  # in (source, flexible expert, GPU) key order
        dest[moving[order]] = np.repeat(np.tile(np.arange(G), per.size // G), per)
    return gpu_slots(placement, layer)[flat, dest].reshape(N, K)
