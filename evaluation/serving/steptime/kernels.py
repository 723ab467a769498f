"""Which kernel curve each GEMM gets: a measured table (`curves.GemmCurve`,
`curves.ExpertCurve`) where the hardware has one for the weights' data type, else the roofline
(`roofline.RooflineGemm`, `roofline.RooflineExpert`); and `labels`, what each printed figure
rests on (``measured``, ``calibrated`` or ``roofline``)."""

from __future__ import annotations

import numpy as np

from eplb.evaluation.serving.config.hardware import Hardware
from eplb.evaluation.serving.config.model import ModelSpec
from eplb.evaluation.serving.steptime.curves import ExpertCurve, GemmCurve
from eplb.evaluation.serving.steptime.roofline import RooflineExpert, RooflineGemm

TABLE_DTYPES = ("fp8", "bf16")  # the measured tables are FP8; BF16 at the BF16/FP8 peak ratio
LABELS = ("measured", "calibrated", "roofline")


def gemm_curve(hardware: Hardware, shapes, *, dtype: str, substitute: dict | None = None):
    """The curve of the GEMMs ``shapes`` (``(N, K)`` each) with weights in ``dtype``: the
    hardware's dense table where it has one (a shape it lacks takes ``substitute``'s row, else
    the nearest row in log N + log K: "measured, DeepSeek-V3 shapes"), at ``bf16 / fp8`` of its
    throughput for BF16 weights; the roofline otherwise (FP4 weights, datasheet GPUs)."""
    if hardware.dense_gemm and dtype in TABLE_DTYPES:
        table = {(r[1], r[2]) for r in hardware.dense_gemm}
        sub = dict(substitute or {})
        for shape in shapes:
            if shape not in table and shape not in sub:
                sub[shape] = _nearest(shape, table)
        scale = hardware.bf16_tflops / hardware.fp8_tflops if dtype == "bf16" else 1.0
        return GemmCurve(hardware.dense_gemm, shapes, efficiency=hardware.fit.dense_scale,
                         scale=scale, substitute=sub)
    return RooflineGemm(shapes, hardware, dtype=dtype)


def expert_curve(hardware: Hardware, model: ModelSpec):
    """One routed expert's curve: the hardware's grouped table (DeepSeek-V3's expert shapes,
    scaled to BF16 for BF16 experts) or the roofline."""
    dt = model.expert_dtype
    if hardware.grouped_gemm and dt in TABLE_DTYPES:
        scale = hardware.bf16_tflops / hardware.fp8_tflops if dt == "bf16" else 1.0
        return ExpertCurve(hardware.grouped_gemm, model,
                           efficiency=hardware.fit.grouped_scale * scale)
    return RooflineExpert(hardware, model)


def _nearest(shape: tuple[int, int], table) -> tuple[int, int]:
    n, k = shape
    return min(sorted(table), key=lambda s: abs(np.log2(s[0] / max(n, 1)))
               + abs(np.log2(s[1] / max(k, 1))))


def labels(hardware: Hardware, model: ModelSpec) -> dict[str, str]:
    """What each kernel figure of ``model`` on ``hardware`` rests on: ``measured`` (a public
    kernel benchmark on this GPU, or a constant pinned by one: `hardware.KernelFit`),
    ``calibrated`` (``engine_efficiency``, the one constant fitted end to end on SGLang's H100
    run) or ``roofline`` (datasheet figures times efficiencies)."""
    measured = hardware.roofline is None
    table = "measured" if measured else "roofline"
    return {
        "grouped_gemm": table if model.expert_dtype in TABLE_DTYPES else "roofline",
        "dense_gemm": table if model.weight_dtype in TABLE_DTYPES else "roofline",
        "prefill_attention": table,
        "decode_attention": table,
        "dispatch_combine": table,
        # pinned on H100's kernel modules; another GPU carries H100's value, as it carries
        # engine_efficiency: both rest on the H100 calibration there
        "layer_overhead": "measured" if measured else "calibrated",
        "engine_efficiency": "calibrated",
    }


def describe(hardware: Hardware, model: ModelSpec) -> str:
    """One line saying what the figures of ``model`` on ``hardware`` rest on, roofline first
    (the line a result built on roofline curves starts with)."""
    lab = labels(hardware, model)
    roof = [k for k, v in lab.items() if v == "roofline"]
    parts = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in lab.items())
    if roof:
        head = (f"ROOFLINE: {hardware.name}'s {', '.join(r.replace('_', ' ') for r in roof)} "
                "come from datasheet figures times Hopper efficiencies, not from kernels "
                "measured on it")
    else:
        head = f"{hardware.name}: kernel tables measured on this GPU family"
    notes = []
    if hardware.dense_gemm:
        table = {(r[1], r[2]) for r in hardware.dense_gemm}
        shapes = {s for g in model.attention_layers for s in g.shapes}
        if not shapes <= table or (model.hidden, model.moe_intermediate) != (7168, 2048):
            notes.append("the measured tables are of DeepSeek-V3's GEMM shapes: this model's "
                         "take the nearest row's throughput")
    return f"{head}; {parts}" + (f"; {'; '.join(notes)}" if notes else "")
