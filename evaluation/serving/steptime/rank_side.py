"""Rank-side cost: what each DP rank computes on its own batch, per micro-batch: attention
projections (``a1``; MLA's for DeepSeek-V3), core attention (``a2``, `attention`), the shared
expert, the dense layers and the output head (docs/serving-calibration.md, "Rank side"). GEMM
curves come from `kernels` (a measured table or the roofline)."""

from __future__ import annotations

import numpy as np

from eplb.evaluation.serving.config.hardware import Hardware
from eplb.evaluation.serving.config.model import ModelSpec
from eplb.evaluation.serving.steptime.attention import AttentionTime
from eplb.evaluation.serving.steptime.batch import RankBatch
from eplb.evaluation.serving.steptime.curves import MEMO_HALVES
from eplb.evaluation.serving.steptime.kernels import gemm_curve


class LayerMix:
    """A curve averaged over layer kinds: ``seconds(m) = sum of weight x curve.seconds(m)``
    over ``parts`` (``(weight, curve)``); one part of weight 1 is that curve itself."""

    def __init__(self, parts) -> None:
        self.parts = list(parts)

    def seconds(self, m) -> np.ndarray:
        return sum(w * c.seconds(m) for w, c in self.parts)

    def memo(self) -> np.ndarray:
        table = self.__dict__.get("_memo")
        if table is None:
            table = self.__dict__["_memo"] = sum(w * c.memo() for w, c in self.parts)
        return table


def projections(model: ModelSpec, hardware: Hardware):
    """The attention projections' curve: one `kernels.gemm_curve` per layer kind, averaged
    over the layers (`LayerMix`; DeepSeek-V3's MLA is one kind, its curve itself)."""
    groups = model.attention_layers
    curves = [gemm_curve(hardware, g.shapes, dtype=model.weight_dtype) for g in groups]
    if len(groups) == 1:
        return curves[0]
    return LayerMix((g.layers / model.num_layers, c) for g, c in zip(groups, curves, strict=True))


class RankSide:
    """Rank-side stage times of one unit (``phase``, ``model``, ``hardware``, micro-batches).

    Shape: every method takes a `RankBatch` of ``G`` ranks and returns ``float64[G]`` seconds
    per rank (``decode_rows``: ``float64[5, G]``).
    """

    def __init__(self, phase: str, model: ModelSpec, hardware: Hardware, micro_batches: int):
        self.phase, self.model, self.hardware = phase, model, hardware
        self.micro_batches = micro_batches
        h, i, dt = model.hidden, model.shared_width, model.weight_dtype
        self.mla = projections(model, hardware)  # attention projections (MLA's for DeepSeek)
        self.attn = AttentionTime(model, hardware)
        # FFN shapes take DeepSeek-V3's rows of the measured table (gate+up as the expert's
        # 4096 x 7168, down as the shared expert's 7168 x 2048 / the dense FFN's 7168 x 16384)
        self.ffn = gemm_curve(
            hardware, ((2 * i, h), (h, i)), dtype=dt,
            substitute={(2 * i, h): (4096, 7168), (h, i): (7168, 2048)},
        )
        di = model.dense_intermediate
        self.dense_ffn = gemm_curve(
            hardware, ((2 * di, h), (h, di)), dtype=dt,
            substitute={(2 * di, h): (4096, 7168), (h, di): (7168, 16384)},
        )
        self.head_gemm = gemm_curve(  # BF16 output head
            hardware, ((model.vocab, h),), dtype="bf16",
            substitute={(model.vocab, h): (4096, 7168)},
        )

    def stages(self, batch: RankBatch):
        """Seconds of one micro-batch per rank: ``(a1, a2, shared)``, each ``float64[G]``."""
        mb, m, hw = self.micro_batches, self.model, self.hardware
        t = batch.tokens / mb
        a1 = self.mla.seconds(t)
        if self.phase == "prefill":
            a2 = self.attn.prefill(batch.attention / mb, t)
            if batch.kv_tokens.any():  # context-parallel KV exchange (pass-KV, overlapped)
                kv = batch.kv_tokens / mb * m.kv_bytes_per_token / (hw.rdma_gbps * 1e9)
                a2 = np.maximum(a2, kv)
        else:
            a2 = self.attn.decode(batch.attention / mb, batch.kv_tokens / mb, t)
        shared = m.shared_experts * self.ffn.seconds(t)
        return a1, a2, shared

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
        if self.attn.plain:
            a2 = np.divide(batch.attention, mb, out=out[1])
            a2 *= self.attn.decode_flops
            a2 /= hw.mla_decode_tflops * 1e12
            kv = batch.kv_tokens / mb
            kv *= self.attn.kv_bytes
            kv /= hw.mla_decode_gbps * 1e9
            np.maximum(a2, kv, out=a2)
        else:
            out[1] = self.attn.decode(batch.attention / mb, batch.kv_tokens / mb,
                                      batch.tokens / mb)
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
