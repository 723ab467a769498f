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
        """Seconds of each MoE layer under the overlap schedule, every all-to-all a barrier.

        Shape: rank side ``a1``, ``a2``, ``sh: float[..., G]`` (projections, core attention,
        shared expert of one micro-batch per rank; ``G = 1`` for a mean rank; ``sh: float[...,
        L, G]`` under Waterfill, each GPU's shared work per layer), overhead ``o``
        (scalar), ``moe: float[..., L, G]`` routed-expert seconds per GPU (one micro-batch),
        ``d``, ``c: float[..., L]`` dispatch / combine seconds of the slowest GPU; returns
        ``float[..., L]``. Between two barriers a rank runs its own stages back to back, so
        an interval lasts its comm or the slowest rank's *own total* over the stages it runs
        there, whichever is longer (docs/serving-calibration.md, "Overlap")."""
        f = self.sm_factor
        top = np.max
        a1, a2, sh = np.asarray(a1), np.asarray(a2), np.asarray(sh)
        moe, d, c = np.asarray(moe), np.asarray(d), np.asarray(c)
        if sh.ndim > a1.ndim:  # Waterfill: shared work dispatched, run with the experts
            moe, sh = moe + sh, np.zeros(a1.shape)
        if self.micro_batches == 1:
            A = top(a1 + a2 + sh, axis=-1)[..., None] + o
            return A + top(moe, axis=-1) + d + c
        if self.phase == "prefill":
            A = f * (top(a1 + a2 + sh, axis=-1)[..., None] + o)
            M = f * top(moe, axis=-1)
            return np.maximum(A, d) + np.maximum(M, d) + np.maximum(M, c) + np.maximum(A, c)
        # decode: per micro-batch, [core attention || combine] then [projections, wait for
        # the dispatch, shared + routed experts] between the same two barriers
        x2 = np.maximum(top(a2, axis=-1)[..., None], c)
        wait = np.maximum(a1[..., None, :], d[..., None])
        x1 = top(wait + (sh[..., None, :] + o) + moe, axis=-1)
        return 2 * x2 + 2 * x1

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
        sh_act=None,
    ) -> StepTime:
        """The step's time and breakdown from its stage times.

        Shape: rank side ``a1``, ``a2``, ``sh``, ``dense_r``, ``head_r: float[G]`` (one
        micro-batch; dense layers and head for the whole step); GPU side ``moe``, ``moe_eq:
        float[L, G]`` (as-is, every rank at the mean tokens), ``recv: float[L, G]`` picks
        (both micro-batches); ``links``, ``links_eq``: `Comm.links` as-is and DP-equalised;
        ``sh_act: float[L, G]``: the as-is shared work under Waterfill (None: ``sh``, local;
        the equalised cases keep the mean rank's own shared expert).
        """
        m, hw, mb = self.model, self.hardware, self.micro_batches
        o = hw.fit.layer_overhead_s
        # as-is, DP-equalised and balanced layer times; each equalisation is clamped so it
        # never adds time, which keeps both waits >= 0
        moe_act = np.maximum.reduce(moe, -1)
        moe_mean = _mean(moe_eq, -1)
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
        # Waterfill: the mean GPU's shared work per layer, in the expert stage like as-is
        sh_m = np.array([shm]) if sh_act is None else _mean(sh_act, -1)[:, None]
        mean = (np.array([a1m]), np.array([a2m]), sh_m)
        t_act = self.layer(a1, a2, sh if sh_act is None else sh_act, o, moe, d_act, c_act)
        t_dp = np.minimum(t_act, self.layer(*mean, o, moe_eq, d_dp, c_dp))
        moe_bal = np.minimum(moe_act, moe_mean)
        t_bal = np.minimum(t_dp, self.layer(*mean, o, moe_bal[:, None], d_bal, c_bal))
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
        self, batch: RankBatch, rank: np.ndarray, src: np.ndarray, recv, moe, ll, wf=None
    ) -> StepTime:
        """`step` for decode on a prepared placement, with only the reductions decode needs:
        the low-latency kernels move one copy per pick, so a layer's dispatch and combine
        copies are ``max(top_k x tokens sent, picks received)`` on the worst GPU (as-is), with
        DP equalised (mean sender) and with EP equalised too (mean receiver); the expert GEMMs
        depend on the received picks only, so their DP-equalised value is the actual one. The
        three cases are the rows of ``[3, L]`` arrays (`_decode_layers`).

        Shape: ``rank: float64[5, G]`` (`RankSide.decode_rows`, changed in place); ``src:
        float[G]`` tokens per rank and micro-batch; ``recv``, ``moe: float[L, G]`` picks and
        expert seconds of one micro-batch; ``ll``: `Comm.ll`; ``wf``: Waterfill's ``(sh_act:
        float[L, G]`` shared seconds per GPU as-is, ``out: float[L, G]``, ``inn: float[L, G]``
        shared-expert copies each GPU sends / receives on top of its routed ones), or None.
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
        if wf is None:
            sh_act = rank[2]
            np.maximum(out_max, recv_max, out=copies[0])
        else:  # shipped shared-expert tokens: one more copy each, out and in
            sh_act, w_out, w_in = wf
            np.maximum(
                np.maximum.reduce(ks + w_out, -1),
                np.maximum.reduce(recv + w_in, -1),
                out=copies[0],
            )
        np.minimum(copies[0], np.maximum(out_mean, recv_max), out=copies[1])
        np.minimum(copies[1], np.maximum(out_mean, recv_mean), out=copies[2])
        # rank side: rows a1, a2, shared, dense FFN, head; dense layers replace row 3
        rank[3] += rank[0] + rank[1]
        rank[3] += o
        rank[3] *= m.dense_layers * mb
        total, top = np.add.reduce(rank, 1), np.maximum.reduce(rank, 1)
        a1m, a2m, shm, dense_m, head_m = total * inv_g
        # the decode layer (`layer`): 2 max(a2, c) + 2 max over ranks of the rank's own
        # max(a1, d) + shared + o + routed experts; as-is per rank and GPU, DP-equalised (mean
        # rank, GPUs as-is) and balanced (mean rank, mean GPU), each clamped to the one before
        ll_d, ll_c = ll
        d3, c3 = copies * ll_d, copies * ll_c
        t3 = np.empty((3, L))
        if mb != 2:
            means = (np.array([a1m]), np.array([a2m]), np.array([shm]))
            t3[0] = self.layer(rank[0], rank[1], sh_act, o, moe, d3[0], c3[0])
            t3[1] = self.layer(*means, o, moe, d3[1], c3[1])
            t3[2] = self.layer(*means, o, moe3[2][:, None], d3[2], c3[2])
            np.minimum(t3[1], t3[0], out=t3[1])
            np.minimum(t3[2], t3[1], out=t3[2])
        else:
            _decode_layers(t3, rank, sh_act, moe, moe3, d3, c3, top[1], a1m, a2m, shm, o)
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


def _decode_layers(t3, rank, sh_act, moe, moe3, d3, c3, a2_top, a1m, a2m, shm, o) -> None:
    """`Assembly.layer` in decode with two micro-batches for the three cases at once, into
    ``t3: float64[3, L]`` (rows as-is, DP-equalised, balanced; each clamped to the row
    before). Shape: ``rank: float[5, G]`` (`RankSide.decode_rows`), ``moe: float[L, G]``,
    ``moe3``, ``d3``, ``c3: float[3, L]``; ``a2_top`` the slowest rank's core attention;
    ``sh_act: float[G]`` (``rank[2]``) or ``float[L, G]`` (Waterfill) the as-is shared work."""
    x = np.maximum(rank[0][None, :], d3[0][:, None])
    x += sh_act + o
    x += moe
    np.maximum.reduce(x, -1, out=t3[0])
    t3[0] += np.maximum(a2_top, c3[0])
    np.maximum(a1m, d3[1:], out=t3[1:])
    t3[1:] += shm + o
    t3[1:] += moe3[1:]
    t3[1:] += np.maximum(a2m, c3[1:])
    t3 *= 2
    np.minimum(t3[1], t3[0], out=t3[1])
    np.minimum(t3[2], t3[1], out=t3[2])


def _mean(x: np.ndarray, axis: int) -> np.ndarray:
    """Mean of ``x: float[...]`` over ``axis`` without `np.mean`'s per-call overhead."""
    return np.add.reduce(x, axis) * (1.0 / x.shape[axis])
