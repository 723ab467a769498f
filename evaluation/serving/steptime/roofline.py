"""Kernel-time curves from a roofline, for GPUs (or data types) no kernel table covers: a GEMM
takes the longer of its FLOPs at the dense peak and its bytes (weights, inputs, BF16 outputs)
at the HBM bandwidth, each times an efficiency (`config.roofline.Efficiency`, the kernels' own)
and the serving engine's ``engine_efficiency`` (`hardware.KernelFit`). Same interfaces as
`curves.GemmCurve` and `curves.ExpertCurve`."""

from __future__ import annotations

import numpy as np

from eplb.evaluation.serving.config.hardware import Hardware
from eplb.evaluation.serving.config.model import DTYPE_BYTES, ModelSpec
from eplb.evaluation.serving.config.roofline import HOPPER
from eplb.evaluation.serving.steptime.curves import GemmCurve

OUT_BYTES = 2  # GEMM outputs are BF16


def rates(hardware: Hardware, dtype: str) -> tuple[float, float]:
    """``(FLOP/s, bytes/s)`` a GEMM of weights in ``dtype`` reaches on ``hardware``: the FP8
    peak for FP8 and FP4 weights (FP4 as W4A8), the BF16 peak for BF16, times
    ``gemm_compute``; HBM times ``gemm_memory``; both times the engine's ``engine_efficiency``.
    A GPU with measured tables uses the Hopper efficiencies here (FP4 experts on Hopper)."""
    eff = hardware.roofline or HOPPER
    stack = hardware.fit.engine_efficiency
    peak = hardware.bf16_tflops if dtype == "bf16" else hardware.fp8_tflops
    return (peak * 1e12 * eff.gemm_compute * stack,
            hardware.hbm_gbps * 1e9 * eff.gemm_memory * stack)


def gemm_terms(n: int, k: int, dtype: str) -> tuple[float, float, float]:
    """``(FLOPs per token, weight bytes, bytes per token)`` of a GEMM ``(N, K)`` with weights
    in ``dtype`` (inputs FP8 for FP8/FP4 weights, BF16 for BF16; BF16 outputs)."""
    act = 2 if dtype == "bf16" else 1
    return 2.0 * n * k, n * k * DTYPE_BYTES[dtype], float(k * act + n * OUT_BYTES)


class RooflineGemm(GemmCurve):
    """Seconds of a set of GEMMs ``(N, K)`` at ``M`` tokens: per GEMM the longer of compute and
    memory (`rates`, `gemm_terms`); 0 tokens cost 0. Memoised as `GemmCurve`."""

    def __init__(self, shapes, hardware: Hardware, *, dtype: str) -> None:
        self.flop_rate, self.byte_rate = rates(hardware, dtype)
        self.terms = [gemm_terms(n, k, dtype) for n, k in shapes if n * k]

    def _compute(self, m: np.ndarray) -> np.ndarray:
        out = np.zeros_like(m)
        for flops, weights, per_token in self.terms:
            out += np.maximum(m * (flops / self.flop_rate),
                              (weights + m * per_token) / self.byte_rate)
        return np.where(m > 0, out, 0.0)


class RooflineExpert:
    """Seconds of one routed expert (gate+up ``(2I, H)``, down ``(H, I)``, weights in the
    model's ``expert_dtype``) at ``m`` tokens per expert, from the roofline. ``floor`` and
    ``xs`` as `curves.ExpertCurve`: the time is flat up to 1 token and linear beyond
    ``2 ** xs[-1]`` (past the compute-bound crossover). The hot path runs it as it is (no
    `curves.TabulatedCurve`: as cheap, and exact at the roofline's kinks)."""

    def __init__(self, hardware: Hardware, model: ModelSpec) -> None:
        h, i, dt = model.hidden, model.moe_intermediate, model.expert_dtype
        self.flop_rate, self.byte_rate = rates(hardware, dt)
        self.terms = (gemm_terms(2 * i, h, dt), gemm_terms(h, i, dt))
        # past every GEMM's crossover m* = W / (B (F/C - p/B)) the compute term wins for good
        cross = [w / (f / self.flop_rate - p / self.byte_rate) / self.byte_rate
                 for f, w, p in self.terms if f / self.flop_rate > p / self.byte_rate]
        top = max([64.0, *cross])
        self.floor = 1.0
        self.xs = np.log2([1.0, 2.0 ** np.ceil(np.log2(top))])

    def seconds(self, m) -> np.ndarray:
        """Seconds of one expert at ``m: float[...]`` tokens per expert (same shape)."""
        m = np.asarray(m, dtype=np.float64)
        eff = np.maximum(m, self.floor)
        t = np.zeros_like(eff)
        for flops, weights, per_token in self.terms:
            t += np.maximum(eff * (flops / self.flop_rate),
                            (weights + eff * per_token) / self.byte_rate)
        return np.where(m > 0, t, 0.0)
