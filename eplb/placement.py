"""Placement: which logical expert every physical slot holds, per layer.

``phy2log: int64[L, P]`` is the placement; ``logcnt: int64[L, E]``, ``log2phy: int64[L, E, R]``
(ascending slot order, ``-1`` padded) and the loads derive from it. Failed GPUs' slots hold
``-1``. See docs/core.md, section "Placement tables".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from eplb.errors import PlacementError
from eplb.loads import as_real_array, check_load
from eplb.tolerance import SHARE_TOL
from eplb.topology import Topology


def _readonly(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


@dataclass(frozen=True, eq=False)
class Placement:
    """A replicated expert placement for ``L`` layers on a `Topology`.

    - ``phy2log: int64[L, P]``: logical expert of each slot; ``-1`` is an empty slot (every
      slot of a failed GPU, and slots a per-layer replica budget leaves unused).
    - ``num_experts``: ``E``; ``topology``: the cluster, ``P = topology.num_slots``.
    - ``replica_share: float64[L, P]`` or ``None``: fraction of its expert's tokens each slot
      receives (per expert summing to 1); ``None`` is an even split ``1 / logcnt``.
    - ``meta``: solver name, parameters, seconds, objective, bound and source.
    - ``layer_ids: int64[L]``: model layer ids of the rows (default ``0..L-1``).

    Construction converts and freezes the arrays; `validate` checks every invariant.
    """

    phy2log: np.ndarray
    num_experts: int
    topology: Topology
    replica_share: np.ndarray | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    layer_ids: np.ndarray | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.topology, Topology):
            raise PlacementError(f"topology must be a Topology, got {type(self.topology).__name__}")
        try:
            raw = np.asarray(self.phy2log)
        except (TypeError, ValueError, OverflowError) as exc:
            raise PlacementError(f"phy2log is not an array: {exc}") from None
        if raw.ndim != 2:
            raise PlacementError(f"phy2log must be 2-D [layers, slots], got shape {raw.shape}")
        if raw.size and not np.issubdtype(raw.dtype, np.integer) or raw.dtype.kind == "b":
            if raw.dtype.kind not in "fiu" or not np.all(np.isfinite(raw)) or not np.all(
                    raw == np.round(raw)) or np.abs(raw).max() >= 2**62:
                raise PlacementError(f"phy2log must hold integer expert ids, got dtype {raw.dtype}")
        object.__setattr__(self, "phy2log", _readonly(raw.astype(np.int64, copy=True)))
        if isinstance(self.num_experts, bool) or not isinstance(
            self.num_experts, (int, np.integer)
        ):
            raise PlacementError(f"num_experts must be an integer, got {self.num_experts!r}")
        if self.num_experts < 1:
            raise PlacementError(f"num_experts must be >= 1, got {self.num_experts}")
        object.__setattr__(self, "num_experts", int(self.num_experts))
        if self.replica_share is not None:
            share = as_real_array(self.replica_share, "replica_share", error=PlacementError)
            object.__setattr__(self, "replica_share", _readonly(share.copy()))
        L = raw.shape[0]
        try:
            ids = np.arange(L) if self.layer_ids is None else np.asarray(self.layer_ids)
        except (TypeError, ValueError, OverflowError) as exc:
            raise PlacementError(f"layer_ids must be {L} integers: {exc}") from None
        if ids.shape != (L,):
            raise PlacementError(
                f"layer_ids must have one id per layer ({L}), got shape {ids.shape}"
            )
        if ids.size and (ids.dtype.kind not in "iu" or np.abs(ids).max() >= 2**62):
            raise PlacementError(f"layer_ids must be integers (model layer ids), got {ids!r}")
        if not isinstance(self.meta, Mapping):
            raise PlacementError(f"meta must be a mapping (dict), got {type(self.meta).__name__}")
        object.__setattr__(self, "layer_ids", _readonly(ids.astype(np.int64, copy=True)))
        object.__setattr__(self, "meta", dict(self.meta))

    # ------------------------------------------------------------------ sizes
    @property
    def num_layers(self) -> int:
        return self.phy2log.shape[0]

    @property
    def num_slots(self) -> int:
        return self.phy2log.shape[1]

    # ------------------------------------------------------------ derived maps
    @cached_property
    def logcnt(self) -> np.ndarray:
        """int64[L, E]: replicas per logical expert."""
        L, E = self.num_layers, self.num_experts
        flat = self.phy2log + (np.arange(L, dtype=np.int64) * E)[:, None]
        ok = (self.phy2log >= 0) & (self.phy2log < E)
        counts = np.bincount(flat[ok], minlength=L * E)
        return _readonly(counts.reshape(L, E))

    @cached_property
    def replica_rank(self) -> np.ndarray:
        """int64[L, P]: ordinal of each slot among its expert's replicas, in slot order."""
        L, P = self.phy2log.shape
        key = self.phy2log
        if key.size and -(2**15) <= key.min() and key.max() < 2**15:
            key = key.astype(np.int16)  # same order; numpy's stable sort is a radix sort here
        order = np.argsort(key, axis=1, kind="stable")  # slots grouped by expert
        sorted_e = np.take_along_axis(self.phy2log, order, axis=1)
        pos = np.broadcast_to(np.arange(P), (L, P))
        new_run = np.ones((L, P), dtype=bool)
        new_run[:, 1:] = sorted_e[:, 1:] != sorted_e[:, :-1]
        run_start = np.maximum.accumulate(np.where(new_run, pos, 0), axis=1)
        rank = np.empty((L, P), dtype=np.int64)
        np.put_along_axis(rank, order, pos - run_start, axis=1)
        return _readonly(rank)

    @cached_property
    def log2phy(self) -> np.ndarray:
        """int64[L, E, R]: slots of each expert in ascending slot order, ``-1`` padded."""
        L, P = self.phy2log.shape
        E = self.num_experts
        R = max(int(self.logcnt.max(initial=0)), 1)
        out = np.full(L * E * R, -1, dtype=np.int64)
        ok = (self.phy2log >= 0) & (self.phy2log < E)
        at = ((np.arange(L)[:, None] * E + self.phy2log) * R + self.replica_rank)[ok]
        out[at] = np.broadcast_to(np.arange(P), (L, P))[ok]
        return _readonly(out.reshape(L, E, R))

    @cached_property
    def share(self) -> np.ndarray:
        """float64[L, P]: fraction of its expert's tokens each slot receives (even if no shares)."""
        if self.replica_share is not None:
            return self.replica_share
        cnt = np.take_along_axis(self.logcnt, np.clip(self.phy2log, 0, self.num_experts - 1), 1)
        return _readonly(np.where(self.phy2log >= 0, 1.0 / np.maximum(cnt, 1), 0.0))

    # ------------------------------------------------------------------ loads
    def slot_load(self, load: ArrayLike) -> np.ndarray:
        """float64[L, P]: tokens each slot receives for ``load: float[L, E]``."""
        load = self._check_load(load)
        return np.take_along_axis(load, np.maximum(self.phy2log, 0), axis=1) * self.share

    def gpu_load(self, load: ArrayLike) -> np.ndarray:
        """float64[L, G]: tokens each GPU receives for ``load: float[L, E]`` (shares honoured)."""
        topo = self.topology
        return (
            self.slot_load(load).reshape(self.num_layers, topo.num_gpus, topo.slots_per_gpu).sum(-1)
        )

    def node_load(self, load: ArrayLike) -> np.ndarray:
        """float64[L, N]: tokens each node receives for ``load: float[L, E]``."""
        topo = self.topology
        return (
            self.gpu_load(load).reshape(self.num_layers, topo.num_nodes, topo.gpus_per_node).sum(-1)
        )

    def _check_load(self, load) -> np.ndarray:
        load = check_load(load)
        if load.shape != (self.num_layers, self.num_experts):
            raise PlacementError(
                f"load has shape {load.shape} but the placement is "
                f"[{self.num_layers} layers, {self.num_experts} experts]"
            )
        return load

    # ------------------------------------------------------------- invariants
    def validate(self) -> Placement:
        """Check every invariant; raise `PlacementError` naming the layer/slot. Returns self."""
        topo = self.topology
        L, P = self.phy2log.shape
        E = self.num_experts
        if L < 1:
            raise PlacementError("phy2log has no layers")
        if P != topo.num_slots:
            raise PlacementError(
                f"phy2log has {P} slots per layer but topology {topo} has {topo.num_slots}"
            )
        if P % topo.num_gpus:
            raise PlacementError(f"{P} slots is not a multiple of {topo.num_gpus} GPUs")
        alive = topo.slot_alive  # [P]; a failed GPU's slots are all empty (-1)
        bad = (self.phy2log < -1) | (self.phy2log >= E)
        if bad.any():
            layer, slot = (int(i) for i in np.argwhere(bad)[0])
            raise PlacementError(
                f"layer {layer} slot {slot} holds expert {self.phy2log[layer, slot]}, "
                f"outside 0..{E - 1} (or -1, an empty slot)"
            )
        on_failed = (self.phy2log != -1) & ~alive
        if on_failed.any():
            layer, slot = (int(i) for i in np.argwhere(on_failed)[0])
            raise PlacementError(
                f"layer {layer} slot {slot} is on failed GPU {int(topo.gpu_of_slot[slot])} but "
                f"holds expert {self.phy2log[layer, slot]}; a failed GPU's slots must be -1"
            )
        P = int(alive.sum())
        if P < E:
            raise PlacementError(f"{P} slots cannot hold {E} experts (need P >= E)")
        cnt = self.logcnt
        missing = cnt < 1
        if missing.any():
            layer, expert = (int(i) for i in np.argwhere(missing)[0])
            raise PlacementError(f"layer {layer} expert {expert} has no replica")
        used = (self.phy2log >= 0).sum(axis=1)  # alive slots less those left empty
        wrong = cnt.sum(axis=1) != used
        if wrong.any():
            layer = int(np.argmax(wrong))
            raise PlacementError(
                f"layer {layer}: logcnt sums to {cnt[layer].sum()}, not {used[layer]}"
            )
        self._check_log2phy()
        if self.replica_share is not None:
            self._check_share()
        return self

    def _check_log2phy(self) -> None:
        l2p = self.log2phy
        L, E, R = l2p.shape
        cnt = self.logcnt
        valid = l2p >= 0
        if not np.array_equal(valid.sum(-1), cnt):
            raise PlacementError("log2phy replica counts disagree with logcnt")
        # with the counts right, "no -1 before a valid slot" is "the first logcnt are valid"
        if not np.array_equal(valid, np.arange(R) < cnt[..., None]):
            raise PlacementError("log2phy has -1 padding before a valid slot")
        # the valid entries in order: each (layer, expert) run of logcnt slots
        slots = l2p[valid]
        run = np.arange(L * E).repeat(cnt.ravel())  # layer * E + expert of each entry
        if not np.array_equal(self.phy2log.ravel()[run // E * self.num_slots + slots], run % E):
            raise PlacementError("log2phy points at a slot holding another expert")
        if np.any((run[1:] == run[:-1]) & (slots[1:] <= slots[:-1])):
            raise PlacementError("log2phy slots are not in ascending slot order")

    def _check_share(self) -> None:
        share = self.replica_share
        if share.shape != self.phy2log.shape:
            raise PlacementError(
                f"replica_share has shape {share.shape}, expected {self.phy2log.shape} like phy2log"
            )
        bad = ~np.isfinite(share) | (share < 0)
        if bad.any():
            layer, slot = (int(i) for i in np.argwhere(bad)[0])
            raise PlacementError(
                f"replica_share[{layer}, {slot}] is {share[layer, slot]}; shares must be >= 0"
            )
        L, E = self.num_layers, self.num_experts
        empty = self.phy2log < 0
        if (share[empty] != 0).any():
            layer, slot = (int(i) for i in np.argwhere(empty & (share != 0))[0])
            raise PlacementError(f"replica_share[{layer}, {slot}] of an empty slot must be 0")
        flat = (np.maximum(self.phy2log, 0) + (np.arange(L) * E)[:, None]).ravel()
        sums = np.bincount(flat, weights=share.ravel(), minlength=L * E).reshape(L, E)
        off = np.abs(sums - 1.0) > SHARE_TOL
        if off.any():
            layer, expert = (int(i) for i in np.argwhere(off)[0])
            raise PlacementError(
                f"replica_share of layer {layer} expert {expert} sums to "
                f"{float(sums[layer, expert]):.12g}, not 1; normalise each expert's shares"
            )

    # ------------------------------------------------------------- utilities
    def with_meta(self, **updates: Any) -> Placement:
        """A copy with ``meta`` updated (arrays are shared, they are read-only)."""
        meta = dict(self.meta)
        meta.update(updates)
        return Placement(
            self.phy2log, self.num_experts, self.topology, self.replica_share, meta, self.layer_ids
        )

    def equals(self, other: Placement) -> bool:
        """Same topology, experts, layer ids, tables and shares (meta ignored)."""
        if not isinstance(other, Placement):
            return False
        if (self.topology, self.num_experts) != (other.topology, other.num_experts):
            return False
        if not (
            np.array_equal(self.phy2log, other.phy2log)
            and np.array_equal(self.layer_ids, other.layer_ids)
        ):
            return False
        if (self.replica_share is None) != (other.replica_share is None):
            return False
        return self.replica_share is None or np.array_equal(self.replica_share, other.replica_share)

    def __repr__(self) -> str:
        shares = ", weighted" if self.replica_share is not None else ""
        return (
            f"Placement({self.num_layers} layers, {self.num_experts} experts, "
            f"{self.num_slots} slots on {self.topology}{shares})"
        )
