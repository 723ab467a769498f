"""`ReferenceExecutor`: one MoE layer executed on ``G`` simulated EP ranks from placement tables.

``forward`` returns the output, equal to ``layer.dense_forward`` for every valid placement (a
placement changes cost, never results), and `ExecutorStats` counted from the buffers the kernels
fill; ``rebalance`` moves expert weights. See docs/core.md, section "The executor".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from eplb.args import check_int, check_number, check_seed
from eplb.dispatch import check_policy
from eplb.errors import InputError, PlacementError
from eplb.executor import kernels
from eplb.executor.model import MoELayer, check_topk
from eplb.placement import Placement
from eplb.topology import Topology

LINK_LOCAL, LINK_NVLINK, LINK_RDMA = 0, 1, 2


def even_token_rank(num_tokens: int, num_gpus: int) -> np.ndarray:
    """``int64[N]``: tokens spread over ranks in contiguous, equal (+-1) shards, in rank order."""
    num_tokens = check_int("num_tokens", num_tokens, 0, 2**40)
    num_gpus = check_int("num_gpus", num_gpus, 1, 2**20)
    return (np.arange(num_tokens, dtype=np.int64) * num_gpus) // max(num_tokens, 1)


@dataclass(frozen=True)
class ExecutorStats:
    """What one `ReferenceExecutor.forward` measured (``G`` GPUs, ``P`` slots).

    - ``gpu_tokens: int64[G]`` (token, k) picks served by each GPU; ``slot_tokens: int64[P]`` per
      slot; ``recv_tokens: int64[G]`` distinct tokens each GPU received (its own included);
      ``flops: int64[G]`` expert FLOPs per GPU (``gpu_tokens * 6 * H * F``).
    - ``layer_index``: the placement row used; ``policy``; ``num_tokens``: ``N``.
    - ``nvlink_bytes``, ``rdma_bytes``: dispatch + combine bytes over each link kind
      (``hidden * dispatch_bytes`` per dispatch copy, ``hidden * combine_bytes`` per combine copy);
      ``dispatch_*`` / ``combine_*`` split them. ``nvlink_transfers``, ``rdma_transfers``: copies
      per direction. ``nvlink_out``, ``nvlink_in``, ``rdma_out``, ``rdma_in: float64[G]``:
      dispatch-phase bytes leaving / entering each GPU per link kind (combine is the reverse:
      out and in swap, scaled by ``combine_bytes / dispatch_bytes``).
    """

    layer_index: int
    policy: str
    num_tokens: int
    gpu_tokens: np.ndarray
    slot_tokens: np.ndarray
    recv_tokens: np.ndarray
    flops: np.ndarray
    nvlink_bytes: float
    rdma_bytes: float
    dispatch_nvlink_bytes: float
    dispatch_rdma_bytes: float
    combine_nvlink_bytes: float
    combine_rdma_bytes: float
    nvlink_transfers: int
    rdma_transfers: int
    nvlink_out: np.ndarray
    nvlink_in: np.ndarray
    rdma_out: np.ndarray
    rdma_in: np.ndarray

    @property
    def max_over_mean(self) -> float:
        """Max over mean of ``gpu_tokens`` (1.0 is perfect balance; nan with no picks)."""
        mean = self.gpu_tokens.mean()
        return float(self.gpu_tokens.max() / mean) if mean > 0 else float("nan")


@dataclass(frozen=True)
class RebalanceReport:
    """Weight moves of one `ReferenceExecutor.rebalance`, per placement layer.

    ``slots_changed, local_bytes, nvlink_bytes, rdma_bytes: int64[L]``; ``expert_bytes`` the
    bytes of one expert's weights. ``slots_changed`` slots that received another expert (an
    emptied slot receives nothing); each received the expert's weights from a slot holding it
    under the old placement, preferring the same GPU (``local_bytes``, no link), then the same
    node (``nvlink_bytes``), else another node (``rdma_bytes``). ``bytes_moved`` counts bytes
    that crossed between ranks (NVLink + RDMA) over all layers: per layer, the
    `eplb.moves.replicas_moved` copies. ``moves`` lists, per layer, ``int64[changed, 3]`` rows
    ``(destination slot, source slot, LINK_LOCAL/NVLINK/RDMA)``.
    """

    expert_bytes: int
    slots_changed: np.ndarray
    local_bytes: np.ndarray
    nvlink_bytes: np.ndarray
    rdma_bytes: np.ndarray
    moves: list = field(repr=False)

    @property
    def bytes_moved(self) -> int:
        return int(self.nvlink_bytes.sum() + self.rdma_bytes.sum())


def weight_moves(old_row: ArrayLike, new_row: ArrayLike, topology: Topology) -> np.ndarray:
    """Plan the weight copies turning slot table ``old_row: int[P]`` into ``new_row: int[P]``.

    Returns ``int64[changed, 3]``: ``(destination slot, source slot, link)`` for every slot that
    receives another expert (a slot emptied to ``-1`` receives nothing), the source holding that
    expert in ``old_row``: one on the destination's GPU if any (``LINK_LOCAL``), else on its
    node (``LINK_NVLINK``), else the lowest such slot elsewhere (``LINK_RDMA``); the lowest slot
    within a tier. All copies read the old weights.
    """
    old = np.asarray(old_row, dtype=np.int64)
    new = np.asarray(new_row, dtype=np.int64)
    dst = np.flatnonzero((old != new) & (new >= 0))
    if dst.size == 0:
        return np.zeros((0, 3), dtype=np.int64)
    S, gpn = topology.slots_per_gpu, topology.gpus_per_node
    missing = np.setdiff1d(new[dst], old)
    if missing.size:
        raise PlacementError(
            f"expert {missing[0]} is in the new placement but on no slot of the old one; "
            "the executor only moves weights between ranks"
        )
    holds = old[None, :] == new[dst][:, None]  # [changed, P]
    gpu = np.arange(old.shape[0]) // S
    same_gpu = holds & (gpu[None, :] == (dst // S)[:, None])
    same_node = holds & ((gpu // gpn)[None, :] == (dst // S // gpn)[:, None])
    link = np.where(
        same_gpu.any(1), LINK_LOCAL, np.where(same_node.any(1), LINK_NVLINK, LINK_RDMA)
    )
    tier = np.where(
        (link == LINK_LOCAL)[:, None],
        same_gpu,
        np.where((link == LINK_NVLINK)[:, None], same_node, holds),
    )
    src = tier.argmax(1)
    return np.stack([dst, src, link], axis=1).astype(np.int64)


class ReferenceExecutor:
    """Run ``layer`` expert-parallel on the ranks of ``placement.topology``.

    ``policy`` picks the replica serving each pick (`eplb.dispatch`), ``seed`` seeds the
    ``random``/``weighted`` policies. Bytes per hidden element on the links: ``dispatch_bytes``
    and ``combine_bytes`` (default 1 and 2: FP8 dispatch and BF16 combine as in DeepSeek's
    deployment, the defaults of ``evaluation.traffic``), whatever dtype the simulation computes in.

    Rank weights of a placement layer are loaded (copied from ``layer``) on first use of that
    ``layer_index``; `rank_weights` returns them as ``[G, S, H, F]`` / ``[G, S, F, H]`` arrays.
    """

    def __init__(
        self,
        layer: MoELayer,
        placement: Placement,
        policy: str = "even",
        seed: int = 0,
        *,
        dispatch_bytes: float = 1,
        combine_bytes: float = 2,
    ) -> None:
        if not isinstance(layer, MoELayer):
            raise InputError(f"layer must be a MoELayer, got {type(layer).__name__}")
        self.layer = layer
        self.placement = self._check_placement(placement)
        self.policy = check_policy(policy).name
        self.seed = check_seed("seed", seed)
        # a zero width would make every link check pass vacuously: > 0
        self.dispatch_bytes = check_number("dispatch_bytes", dispatch_bytes, 0, lo_open=True)
        self.combine_bytes = check_number("combine_bytes", combine_bytes, 0, lo_open=True)
        self._weights: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._buffer = kernels.Buffer()  # receive/reduction rows reused across forward calls
        self.last_rebalance: RebalanceReport | None = None

    def _check_placement(self, placement: Placement) -> Placement:
        if not isinstance(placement, Placement):
            raise InputError(f"placement must be a Placement, got {type(placement).__name__}")
        placement.validate()
        if placement.num_experts != self.layer.num_experts:
            raise InputError(
                f"placement has {placement.num_experts} experts but the layer has "
                f"{self.layer.num_experts}; build "
                f"MoELayer(num_experts={placement.num_experts}, ...)"
            )
        return placement

    @property
    def topology(self) -> Topology:
        return self.placement.topology

    def _layer_row(self, layer_index: int) -> int:
        L = self.placement.num_layers
        if isinstance(layer_index, bool) or not isinstance(layer_index, (int, np.integer)):
            raise InputError(f"layer_index must be an integer, got {layer_index!r}")
        if not -L <= layer_index < L:
            raise InputError(f"layer_index {layer_index} is outside the placement's {L} layers")
        return int(layer_index) % L

    def rank_weights(self, layer_index: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(w1, w3: float[G, S, H, F], w2: float[G, S, F, H])``: the weights each rank holds
        (in the layer's dtype) for placement row ``layer_index``."""
        row = self._layer_row(layer_index)
        if row not in self._weights:
            topo, lay = self.topology, self.layer
            G, S, H, F = topo.num_gpus, topo.slots_per_gpu, lay.hidden, lay.ffn
            experts = self.placement.phy2log[row]
            empty = experts < 0  # a failed GPU's slots hold no expert (-1 is no index)

            def held(w: np.ndarray) -> np.ndarray:
                out = w[np.maximum(experts, 0)]
                out[empty] = 0
                return out

            self._weights[row] = (
                held(lay.w1).reshape(G, S, H, F),
                held(lay.w3).reshape(G, S, H, F),
                held(lay.w2).reshape(G, S, F, H),
            )
        return self._weights[row]

    # ---------------------------------------------------------------- forward
    def forward(
        self,
        x: ArrayLike,
        topk_ids: ArrayLike,
        topk_weights: ArrayLike,
        token_rank: ArrayLike | None = None,
        *,
        layer_index: int = 0,
    ) -> tuple[np.ndarray, ExecutorStats]:
        """Run the layer: ``x: float[N, H]``, ``topk_ids: int[N, K]`` (distinct per token),
        ``topk_weights: float[N, K]``, ``token_rank: int[N]`` source GPU of each token (default
        `even_token_rank`). Uses row ``layer_index`` of the placement tables.

        Returns ``(out: float[N, H], stats)``; ``out`` equals ``layer.dense_forward`` up to
        float rounding (summation order differs).
        """
        lay, topo = self.layer, self.topology
        row = self._layer_row(layer_index)
        x = lay.check_x(x)
        N = x.shape[0]
        ids, w = check_topk(
            topk_ids, topk_weights, num_tokens=N, num_experts=lay.num_experts, dtype=lay.dtype
        )
        if token_rank is None:
            token_rank = even_token_rank(N, topo.num_gpus)
        slots = kernels.route(
            ids, self.placement, layer_index=row, policy=self.policy,
            token_rank=token_rank, seed=self.seed,
        )
        layout = kernels.dispatch_layout(slots, token_rank, topo)
        buf = self._buffer
        recv, rdma = kernels.dispatch(x, layout, buffer=buf)
        y = kernels.expert_compute(recv, layout, *self.rank_weights(row), buffer=buf)
        out = kernels.combine(y, w, layout, buffer=buf)
        return out, self._stats(row, layout, recv, rdma)

    def _stats(self, row: int, layout, recv: np.ndarray, rdma: np.ndarray) -> ExecutorStats:
        """Count what the buffers carried: every ``recv`` row that arrived over NVLink and every
        ``rdma`` row, once in dispatch and once (reversed) in combine."""
        topo, lay = self.topology, self.layer
        G, H = topo.num_gpus, lay.hidden
        d_row, c_row = H * self.dispatch_bytes, H * self.combine_bytes
        nv_rows = layout.nvlink_sender[: recv.shape[0]] >= 0  # recv rows that came over NVLink
        n_nv, n_rdma = int(np.count_nonzero(nv_rows)), int(rdma.shape[0])
        # dispatch: NVLink from the source (direct) or the rail peer (forward) to the
        # destination; RDMA from the source to the rail peer. Combine reverses every copy.
        nv_out = np.bincount(layout.nvlink_sender[nv_rows], minlength=G)
        nv_in = np.bincount(layout.recv_gpu[nv_rows], minlength=G)
        rdma_out = np.bincount(layout.token_rank[layout.rdma_token], minlength=G)
        rdma_in = np.bincount(layout.rdma_gpu, minlength=G)
        slot_tokens = layout.num_picks_per_slot.copy()
        gpu_tokens = slot_tokens.reshape(G, topo.slots_per_gpu).sum(1)
        return ExecutorStats(
            layer_index=row,
            policy=self.policy,
            num_tokens=layout.num_tokens,
            gpu_tokens=gpu_tokens,
            slot_tokens=slot_tokens,
            recv_tokens=layout.num_tokens_per_rank.copy(),
            flops=gpu_tokens * lay.flops_per_pick,
            nvlink_bytes=n_nv * (d_row + c_row),
            rdma_bytes=n_rdma * (d_row + c_row),
            dispatch_nvlink_bytes=n_nv * d_row,
            dispatch_rdma_bytes=n_rdma * d_row,
            combine_nvlink_bytes=n_nv * c_row,
            combine_rdma_bytes=n_rdma * c_row,
            nvlink_transfers=n_nv,
            rdma_transfers=n_rdma,
            nvlink_out=nv_out * d_row,
            nvlink_in=nv_in * d_row,
            rdma_out=rdma_out * d_row,
            rdma_in=rdma_in * d_row,
        )

    # -------------------------------------------------------------- rebalance
    def rebalance(self, new_placement: Placement) -> int:
        """Switch to ``new_placement`` by moving expert weights between ranks.

        Needs the same topology, expert count and layer count. Every slot whose expert changes
        copies it from a slot that held it before (`weight_moves`; same GPU, else same node, else
        remote). Loaded layers are updated by those copies, from the old weights only. Returns
        the bytes that crossed between ranks (NVLink + RDMA) over all layers; the full account
        is in ``self.last_rebalance`` (a `RebalanceReport`).
        """
        new = self._check_placement(new_placement)
        old = self.placement
        if new.topology != old.topology:
            raise InputError(
                f"new placement is on topology {new.topology}, the executor's ranks are "
                f"{old.topology}; build a new ReferenceExecutor for another cluster"
            )
        if new.num_layers != old.num_layers:
            raise InputError(
                f"new placement has {new.num_layers} layers, the executor's has {old.num_layers}"
            )
        topo, S = self.topology, self.topology.slots_per_gpu
        eb = self.layer.expert_bytes
        moves = [weight_moves(old.phy2log[r], new.phy2log[r], topo) for r in range(old.num_layers)]
        for row, (w1, w3, w2) in self._weights.items():
            m = moves[row]
            if m.size == 0:
                continue
            dg, ds, sg, ss = m[:, 0] // S, m[:, 0] % S, m[:, 1] // S, m[:, 1] % S
            for w in (w1, w3, w2):
                w[dg, ds] = w[sg, ss]  # fancy-index read copies the old weights first
        per_link = np.array(
            [np.bincount(m[:, 2], minlength=3) for m in moves], dtype=np.int64
        ).reshape(-1, 3)
        self.last_rebalance = RebalanceReport(
            expert_bytes=eb,
            slots_changed=per_link.sum(1),
            local_bytes=per_link[:, LINK_LOCAL] * eb,
            nvlink_bytes=per_link[:, LINK_NVLINK] * eb,
            rdma_bytes=per_link[:, LINK_RDMA] * eb,
            moves=moves,
        )
        self.placement = new
        return self.last_rebalance.bytes_moved
