"""Per-micro-batch expert duplication (``dispatch="duplicate"``), after UltraEP (Wei et al.,
"UltraEP: Unleash MoE Training and Inference on Rack-Scale Nodes with Near-Optimal Load
Balancing", arXiv:2606.04101, 2026): for every MoE layer and micro-batch, on the exact
post-gating load, a planner copies a few hot experts' weights to under-loaded GPUs of the same
scale-up domain (here: the same node, over NVLink) and splits each copied expert's picks
between its holders; the copies are dropped after the layer. UltraEP reports the inter-rank
imbalance falling from 1.30-4.01 to 1.01-1.04 and 94.3% of the force-balanced throughput.

The planner here is eplb's greedy (UltraEP's quota-driven planner is not reproduced): up to
`DuplicateConfig.experts` rounds per (layer, node); each round takes the node's busiest GPU
``h`` (expert-GEMM seconds), its hottest slot (expert ``e``, ``a`` picks), and the least busy
GPU ``t`` of the node that holds no copy of ``e`` and has HBM for one more copy; ``e``'s ``a``
picks are split between ``h`` and ``t`` by the two-rank `waterfill.waterline` (the min-max
split of ``a`` given the rest of both GPUs' picks), kept only if it shortens ``h`` by more than
the copy's exposed transfer. A round never raises the node's maximum, conserves picks and
never puts two copies of an expert on one GPU. Costs (`DuplicateConfig`): the planner's
seconds, the copy bytes (``ModelSpec.expert_params``, FP8) over the unit's NVLink bandwidth,
hidden behind the previous layer or not (``overlap``), and the spare HBM the copies need
(taken from the KV cache). docs/serving.md, "Per-micro-batch expert
duplication"."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from eplb.errors import InputError
from eplb.evaluation.serving.steptime.waterfill import waterline
from eplb.executor.routing import POLICIES

__all__ = [
    "DISPATCH",
    "DUPLICATE",
    "DuplicateConfig",
    "DuplicatePlan",
    "check_dispatch",
    "plan",
]

DUPLICATE = "duplicate"
# the serving model's dispatch names: the executor's per-pick policies and duplication
DISPATCH = (*POLICIES, DUPLICATE)
OVERLAP = ("none", "previous_layer")
# Planner seconds per MoE layer and micro-batch: UltraEP gives no planner time in its abstract;
# the default is DeepSeek LPLB's ~100 us on-GPU per-batch solve (README; issue #3), the nearest
# published figure for a per-layer, per-batch planner on the critical path.
DUP_PLANNER_S = 100e-6


def check_dispatch(value) -> str:
    """``value`` if it names a serving dispatch policy (`DISPATCH`), else one `InputError`."""
    if not isinstance(value, str) or value not in DISPATCH:
        raise InputError(
            f"unknown dispatch policy {value!r}; available: {', '.join(DISPATCH)}"
        )
    return value


def _seconds(name: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf:
        raise InputError(f"duplicate.{name} must be a finite number >= 0, got {v!r}")
    return float(v)


@dataclass(frozen=True)
class DuplicateConfig:
    """Settings and costs of ``dispatch="duplicate"`` (TOML block ``[duplicate]``).

    - ``experts``: copies the planner may make per node, MoE layer and micro-batch (K; 0 turns
      duplication off and is refused with that dispatch). Assumption (not published): 8, one
      per GPU of an 8-GPU node.
    - ``hbm_gb``: spare HBM per GPU for copies (1e9 bytes), reserved from the KV cache; with
      ``overlap="previous_layer"`` two layers' copies are live at once (double buffer).
      Assumption (not published): 0.5 GB, 11 DeepSeek-V3 FP8 experts, 0.6% of an H800.
    - ``planner_s``: planner seconds per MoE layer and micro-batch (`DUP_PLANNER_S`).
    - ``overlap``: ``"none"`` (UltraEP: the plan and copy follow the gate, on the critical path)
      or ``"previous_layer"`` (weights prefetched during the previous layer on a predicted load,
      as the MoonEP-style prefetch the issue describes: only what exceeds one layer's time per
      micro-batch is exposed; an optimistic bound, the prediction is taken as exact).
    """

    experts: int = 8
    hbm_gb: float = 0.5
    planner_s: float = DUP_PLANNER_S
    overlap: str = "none"

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        k = self.experts
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
            raise InputError(
                f"duplicate.experts must be an integer >= 0 (copies per node, layer and "
                f"micro-batch), got {k!r}"
            )
        _seconds("hbm_gb", self.hbm_gb)
        _seconds("planner_s", self.planner_s)
        if self.overlap not in OVERLAP:
            raise InputError(
                f"duplicate.overlap must be one of {', '.join(map(repr, OVERLAP))}, "
                f"got {self.overlap!r}"
            )

    @property
    def buffers(self) -> int:
        """Layers whose copies are live at once (2 when prefetched under the previous one)."""
        return 2 if self.overlap == "previous_layer" else 1

    def copies_per_gpu(self, expert_bytes: float) -> int:
        """Copies one GPU may hold per layer within ``hbm_gb`` (``expert_bytes`` per copy)."""
        return int(self.hbm_gb * 1e9 // (expert_bytes * self.buffers))

    def check_usable(self, gpus_per_node: int, expert_bytes: float) -> None:
        """Refuse (one `InputError`) a unit that cannot duplicate: one GPU per node (no peer
        in the node to copy to), ``experts`` 0, or a budget below one copy."""
        if gpus_per_node < 2:
            raise InputError(
                "dispatch 'duplicate' copies experts to other GPUs of the same node; this unit "
                "has 1 GPU per node: use dispatch 'even' or 'lp', or more GPUs per node"
            )
        if self.experts < 1:
            raise InputError(
                "dispatch 'duplicate' with duplicate.experts = 0 makes no copies: set "
                "duplicate.experts >= 1 or use dispatch 'even'"
            )
        if self.copies_per_gpu(expert_bytes) < 1:
            need = expert_bytes * self.buffers / 1e9
            raise InputError(
                f"duplicate.hbm_gb = {self.hbm_gb} GB holds no expert copy ({need:.3f} GB each"
                f"{' x 2 buffers' if self.buffers == 2 else ''}): raise duplicate.hbm_gb to "
                f">= {need:.3f} or use dispatch 'even'"
            )


@dataclass(frozen=True, eq=False)
class DuplicatePlan:
    """One micro-batch's copies, per (layer, node) cell and round ``k`` (``K`` rounds).

    Shape: ``slot: float64[L, P]`` picks left on the placement's slots; ``gpu: int64[L, N, K]``
    GPU each copy lands on (-1: no copy that round), ``expert: int64[L, N, K]`` its expert,
    ``source: int64[L, N, K]`` the GPU it is copied from, ``picks: float64[L, N, K]`` picks the
    copy serves; ``recv: float64[L, G]`` picks per GPU with the copies."""

    slot: np.ndarray
    gpu: np.ndarray
    expert: np.ndarray
    source: np.ndarray
    picks: np.ndarray
    recv: np.ndarray

    def copies(self) -> np.ndarray:
        """``int64[L, G]``: copies each GPU receives per layer."""
        L, G = self.recv.shape
        made = self.gpu >= 0
        flat = (np.arange(L)[:, None, None] * G + self.gpu)[made]
        return np.bincount(flat, minlength=L * G).reshape(L, G)

    def sent(self) -> np.ndarray:
        """``int64[L, G]``: copies each GPU sends per layer."""
        L, G = self.recv.shape
        made = self.gpu >= 0
        flat = (np.arange(L)[:, None, None] * G + self.source)[made]
        return np.bincount(flat, minlength=L * G).reshape(L, G)


def plan(
    slot: np.ndarray, phy2log: np.ndarray, gpus_per_node: int, slots_per_gpu: int,
    experts: int, cap: int, seconds=None, min_gain: float = 0.0,
) -> DuplicatePlan:
    """The greedy duplication plan (module docstring) of one micro-batch.

    ``slot: float[L, P]`` picks per slot (>= 0) on a placement whose slot experts are
    ``phy2log: int[L, P]`` (-1 empty), ``P = N * gpus_per_node * slots_per_gpu``; ``experts``
    rounds per (layer, node), at most ``cap`` copies per GPU and layer. ``seconds``: GEMM
    seconds of one expert group at ``m: float[...]`` picks (default: the picks themselves, so
    the plan balances picks); the busiest GPU and the least busy target are chosen by it, and a
    round is kept only where it shortens the node's busiest GPU by more than ``min_gain``
    (seconds; the copy's exposed transfer, so that a copy pays for itself)."""
    f = (lambda m: m) if seconds is None else seconds
    slot = np.array(slot, dtype=np.float64, order="C")  # C order: ``s`` below is a view
    L, P = slot.shape
    Gn, S = gpus_per_node, slots_per_gpu
    N = P // (Gn * S)
    C, K = L * N, int(experts)
    s = slot.reshape(C, Gn, S)  # a view: rounds write through to ``slot``
    x = np.asarray(phy2log).reshape(C, Gn, S)
    w = s.sum(-1)  # [C, Gn] picks per GPU
    sec = f(s).sum(-1)  # [C, Gn] GEMM seconds per GPU
    cnt = np.zeros((C, Gn), dtype=np.int64)
    c_gpu = np.full((C, K), -1, dtype=np.int64)
    c_exp = np.full((C, K), -1, dtype=np.int64)
    c_src = np.full((C, K), -1, dtype=np.int64)
    c_pick = np.zeros((C, K))
    rows = np.arange(C)
    gpus = np.arange(Gn)
    for k in range(K if cap > 0 and Gn > 1 else 0):
        h = sec.argmax(1)
        j = s[rows, h].argmax(1)
        e = x[rows, h, j]
        a = s[rows, h, j]
        holds = (x == e[:, None, None]).any(-1)  # [C, Gn] placement holders of e
        holds |= ((c_exp[:, None, :] == e[:, None, None])
                  & (c_gpu[:, None, :] == gpus[None, :, None])).any(-1)  # earlier copies
        ok = ~holds & (cnt < cap)
        t = np.where(ok, sec, np.inf).argmin(1)
        m = waterline(np.stack([w[rows, h] - a, w[rows, t]], 1), a)[:, 1]  # [C]
        h_new = sec[rows, h] - f(a) + f(a - m)
        t_new = sec[rows, t] + f(m)
        gain = sec[rows, h] - np.maximum(h_new, t_new)
        go = np.flatnonzero(ok[rows, t] & (e >= 0) & (m > 0) & (gain > min_gain))
        if not go.size:
            break
        hg, tg, mg = h[go], t[go], m[go]
        s[go, hg, j[go]] -= mg
        w[go, hg] -= mg
        w[go, tg] += mg
        sec[go, hg], sec[go, tg] = h_new[go], t_new[go]
        cnt[go, tg] += 1
        c_gpu[go, k], c_exp[go, k], c_src[go, k], c_pick[go, k] = tg, e[go], hg, mg
    node0 = (np.arange(C) % N * Gn)[:, None]  # first GPU of each cell's node
    glob = lambda a: np.where(a >= 0, a + node0, -1).reshape(L, N, K)  # noqa: E731
    return DuplicatePlan(s.reshape(L, P), glob(c_gpu), c_exp.reshape(L, N, K), glob(c_src),
                         c_pick.reshape(L, N, K), w.reshape(L, N * Gn))
