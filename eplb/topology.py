"""Cluster shape: nodes x GPUs per node x expert slots per GPU, plus link bandwidths.

Slot ``p`` lives on GPU ``p // S``; GPU ``g`` lives on node ``g // gpus_per_node``.
Bandwidths are in GB/s per GPU; defaults are DeepSeek's published figures for H800 nodes
(NVLink ~160 GB/s, InfiniBand ~50 GB/s per NIC). See docs/core.md, section "Topology".
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from eplb.errors import TopologyError

if TYPE_CHECKING:  # for annotations only: networkx is imported by graph() when used
    import networkx as nx

_SHAPE = re.compile(r"^\s*(\d+)\s*[xX*]\s*(\d+)\s*(?:[xX*]\s*(\d+)\s*)?$")

# sanity limits: far beyond any cluster (DeepSeek-V3 decode: 18 x 8 GPUs, 288 slots), small
# enough that per-slot tables of a model's layers fit in memory
MAX_GPUS = 2**16
MAX_SLOTS = 2**20

# DeepSeek's published per-GPU figures for H800 nodes (profile-data README, DeepEP README):
# the defaults of every bandwidth option in the toolkit
NVLINK_GBPS = 160.0  # GB/s per GPU inside a node
RDMA_GBPS = 50.0  # GB/s per GPU between nodes (one 400 Gb/s NIC)


def _failed(value: object, num_gpus: int) -> tuple[int, ...]:
    """``failed_gpus`` as a sorted tuple of unique GPU indices, at least one GPU left."""
    if value is None:
        return ()
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TopologyError(f"failed_gpus must be a list of GPU indices, got {value!r}")
    out = set()
    for g in value:
        if isinstance(g, bool) or not isinstance(g, (int, np.integer)) or not 0 <= g < num_gpus:
            raise TopologyError(
                f"failed_gpus holds {g!r}; GPU indices run 0..{num_gpus - 1}"
            )
        out.add(int(g))
    if len(out) >= num_gpus:
        raise TopologyError(f"failed_gpus lists all {num_gpus} GPUs; at least one must survive")
    return tuple(sorted(out))


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TopologyError(f"{name} must be a positive integer, got {value!r}")
    if value < 1:
        raise TopologyError(f"{name} must be >= 1, got {value}")
    return int(value)


MIN_GBPS = 1e-6  # 1 KB/s: slower links make times of ~1e300 s
MAX_GBPS = 1e9  # 1 EB/s


@dataclass(frozen=True)
class Topology:
    """``num_nodes`` nodes of ``gpus_per_node`` GPUs, each GPU holding ``slots_per_gpu`` slots.

    ``failed_gpus``: GPUs that have failed (sorted, unique, at least one GPU survives); their
    slots hold no expert (-1 in a `Placement`), and `solvers.solve` places on the others.
    """

    num_nodes: int
    gpus_per_node: int
    slots_per_gpu: int
    nvlink_gbps: float = NVLINK_GBPS
    rdma_gbps: float = RDMA_GBPS
    failed_gpus: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("num_nodes", "gpus_per_node", "slots_per_gpu"):
            object.__setattr__(self, name, _positive_int(name, getattr(self, name)))
        for name in ("nvlink_gbps", "rdma_gbps"):
            value = getattr(self, name)
            if isinstance(value, (bool, np.bool_, str, bytes)):  # float() would take them
                raise TopologyError(f"{name} must be a number in GB/s, got {value!r}")
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise TopologyError(f"{name} must be a number in GB/s, got {value!r}") from None
            if not np.isfinite(value) or value <= 0:
                raise TopologyError(f"{name} must be a positive bandwidth in GB/s, got {value}")
            if not MIN_GBPS <= value <= MAX_GBPS:  # seconds per byte would overflow or vanish
                raise TopologyError(f"{name} {value:g} GB/s is outside {MIN_GBPS:g}.."
                                    f"{MAX_GBPS:g} GB/s; give a real link bandwidth")
            object.__setattr__(self, name, value)
        if self.num_gpus > MAX_GPUS:
            raise TopologyError(
                f"{self.num_nodes} nodes x {self.gpus_per_node} GPUs = {self.num_gpus} GPUs "
                f"exceeds the limit of {MAX_GPUS} GPUs"
            )
        if self.num_slots > MAX_SLOTS:
            raise TopologyError(
                f"{self.num_gpus} GPUs x {self.slots_per_gpu} slots = {self.num_slots} slots per "
                f"layer exceeds the limit of {MAX_SLOTS}"
            )
        object.__setattr__(self, "failed_gpus", _failed(self.failed_gpus, self.num_gpus))

    # ------------------------------------------------------------------ sizes
    @property
    def num_gpus(self) -> int:
        """G, the number of EP ranks."""
        return self.num_nodes * self.gpus_per_node

    @property
    def num_slots(self) -> int:
        """P, physical expert slots per layer across the cluster."""
        return self.num_gpus * self.slots_per_gpu

    @cached_property
    def gpu_of_slot(self) -> np.ndarray:
        """int64[P]: GPU holding each slot."""
        out = np.repeat(np.arange(self.num_gpus, dtype=np.int64), self.slots_per_gpu)
        out.flags.writeable = False
        return out

    @cached_property
    def node_of_gpu(self) -> np.ndarray:
        """int64[G]: node of each GPU."""
        out = np.repeat(np.arange(self.num_nodes, dtype=np.int64), self.gpus_per_node)
        out.flags.writeable = False
        return out

    @cached_property
    def node_of_slot(self) -> np.ndarray:
        """int64[P]: node of each slot."""
        out = self.node_of_gpu[self.gpu_of_slot]
        out.flags.writeable = False
        return out

    @cached_property
    def slot_alive(self) -> np.ndarray:
        """bool[P]: slots on GPUs that have not failed."""
        alive = np.ones(self.num_gpus, dtype=bool)
        alive[list(self.failed_gpus)] = False
        out = alive[self.gpu_of_slot]
        out.flags.writeable = False
        return out

    def with_failed(self, gpus: Iterable[int]) -> Topology:
        """This topology with ``gpus`` failed as well (the union with `failed_gpus`)."""
        return replace(self, failed_gpus=(*self.failed_gpus, *_failed(gpus, self.num_gpus)))

    # ------------------------------------------------------------------ views
    def graph(self) -> nx.Graph:
        """networkx.Graph of GPUs (nodes ``0..G-1``, attribute ``node``) and their links.

        Inside a node every GPU pair is joined by an ``nvlink`` edge; across nodes GPUs with
        the same local index are joined by an ``rdma`` edge (one NIC per GPU, rail-optimised,
        as DeepEP's internode kernels assume: RDMA to the peer GPU, then NVLink forwarding).
        Each edge carries ``kind`` and ``gbps``.
        """
        import networkx as nx  # lazy: networkx is needed only for graph()

        g = nx.Graph(name=str(self))
        per = self.gpus_per_node
        for gpu in range(self.num_gpus):
            g.add_node(gpu, node=gpu // per, local=gpu % per)
        for node in range(self.num_nodes):
            members = range(node * per, (node + 1) * per)
            for a in members:
                for b in members:
                    if a < b:
                        g.add_edge(a, b, kind="nvlink", gbps=self.nvlink_gbps)
        for local in range(per):
            rail = [node * per + local for node in range(self.num_nodes)]
            for i, a in enumerate(rail):
                for b in rail[i + 1 :]:
                    g.add_edge(a, b, kind="rdma", gbps=self.rdma_gbps)
        return g

    def to_dict(self) -> dict:
        out = {
            "num_nodes": self.num_nodes,
            "gpus_per_node": self.gpus_per_node,
            "slots_per_gpu": self.slots_per_gpu,
            "nvlink_gbps": self.nvlink_gbps,
            "rdma_gbps": self.rdma_gbps,
        }
        if self.failed_gpus:
            out["failed_gpus"] = list(self.failed_gpus)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> Topology:
        if not isinstance(data, dict):
            raise TopologyError(f"topology must be an object, got {type(data).__name__}")
        missing = [k for k in ("num_nodes", "gpus_per_node", "slots_per_gpu") if k not in data]
        if missing:
            raise TopologyError(f"topology is missing {', '.join(missing)}")
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)

    @classmethod
    def parse(
        cls,
        text: str,
        slots: int | None = None,
        *,
        nvlink_gbps: float = NVLINK_GBPS,
        rdma_gbps: float = RDMA_GBPS,
        min_slots: int | None = None,
        failed_gpus: Iterable[int] | None = None,
    ) -> Topology:
        """Parse ``"NODESxGPUS"`` (then ``slots`` = total slots P) or ``"NODESxGPUSxSLOTS"``.

        ``Topology.parse("4x8", slots=288)`` is 4 nodes x 8 GPUs x 9 slots per GPU.
        ``min_slots`` (e.g. the expert count E) is checked too (``P >= min_slots``), and the
        fix a message suggests satisfies it: ``--slots 200`` for 256 experts on 32 GPUs says
        "use 256", not a multiple of 32 that still cannot hold the experts. ``failed_gpus``:
        GPU indices that have failed (their slots stay empty; the surviving slots must hold
        ``min_slots``).
        """
        if not isinstance(text, str):
            raise TopologyError(f"topology must be a string like '4x8', got {text!r}")
        if min_slots is not None:
            min_slots = _positive_int("min_slots", min_slots)
        m = _SHAPE.match(text)
        if not m:
            raise TopologyError(
                f"topology {text!r} is not NODESxGPUS (e.g. '4x8') or NODESxGPUSxSLOTS_PER_GPU"
            )
        nodes, gpus = int(m.group(1)), int(m.group(2))
        if nodes < 1 or gpus < 1:
            raise TopologyError(f"topology {text!r} needs at least one node and one GPU per node")
        num_gpus = nodes * gpus
        if num_gpus > MAX_GPUS:
            raise TopologyError(f"topology {text!r} has {num_gpus} GPUs, over the limit of "
                                f"{MAX_GPUS}")
        need = min_slots or 1

        def fix(at_least: int) -> int:  # smallest multiple of the GPUs >= at_least and >= need
            return -(-max(at_least, need) // num_gpus) * num_gpus

        if slots is not None and (
            isinstance(slots, bool) or not isinstance(slots, (int, np.integer)) or slots < 1
        ):
            raise TopologyError(f"slots must be a positive integer, got {slots!r}")
        if m.group(3) is not None:
            per = int(m.group(3))
            if slots is not None and slots != per * num_gpus:
                raise TopologyError(
                    f"slots {slots} disagrees with topology {text!r} ({per * num_gpus} slots)"
                )
        else:
            if slots is None:
                raise TopologyError(
                    f"topology {text!r} gives no slot count; pass slots (e.g. --slots "
                    f"{fix(num_gpus * 9)}) or write NODESxGPUSxSLOTS_PER_GPU"
                )
            if slots > MAX_SLOTS:
                raise TopologyError(f"slots {slots} exceeds the limit of {MAX_SLOTS} slots per "
                                    "layer")
            if slots % num_gpus:
                why = (f" (the smallest multiple of {num_gpus} that holds {need} experts)"
                       if need > slots else "")
                raise TopologyError(
                    f"slots {slots} is not a multiple of {num_gpus} GPUs; use {fix(slots)}{why}"
                )
            per = slots // num_gpus
        if per * num_gpus < need:
            raise TopologyError(
                f"{per * num_gpus} slots cannot hold {need} experts (every expert needs a "
                f"slot); use {fix(need)}"
            )
        topo = cls(nodes, gpus, per, nvlink_gbps=nvlink_gbps, rdma_gbps=rdma_gbps,
                   failed_gpus=failed_gpus)
        alive = int(topo.slot_alive.sum())
        if topo.failed_gpus and alive < need:
            raise TopologyError(
                f"the {num_gpus - len(topo.failed_gpus)} surviving GPUs hold {alive} slots, "
                f"fewer than the {need} experts; use more slots per GPU"
            )
        return topo

    def __str__(self) -> str:
        failed = ",".join(map(str, self.failed_gpus))
        failed = f" (failed GPUs {failed})" if failed else ""
        return f"{self.num_nodes}x{self.gpus_per_node}x{self.slots_per_gpu}{failed}"
