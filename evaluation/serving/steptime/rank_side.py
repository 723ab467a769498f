"""Rank-side cost: what each DP rank computes on its own batch, per micro-batch: MLA
projections (``a1``), core attention (``a2``), the shared expert, the dense layers and the
output head (docs/serving-calibration.md, "Rank side")."""

from __future__ import annotations

import numpy as np

from eplb.evaluation.serving.config.hardware import Hardware
from eplb.evaluation.serving.config.model import ModelSpec
from eplb.evaluation.serving.steptime.batch import RankBatch
from eplb.evaluation.serving.steptime.curves import MEMO_HALVES, GemmCurve


class RankSide:
    """Rank-side stage times of one unit (``phase``, ``model``, ``hardware``, micro-batches).

    Shape: every method takes a `RankBatch` of ``G`` ranks and returns ``float64[G]`` seconds
    per rank (``decode_rows``: ``float64[5, G]``).
    """

    def __init__(self, phase: str, model: ModelSpec, hardware: Hardware, micro_batches: int):
        self.phase, self.model, self.hardware = phase, model, hardware
        self.micro_batches = micro_batches
        eff = hardware.fit.dense_scale
        h, i = model.hidden, model.moe_intermediate
        self.mla = GemmCurve(hardware.dense_gemm, model.mla_shapes, efficiency=eff)
        self.ffn = GemmCurve(
            hardware.dense_gemm,
            ((2 * i, h), (h, i)),
            efficiency=eff,
            substitute={(2 * i, h): (4096, 7168), (h, i): (7168, 2048)},
        )
        di = model.dense_intermediate
        self.dense_ffn = GemmCurve(
            hardware.dense_gemm,
            ((2 * di, h), (h, di)),
            efficiency=eff,
            substitute={(2 * di, h): (4096, 7168), (h, di): (7168, 16384)},
        )
        self.head_gemm = GemmCurve(
            hardware.dense_gemm,
            ((model.vocab, h),),
            efficiency=eff,
            scale=hardware.bf16_tflops / hardware.fp8_tflops,
            substitute={(model.vocab, h): (4096, 7168)},
        )

    def stages(self, batch: RankBatch):
        """Seconds of one micro-batch per rank: ``(a1, a2, shared)``, each ``float64[G]``."""
        mb, m, hw = self.micro_batches, self.model, self.hardware
        t = batch.tokens / mb
        a1 = self.mla.seconds(t)
        if self.phase == "prefill":
            a2 = self.prefill_attention(batch.attention / mb, t)
            if batch.kv_tokens.any():  # context-parallel KV exchange (pass-KV, overlapped)
                kv = batch.kv_tokens / mb * m.kv_bytes_per_token / (hw.rdma_gbps * 1e9)
                a2 = np.maximum(a2, kv)
        else:
            a2 = np.maximum(
                batch.attention / mb * m.decode_flops_per_pair / (hw.mla_decode_tflops * 1e12),
                batch.kv_tokens / mb * m.kv_bytes_per_token / (hw.mla_decode_gbps * 1e9),
            )
        shared = m.shared_experts * self.ffn.seconds(t)
        return a1, a2, shared

    def prefill_attention(self, pairs, tokens) -> np.ndarray:
        """Seconds of prefill core attention for ``pairs: float[G]`` attended pairs over
        ``tokens: float[G]`` query tokens per rank: the preset's measured throughput at the
        rank's effective prompt length ``2 x pairs / tokens`` (`Hardware.prefill_attention`;
        else ``fit.prefill_attention_tflops``), times ``fit.engine_efficiency``."""
        hw = self.hardware
        flops = np.asarray(pairs, dtype=np.float64) * self.model.prefill_flops_per_pair
        rows = hw.prefill_attention
        if not rows:
            tflops = hw.fit.prefill_attention_tflops
        else:
            tokens = np.asarray(tokens, dtype=np.float64)
            length = 2.0 * flops / self.model.prefill_flops_per_pair / np.maximum(tokens, 1.0)
            tflops = np.interp(np.log2(np.maximum(length, 1.0)),
                               np.log2([r[0] for r in rows]), [r[1] for r in rows])
        return flops / (tflops * hw.fit.engine_efficiency * 1e12)

    def dense(self, batch: RankBatch, a1: np.ndarray, a2: np.ndarray) -> np.ndarray:
        """``float64[G]``: seconds of the dense layers (both micro-batches) per rank, from one
        micro-batch's attention stages ``a1``, ``a2: float[G]``."""
        m, mb = self.model, self.micro_batches
        o = self.hardware.fit.layer_overhead_s
        return m.dense_layers * mb * (a1 + a2 + self.dense_ffn.seconds(batch.tokens / mb) + o)

    def head(self, rows: np.ndarray) -> np.ndarray:
        """``float64[G]``: output-head seconds per rank, a BF16 GEMM on ``rows: float[G]``
        tokens, at least the time to read its weights."""
        m, hw = self.model, self.hardware
        t = self.head_gemm.seconds(rows)
        floor = m.vocab * m.hidden * 2 / (hw.hbm_gbps * 1e9)
        return np.where(rows > 0, np.maximum(t, floor), 0.0)

    def decode_rows(self, batch: RankBatch) -> np.ndarray:
        """Decode seconds per rank as rows ``(a1, a2, shared, dense FFN, output head)`` of a
        ``float64[5, G]`` array, read from the memoised GEMM tables when every rank's tokens
        are whole or half tokens in range (decode batches are: requests x query tokens),
        else computed."""
        m, hw, mb = self.model, self.hardware, self.micro_batches
        out = np.empty((5, batch.tokens.size))
        a2 = np.divide(batch.attention, mb, out=out[1])
        a2 *= m.decode_flops_per_pair
        a2 /= hw.mla_decode_tflops * 1e12
        kv = batch.kv_tokens / mb
        kv *= m.kv_bytes_per_token
        kv /= hw.mla_decode_gbps * 1e9
        np.maximum(a2, kv, out=a2)
        h = batch.tokens * (2.0 / mb)
        j = h.astype(np.intp)
        h2 = batch.logits * 2.0
        j2 = h2.astype(np.intp)
        # tokens are >= 0 (RankBatch), so whole values equal to their index are >= 0 too
        every = np.logical_and.reduce
        if (
            every(j == h)
            and every(j2 == h2)
            and max(np.maximum.reduce(j), np.maximum.reduce(j2)) < MEMO_HALVES
        ):
            tables = self.__dict__.get("_decode_memo")
            if tables is None:
                head = self.head(np.arange(MEMO_HALVES) / 2.0)
                tables = self.__dict__["_decode_memo"] = (
                    self.mla.memo(),
                    m.shared_experts * self.ffn.memo(),
                    self.dense_ffn.memo(),
                    head,
                )
            mla, shared, dense, head = tables
            mla.take(j, out=out[0], mode="clip")  # (indices checked above)
            shared.take(j, out=out[2], mode="clip")
            dense.take(j, out=out[3], mode="clip")
            head.take(j2, out=out[4], mode="clip")
            return out
        a1, _, sh = self.stages(batch)
        out[0], out[2] = a1, sh
        out[3] = self.dense_ffn.seconds(batch.tokens / mb)
        out[4] = self.head(batch.logits)
        return out
