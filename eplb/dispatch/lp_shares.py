"""The ``lp`` dispatch in counts mode when every source routes alike: each layer's picks per
expert split over the expert's GPUs by the exact min-max rule (the method of `minmax.split`),
returned as each slot's share of its expert's picks (``float64[L, P]``), the form the traffic
model's fast path and the step-time model consume. `LpShares` builds one flow network for all
layers once per placement and re-solves it per step. Rules: docs/core.md, "Dispatch policies"."""

from __future__ import annotations

import numpy as np
from ortools.graph.python import max_flow

from eplb.dispatch.tables import gpu_slots
from eplb.errors import InputError
from eplb.placement import Placement

__all__ = ["LpShares", "lp_shares"]

_SCALE = 2.0**40  # a layer's picks as integers: ~1e-12 relative rounding
_KEEP = 8  # cut sets remembered per layer for the warm start


class LpShares:
    """``lp`` shares of one placement's slots for any per-expert load (`__call__`).

    The network: source -> flexible expert ``(layer, j)`` (capacity its picks) -> each GPU
    holding it (capacity the layer's picks) -> ``(layer, GPU)`` -> sink (capacity ``T[layer] -
    fixed[layer, GPU]``), over the ``(layer, GPU)`` pairs that hold a flexible expert only.
    Layers are disjoint components, so one max-flow runs `minmax.split`'s Newton step on every
    layer at once; each layer's ``T`` is raised to its own cut bound until all picks flow."""

    def __init__(self, placement: Placement):
        if not isinstance(placement, Placement):
            raise InputError(f"placement must be a Placement, got {type(placement).__name__}")
        self.placement = placement
        topo = placement.topology
        L, G = placement.num_layers, topo.num_gpus
        tables = np.stack([gpu_slots(placement, layer) for layer in range(L)])  # [L, E, G]
        held = tables >= 0
        ngpu = held.sum(2)  # [L, E]
        # single-GPU experts: (layer, expert) -> home GPU and slot
        self.s_layer, self.s_expert = np.nonzero(ngpu == 1)
        self.s_gpu = held[self.s_layer, self.s_expert].argmax(1)
        self.s_slot = tables[self.s_layer, self.s_expert, self.s_gpu]
        # flexible experts (on >= 2 GPUs) and their arcs
        self.f_layer, self.f_expert = np.nonzero(ngpu >= 2)  # [F], layer-major
        f_idx, self.a_gpu = np.nonzero(held[self.f_layer, self.f_expert])  # [A]
        self.a_flex = f_idx
        self.a_layer = self.f_layer[f_idx]
        self.a_slot = tables[self.a_layer, self.f_expert[f_idx], self.a_gpu]
        cnt = np.take_along_axis(placement.logcnt, np.maximum(placement.phy2log, 0), 1)
        self._even = np.where(placement.phy2log >= 0, 1.0 / np.maximum(cnt, 1), 0.0)
        self.L, self.G = L, G
        # per-placement index tables reused by every call (flat indices into [L, E] / [L, P])
        E, P = placement.num_experts, topo.num_slots
        phy = placement.phy2log
        self._s_flat = self.s_layer * E + self.s_expert
        self._s_lg = self.s_layer * G + self.s_gpu
        single = np.zeros((L, E), dtype=bool)
        single[self.s_layer, self.s_expert] = True
        self._single_slots = np.take_along_axis(single, np.maximum(phy, 0), 1) & (phy >= 0)
        self._s_out = self.s_layer * P + self.s_slot
        self._f_flat = self.f_layer * E + self.f_expert
        flex_of = np.full((L, E), -1, dtype=np.int64)
        flex_of[self.f_layer, self.f_expert] = np.arange(self.f_layer.size)
        slot_flex = np.where(phy >= 0, np.take_along_axis(flex_of, np.maximum(phy, 0), 1), -1)
        self._fs_pos = np.flatnonzero(slot_flex >= 0)  # flat [L, P] slots of flexible experts
        self._fs_f = slot_flex.ravel()[self._fs_pos]
        self._a_out = self.a_layer * P + self.a_slot
        # the all-layers-live output before the flexible experts' shares: a single-GPU expert
        # on its home GPU's lowest slot (its other slots there 0), the rest even
        base = self._even.copy()
        base[self._single_slots] = 0.0
        base.ravel()[self._s_out] = 1.0
        self._base = base
        F, A = self.f_layer.size, self.a_flex.size
        self._F, self._A = F, A
        if F == 0:
            return
        # (layer, GPU) pairs that hold a flexible expert: the only GPU nodes of the network (a
        # GPU without one has no inflow, so it never lies on a cut's source side)
        self._u_lg, a_u = np.unique(self.a_layer * G + self.a_gpu, return_inverse=True)
        self._a_u = a_u.ravel()
        self._u_layer = self._u_lg // G
        U = self._u_lg.size
        # nodes: 0 source, 1 sink, 2.. flexible experts, then the (layer, GPU) pairs above
        flex_node = 2 + np.arange(F)
        gpu_node = 2 + F + np.arange(U)
        tails = np.concatenate([np.zeros(F, int), flex_node[self.a_flex], gpu_node])
        heads = np.concatenate([flex_node, gpu_node[self._a_u], np.ones(U, int)])
        self._mf = max_flow.SimpleMaxFlow()
        self._mf.add_arcs_with_capacity(
            tails.astype(np.int32), heads.astype(np.int32), np.zeros(tails.size, dtype=np.int64)
        )
        self._mid_arcs = np.arange(F, F + A, dtype=np.int32)
        self._sink_arcs = np.arange(F + A, F + A + U, dtype=np.int32)
        self._all_arcs = np.arange(F + A + U, dtype=np.int32)
        self._a_total = np.zeros(F + A + U, dtype=np.int64)  # arc capacities, reused per call
        # per layer, the last _KEEP GPU sets that bound T (newest first; over the pairs
        # above): the warm start's bound is the best of them, so fewer Newton solves; the
        # final solve, at the optimal T, is the same whatever the start (every start is a
        # lower bound), hence the shares
        self._Xs = np.zeros((_KEEP, U), dtype=bool)
        # arcs by (layer, GPU) pair (CSR) and arcs per flexible expert, for `_hall`
        self._u_arcs = np.argsort(self._a_u, kind="stable")
        self._u_deg = np.bincount(self._a_u, minlength=U)
        self._u_ptr = np.cumsum(self._u_deg) - self._u_deg
        self._f_deg = np.bincount(self.a_flex, minlength=F)
        self._sets: tuple[np.ndarray, ...] | None = None  # `_hall_sets`, until _Xs changes
        self.solves = 0  # max-flow solves so far (benchmarks report solves per call)

    def _hall_sets(self) -> tuple[np.ndarray, ...]:
        """What `_hall` needs of the remembered sets ``_Xs: bool[K, U]``, rebuilt only after
        they change: ``(uu, key, n, f, f_key)``, the members (indices into the pairs) and their
        ``k * L + layer`` keys, the members per key ``int64[K * L]``, and the flexible experts
        whose every arc lies inside a set with that set's key. Works on the members only (a
        few hundred pairs, not ``K x U``)."""
        if self._sets is not None:
            return self._sets
        L, F = self.L, self._F
        kk, uu = np.nonzero(self._Xs)
        K = self._Xs.shape[0]
        key = kk * L + self._u_layer.take(uu)
        n = np.bincount(key, minlength=K * L)
        f = f_key = np.zeros(0, dtype=np.int64)
        if kk.size:
            # the members' arcs, then the flexible experts with every arc inside the set
            deg = self._u_deg.take(uu)
            ends = np.cumsum(deg)
            pos = np.arange(ends[-1]) + np.repeat(self._u_ptr.take(uu) - (ends - deg), deg)
            fkey = np.repeat(kk, deg) * F + self.a_flex.take(self._u_arcs.take(pos))
            uniq, cnt = np.unique(fkey, return_counts=True)
            full = uniq[cnt == self._f_deg.take(uniq % F)]
            f = full % F
            f_key = (full // F) * L + self.f_layer.take(f)
        self._sets = (uu, key, n, f, f_key)
        return self._sets

    def _hall(self, fixed_u: np.ndarray, demand: np.ndarray) -> np.ndarray:
        """``int64[L]``: the best over the remembered GPU sets per layer (``_Xs: bool[K, U]``
        over the pairs holding a flexible expert) of ceil((fixed picks on X + picks of
        flexible experts whose GPUs all lie in X) / |X|): a lower bound on ``T`` for any split
        (every such pick must land in X); 0 for an empty set. ``fixed_u: int64[U]``."""
        uu, key, n, f, f_key = self._hall_sets()
        L = self.L
        if uu.size == 0:
            return np.zeros(L, dtype=np.int64)
        KL = n.size
        x = np.bincount(key, weights=fixed_u.take(uu), minlength=KL)
        y = np.bincount(f_key, weights=demand.take(f), minlength=KL)
        num = (y + x).astype(np.int64)
        return np.where(n > 0, -(-num // np.maximum(n, 1)), 0).reshape(-1, L).max(0)

    def __call__(self, load: np.ndarray) -> np.ndarray:
        """``float64[L, P]``: share of its expert's picks each slot receives when each layer's
        ``load: float[L, E]`` (picks per expert, finite >= 0, unchecked) is split by the exact
        min-max rule; an expert's shares sum to 1, empty slots get 0, an expert without picks
        splits evenly (every split is then optimal)."""
        L, G = self.L, self.G
        total = np.add.reduce(load, 1)
        live = total > 0
        if live.all():
            work = np.rint(load * (_SCALE / total)[:, None]).astype(np.int64)  # [L, E]
            out = self._base.copy()
        else:
            scale = np.where(live, _SCALE / np.where(live, total, 1.0), 0.0)
            work = np.rint(load * scale[:, None]).astype(np.int64)
            out = self._even.copy()
            # a single-GPU expert: its picks on its GPU's lowest slot (other slots there 0)
            out[self._single_slots & live[:, None]] = 0.0
            out.ravel()[self._s_out[live[self.s_layer]]] = 1.0
        if self._F == 0:
            return out
        flat = work.ravel()
        fixed = np.bincount(
            self._s_lg, weights=flat.take(self._s_flat), minlength=L * G
        ).astype(np.int64)  # [L * G]
        demand = flat.take(self._f_flat)  # [F]
        flex_total = np.bincount(self.f_layer, weights=demand, minlength=L).astype(np.int64)
        layer_total = np.add.reduce(work, 1)
        T = np.maximum(np.maximum.reduce(fixed.reshape(L, G), 1), -(-layer_total // G))
        fixed_u = fixed.take(self._u_lg)  # [U]
        T = np.maximum(T, self._hall(fixed_u, demand))  # warm start, still a bound
        mf, F, A = self._mf, self._F, self._A
        caps = self._a_total
        caps[:F] = demand
        caps[F : F + A] = layer_total.take(self.a_layer)
        caps[F + A :] = T.take(self._u_layer) - fixed_u
        mf.set_arcs_capacity(self._all_arcs, caps)
        want = int(flex_total.sum())
        for _ in range(G + 2):
            self.solves += 1
            if mf.solve(0, 1) != mf.OPTIMAL:  # pragma: no cover - small non-negative ints
                raise RuntimeError("lp shares: max-flow failed")
            if mf.optimal_flow() == want:
                break
            sink_flow = np.bincount(
                self._u_layer, weights=np.asarray(mf.flows(self._sink_arcs)), minlength=L
            )
            short = sink_flow < flex_total
            side = np.asarray(mf.get_source_side_min_cut(), dtype=np.int64)
            ys = side[(side >= 2) & (side < 2 + F)] - 2
            us = side[side >= 2 + F] - 2 - F  # (layer, GPU) pairs, as indices into _u_lg
            u_layer = self._u_layer[us]
            y_sum = np.bincount(self.f_layer[ys], weights=demand[ys], minlength=L)
            x_fix = np.bincount(u_layer, weights=fixed_u[us], minlength=L)
            x_cnt = np.bincount(u_layer, minlength=L)
            nxt = -(-(y_sum + x_fix).astype(np.int64) // np.maximum(x_cnt, 1))
            if (nxt[short] <= T[short]).any():  # pragma: no cover - the cut argument
                raise RuntimeError("lp shares: the cut did not raise the bound")
            T = np.where(short, nxt, T)
            X = np.zeros(self._u_lg.size, dtype=bool)
            X[us] = True
            # the sets that bound these layers: next call's start (oldest dropped)
            short_u = short[self._u_layer]
            self._Xs[1:, short_u] = self._Xs[:-1, short_u]
            self._Xs[0, short_u] = X[short_u]
            self._sets = None
            mf.set_arcs_capacity(self._sink_arcs, T.take(self._u_layer) - fixed_u)
        else:  # pragma: no cover - at most G raises per layer
            raise RuntimeError("lp shares did not converge")
        flow = np.asarray(mf.flows(self._mid_arcs), dtype=np.float64)
        d = demand.take(self.a_flex)
        ok = d > 0
        # a flexible expert with picks: its flow per GPU on that GPU's lowest slot, 0 elsewhere
        o = out.ravel()
        o[self._fs_pos[demand.take(self._fs_f) > 0]] = 0.0
        o[self._a_out[ok]] = flow[ok] / d[ok]
        return out


def lp_shares(placement: Placement, load: np.ndarray) -> np.ndarray:
    """`LpShares` of ``placement`` applied once to ``load: float[L, E]``."""
    return LpShares(placement)(np.asarray(load, dtype=np.float64))
