"""Assembly: a MoE layer's seconds from its stage times under the overlap schedule (`layer`:
DeepSeek's DBO in prefill, the 5-stage pipeline in decode), and a step's total and breakdown
from the rank side, the GPU side and the all-to-all (`step`, `decode_step`): as it runs, with
DP equalised, with EP equalised too (docs/serving-calibration.md, "Overlap", "Breakdown")."""

from __future__ import annotations

import numpy as np

from eplb.evaluation.serving.config.hardware import Hardware
from eplb.evaluation.serving.config.model import ModelSpec
from eplb.evaluation.serving.steptime.batch import RankBatch
from eplb.evaluation.serving.steptime.breakdown import StepTime
from eplb.evaluation.serving.steptime.comm import Comm


class Assembly:
    """How one unit's stages add up to a step (``phase``, micro-batches, the hardware's SMs).

    ``sm_factor``: prefill compute in MoE layers slows by ``sms / (sms - comm_sms)`` while the
    normal kernels hold ``comm_sms`` SMs (two micro-batches only; else 1).
    """

    def __init__(
        self,
        phase: str,
        model: ModelSpec,
        hardware: Hardware,
        micro_batches: int,
        dispatch: str,
    ):
        self.phase, self.model, self.hardware = phase, model, hardware
        self.micro_batches, self.dispatch = micro_batches, dispatch
        self.sm_factor = (
            hardware.sms / (hardware.sms - hardware.comm_sms)
            if phase == "prefill" and micro_batches == 2
            else 1.0
        )

    def layer(self, a1, a2, sh, o, moe, d, c):
        """Seconds of one MoE layer from per-micro-batch stage times (scalars or arrays that
        broadcast, e.g. ``float[L]`` per layer or ``float[3, L]`` for three cases):
        projections ``a1``, core attention ``a2``, shared expert ``sh``, overhead ``o``,
        routed experts ``moe``, dispatch ``d`` and combine ``c``."""
        f = self.sm_factor
        if self.micro_batches == 1:
            return a1 + a2 + sh + o + moe + d + c
        if self.phase == "prefill":
            A = f * (a1 + a2 + sh + o)
            M = f * moe
            return np.maximum(A, d) + np.maximum(M, d) + np.maximum(M, c) + np.maximum(A, c)
        return 2 * np.maximum(a1, d) + 2 * np.maximum(a2, c) + 2 * (sh + o + moe)

    def step(
        self,
        batch: RankBatch,
        a1,
        a2,
        sh,
        moe,
        recv,
        links,
        moe_eq,
        links_eq,
        dense_r,
        head_r,
        *,
        balanced: bool,
    ) -> StepTime:
        """The step's time and breakdown from its stage times.

        Shape: rank side ``a1``, ``a2``, ``sh``, ``dense_r``, ``head_r: float[G]`` (one
        micro-batch; dense layers and head for the whole step); GPU side ``moe``, ``moe_eq:
        float[L, G]`` (as-is, every rank at the mean tokens), ``recv: float[L, G]`` picks
        (both micro-batches); ``links``, ``links_eq``: `Comm.links` as-is and DP-equalised.
        """
        m, hw, mb = self.model, self.hardware, self.micro_batches
        o = hw.fit.layer_overhead_s
        # actual, DP-equalised and balanced stage values per layer; each equalisation is
        # clamped so it never adds time (T grows with every stage)
        moe_act = np.maximum.reduce(moe, -1)
        moe_dp = moe_act if moe_eq is moe else np.minimum(moe_act, np.maximum.reduce(moe_eq, -1))
        moe_bal = np.minimum(moe_dp, _mean(moe_eq, -1))
        seconds = Comm.seconds
        d_act, c_act = seconds(links, np.maximum.reduce, np.maximum.reduce)
        if links_eq is links:
            d_dp, c_dp = d_act, c_act
        else:
            d_dp, c_dp = seconds(links_eq, np.maximum.reduce, np.maximum.reduce)
            d_dp, c_dp = np.minimum(d_act, d_dp), np.minimum(c_act, c_dp)
        d_bal, c_bal = seconds(links_eq, _mean, _mean)
        d_bal, c_bal = np.minimum(d_dp, d_bal), np.minimum(c_dp, c_bal)
        a1m, a2m, shm = _mean(a1, 0), _mean(a2, 0), _mean(sh, 0)
        t_act = self.layer(a1.max(), a2.max(), sh.max(), o, moe_act, d_act, c_act)
        t_dp = self.layer(a1m, a2m, shm, o, moe_dp, d_dp, c_dp)
        t_bal = self.layer(a1m, a2m, shm, o, moe_bal, d_bal, c_bal)
        L = m.moe_layers
        per = mb * self.sm_factor  # sm_factor is 1 unless prefill with two micro-batches
        attention = per * L * (a1m + a2m)
        shared = per * L * shm
        overhead_l = per * L * o
        moe_c = per * moe_bal.sum()
        comm = t_bal.sum() - attention - shared - overhead_l - moe_c
        # dense layers and output head: rank-local, the slowest rank decides
        dense_m, head_m = _mean(dense_r, 0), _mean(head_r, 0)
        dense_x, head_x = np.maximum.reduce(dense_r), np.maximum.reduce(head_r)
        dp_wait = (t_act - t_dp).sum() + (dense_x - dense_m) + (head_x - head_m)
        breakdown = {
            "attention": float(attention),
            "shared_expert": float(shared),
            "moe": float(moe_c),
            "comm_exposed": float(comm),
            "dp_wait": float(dp_wait),
            "ep_wait": float((t_dp - t_bal).sum()),
            "dense_layers": float(dense_m),
            "lm_head": float(head_m),
            "overhead": float(overhead_l + hw.fit.step_overhead_s),
        }
        total = float(t_act.sum() + dense_x + head_x + hw.fit.step_overhead_s)
        return StepTime(
            self.phase,
            total,
            breakdown,
            t_act,
            np.maximum.reduce(recv, -1),
            _mean(recv, -1),
            float(batch.tokens.sum()),
            meta={"micro_batches": mb, "dispatch": self.dispatch, "balanced": balanced},
        )

    def decode_step(
        self, batch: RankBatch, rank: np.ndarray, src: np.ndarray, recv, moe, ll
    ) -> StepTime:
        """`step` for decode on a prepared placement, with only the reductions decode needs:
        the low-latency kernels move one copy per pick, so a layer's dispatch and combine
        copies are ``max(top_k x tokens sent, picks received)`` on the worst GPU (as-is), with
        DP equalised (mean sender) and with EP equalised too (mean receiver); the expert GEMMs
        depend on the received picks only, so their DP-equalised value is the actual one. The
        three cases are the rows of ``[3, L]`` arrays, timed by one `layer` call.

        Shape: ``rank: float64[5, G]`` (`RankSide.decode_rows`, changed in place); ``src:
        float[G]`` tokens per rank and micro-batch; ``recv``, ``moe: float[L, G]`` picks and
        expert seconds of one micro-batch; ``ll``: `Comm.ll`.
        """
        m, hw, mb = self.model, self.hardware, self.micro_batches
        L, G, K = m.moe_layers, recv.shape[1], m.top_k
        o = hw.fit.layer_overhead_s
        inv_g = 1.0 / G
        recv_max = np.maximum.reduce(recv, -1)
        recv_mean = np.add.reduce(recv, -1)
        recv_mean *= inv_g
        moe3 = np.empty((3, L))  # expert GEMMs: as-is, DP-equalised (the same), balanced
        np.maximum.reduce(moe, -1, out=moe3[0])
        moe3[1] = moe3[0]
        moe_mean = np.add.reduce(moe, -1)
        moe_mean *= inv_g
        np.minimum(moe3[0], moe_mean, out=moe3[2])
        ks = K * src
        out_max = float(np.maximum.reduce(ks))
        out_mean = float(np.add.reduce(ks) * inv_g)
        ll_d, ll_c = ll
        copies = np.empty((3, L))
        np.maximum(out_max, recv_max, out=copies[0])
        np.minimum(copies[0], np.maximum(out_mean, recv_max), out=copies[1])
        np.minimum(copies[1], np.maximum(out_mean, recv_mean), out=copies[2])
        # rank side: rows a1, a2, shared, dense FFN, head; dense layers replace row 3
        rank[3] += rank[0] + rank[1]
        rank[3] += o
        rank[3] *= m.dense_layers * mb
        total, top = np.add.reduce(rank, 1), np.maximum.reduce(rank, 1)
        a1m, a2m, shm, dense_m, head_m = total * inv_g
        col = np.empty((3, 3, 1))  # [stage a1 / a2 / shared, case, 1]
        col[:, 0, 0] = top[:3]
        col[:, 1, 0] = col[:, 2, 0] = (a1m, a2m, shm)
        t3 = self.layer(col[0], col[1], col[2], o, moe3, copies * ll_d, copies * ll_c)
        t_act_sum, t_dp_sum, t_bal_sum = np.add.reduce(t3, 1)
        per = mb * self.sm_factor
        attention = per * L * (a1m + a2m)
        shared = per * L * shm
        overhead_l = per * L * o
        moe_c = per * np.add.reduce(moe3[2])
        comm = t_bal_sum - attention - shared - overhead_l - moe_c
        dense_x, head_x = top[3], top[4]
        breakdown = {
            "attention": float(attention),
            "shared_expert": float(shared),
            "moe": float(moe_c),
            "comm_exposed": float(comm),
            "dp_wait": float(t_act_sum - t_dp_sum + (dense_x - dense_m) + (head_x - head_m)),
            "ep_wait": float(t_dp_sum - t_bal_sum),
            "dense_layers": float(dense_m),
            "lm_head": float(head_m),
            "overhead": float(overhead_l + hw.fit.step_overhead_s),
        }
        recv_max *= mb
        recv_mean *= mb
        return StepTime(
            self.phase,
            float(t_act_sum + dense_x + head_x + hw.fit.step_overhead_s),
            breakdown,
            t3[0],
            recv_max,
            recv_mean,
            float(np.add.reduce(batch.tokens)),
            meta={"micro_batches": mb, "dispatch": self.dispatch, "balanced": False},
        )


def _mean(x: np.ndarray, axis: int) -> np.ndarray:
    """Mean of ``x: float[...]`` over ``axis`` without `np.mean`'s per-call overhead."""
    return np.add.reduce(x, axis) * (1.0 / x.shape[axis])
