"""``duplicate``: per-micro-batch expert duplication after UltraEP (Wei et al., "UltraEP:
Unleash MoE Training and Inference on Rack-Scale Nodes with Near-Optimal Load Balancing",
arXiv:2606.04101, 2026): for every MoE layer and micro-batch, on the exact post-gating load, a
planner copies a few hot experts' weights to under-loaded GPUs of the same scale-up domain
(here: the same node, over NVLink) and splits each copied expert's picks between its holders;
the copies are dropped after the layer. UltraEP reports the inter-rank imbalance falling from
1.30-4.01 to 1.01-1.04 and 94.3% of the force-balanced throughput.

The planner here is eplb's greedy (UltraEP's quota-driven planner is not reproduced): up to
``experts`` rounds per (layer, node); each round takes the node's busiest GPU ``h``
(expert-GEMM seconds), its hottest slot (expert ``e``, ``a`` picks), and the least busy GPU
``t`` of the node that holds no copy of ``e`` and has HBM for one more copy; ``e``'s ``a``
picks are split between ``h`` and ``t`` by the two-rank `waterfill.waterline` (the min-max
split of ``a`` given the rest of both GPUs' picks), kept only if it shortens ``h`` by more than
the copy's exposed transfer. A round never raises the node's maximum, conserves picks and
never puts two copies of an expert on one GPU. Picks reach the placement's slots by ``even``
first. Costs: the planner's seconds, the copies over NVLink, hidden behind the previous layer
or not, and the spare HBM the copies need (taken from the KV cache); the serving config's
``[duplicate]`` block sets them (`eplb.evaluation.serving.config.DuplicateConfig`).
docs/serving.md, "Per-micro-batch expert duplication"."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from eplb.dispatch.split import Even
from eplb.dispatch.waterfill import waterline
from eplb.placement import Placement

__all__ = ["Duplicate", "DuplicatePlan", "plan"]


@dataclass(frozen=True)
class Duplicate(Even):
    """``duplicate`` on one unit: picks reach the slots as under ``even`` (its token split and
    expected shares), then each micro-batch's picks are re-split with copies (`plan_step`).

    Settings (`configure`): ``experts`` planner rounds per (layer, node); ``cap`` copies one
    GPU may hold per layer; ``planner_s`` planner seconds per MoE layer and micro-batch;
    ``copy_s`` seconds of one copy over NVLink; ``prefetch``: copies made during the previous
    layer on a predicted load (only what exceeds one layer's time is exposed), else on the
    critical path; ``hbm_gb`` spare HBM per GPU for copies (1e9 bytes). The defaults make no
    copies.
    """

    name = "duplicate"
    per_pick = False
    copies = True
    placement_split = False
    experts: int = 0
    cap: int = 0
    planner_s: float = 0.0
    copy_s: float = 0.0
    prefetch: bool = False
    hbm_gb: float = 0.0

    def plan_step(self, slot: np.ndarray, placement: Placement, seconds=None) -> DuplicatePlan:
        """`plan` of one micro-batch's ``slot: float[L, P]`` picks on ``placement`` with these
        settings; ``seconds``: GEMM seconds of one expert group at ``m`` picks (default the
        picks). A copy must save more than its exposed transfer (``copy_s``, 0 when
        prefetched)."""
        topo = placement.topology
        return plan(slot, placement.phy2log, topo.gpus_per_node, topo.slots_per_gpu,
                    self.experts, self.cap, seconds, 0.0 if self.prefetch else self.copy_s)

    def copy_seconds(self, p: DuplicatePlan) -> np.ndarray:
        """``float64[L]``: seconds of ``p``'s copies per layer, the busiest GPU's sent or
        received copies over NVLink."""
        return np.maximum(p.copies(), p.sent()).max(1) * self.copy_s

    def exposed(self, layers, micro_batches, layer_s, copy_s=None):
        """Planner plus copy seconds per MoE layer and micro-batch, or (``prefetch``) what of
        them exceeds the layer's time per micro-batch; meta ``duplicate_s`` (the step's
        total) and ``duplicate_copy_s``."""
        mb = micro_batches
        per = self.planner_s + (np.zeros(layers) if copy_s is None else copy_s)  # [L]
        if self.prefetch:
            per = np.maximum(per - layer_s / mb, 0.0)
        extra = float(mb * per.sum())
        return extra, {"duplicate_s": extra,
                       "duplicate_copy_s": 0.0 if copy_s is None else float(mb * copy_s.sum())}

    def reserved_bytes(self) -> float:
        return self.hbm_gb * 1e9


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
