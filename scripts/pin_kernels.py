"""Pin the step-time model's kernel constants on measured kernel tables (`kernel_tables`).

Each constant of `config.hardware.KernelFit` that a public table measures is read off that
table, with an interval (the spread of the rows it is read from), instead of being fitted on
end-to-end throughputs:

- ``gemm_efficiency``: SGLang's FP8 block GEMM over DeepGEMM's README row at the same
  ``(M, N, K)`` (geometric mean over the rows both hold);
- ``grouped_gemm_efficiency``: the model's grouped-GEMM time at DeepGEMM's rows over SGLang's
  measured decode MoE core (uniform routing, EP 16-64, 64 and 128 tokens per rank: the masked
  layout SGLang decodes with, whose rows carry no padding of the collector's);
- the prefill attention table (`Hardware.prefill_attention`) and ``prefill_attention_tflops``:
  SGLang's measured MLA prefill module minus the model's projections (at the pinned
  ``gemm_efficiency``), as TFLOPS of the model's attention FLOPs, at 8,192 tokens (one
  micro-batch of a 16,384-token step) per prompt length;
- ``layer_overhead_s``: what SGLang's decode MLA module and shared-expert MLP measure beyond the
  model's stages for them (projections, FlashMLA attention, the two MLP GEMMs) at SGLang's
  decode operating point (128 requests per micro-batch, 2,048 cached tokens).

Run ``python scripts/pin_kernels.py`` to print them; `calibrate_serving.py --check` compares
them with the stored ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import kernel_tables as kt
import numpy as np

from eplb.evaluation.serving.config.hardware import DEEPGEMM_DENSE, DEEPGEMM_GROUPED, h100
from eplb.evaluation.serving.config.model import deepseek_v3
from eplb.evaluation.serving.steptime.curves import ExpertCurve, GemmCurve

MICRO_BATCH_TOKENS = 8192  # one micro-batch of SGLang's 16,384-token prefill step


@dataclass(frozen=True)
class Pinned:
    """One constant read off a kernel table: ``value`` and ``interval`` (lowest, highest value
    its rows give), where it comes from and how it is read."""

    name: str
    value: float
    interval: tuple[float, float]
    unit: str
    source: str
    how: str


def _geomean(x) -> float:
    return float(np.exp(np.mean(np.log(np.asarray(x, dtype=np.float64)))))


def _file(op: str) -> str:
    return f"{kt.AIC}:{kt.AIC_DIR}/{op}/sglang/0.5.6.post2"


def gemm_rows() -> list[tuple[tuple[int, int, int], float]]:
    """``((M, N, K), measured / README TFLOPS)`` for every row both tables hold."""
    readme = {(m, n, k): tf for m, n, k, tf in DEEPGEMM_DENSE}
    out = []
    for m, n, k, ms in kt.GEMM_FP8_BLOCK:
        measured = 2.0 * m * n * k / (ms * 1e-3) / 1e12
        out.append(((m, n, k), measured / readme[(m, n, k)]))
    return out


def pin_gemm() -> Pinned:
    r = [e for _, e in gemm_rows()]
    return Pinned("gemm_efficiency", _geomean(r), (min(r), max(r)), "-",
                  f"{_file('gemm')}/gemm_perf.parquet (fp8_block)",
                  f"geometric mean over {len(r)} rows of SGLang's FP8 GEMM TFLOPS over "
                  "DeepGEMM README @a6d97a1's at the same (M, N, K)")


def grouped_rows() -> list[tuple[int, int, float]]:
    """``(ep, tokens per rank, model / measured seconds)`` of the decode MoE rows, the model's
    grouped GEMMs at DeepGEMM's rows (efficiency 1) on the rank's local experts."""
    m = deepseek_v3
    curve = ExpertCurve(DEEPGEMM_GROUPED, m, efficiency=1.0)
    out = []
    for ep, tokens, ms in kt.MOE_GENERATION_UNIFORM:
        local = m.num_experts // ep
        picks = tokens * m.top_k * ep / m.num_experts
        out.append((ep, tokens, local * float(curve.seconds(picks)) / (ms * 1e-3)))
    return out


def pin_grouped() -> Pinned:
    r = [e for _, _, e in grouped_rows()]
    return Pinned("grouped_gemm_efficiency", _geomean(r), (min(r), max(r)), "-",
                  f"{_file('moe')}/wideep_generation_moe_perf.parquet (uniform)",
                  f"geometric mean over {len(r)} rows (EP 16-64, 64 and 128 tokens per rank) "
                  "of the model's grouped-GEMM time at DeepGEMM's rows over SGLang's measured "
                  "decode MoE core")


def _projections(gemm_efficiency: float) -> GemmCurve:
    return GemmCurve(DEEPGEMM_DENSE, deepseek_v3.mla_shapes, efficiency=gemm_efficiency)


def attention_rows(gemm_efficiency: float) -> list[tuple[int, int, float]]:
    """``(batch, prompt tokens, TFLOPS)``: each measured prefill MLA module minus the model's
    projections at ``gemm_efficiency``, as the model's attention FLOPs per second."""
    m = deepseek_v3
    proj = _projections(gemm_efficiency)
    out = []
    for b, isl, ms in kt.MLA_CONTEXT:
        pairs = b * isl * (isl + 1) / 2
        a2 = ms * 1e-3 - float(proj.seconds(float(b * isl)))
        out.append((b, isl, pairs * m.prefill_flops_per_pair / a2 / 1e12))
    return out


def pin_attention(gemm_efficiency: float) -> tuple[tuple[tuple[int, float], ...], Pinned, dict]:
    """The length table (rows at `MICRO_BATCH_TOKENS` tokens, one prompt beyond), the 4K
    scalar, and each length's interval over the batch sizes measured (4,096-16,384 tokens)."""
    rows = attention_rows(gemm_efficiency)
    table, spread, raw = [], {}, {}
    for isl in sorted({r[1] for r in rows}):
        at = {b: tf for b, n, tf in rows if n == isl}
        b = MICRO_BATCH_TOKENS // isl if MICRO_BATCH_TOKENS // isl in at else min(at)
        raw[isl] = at[b]
        table.append((isl, round(at[b], 1)))
        spread[isl] = (min(at.values()), max(at.values()))
    four = raw[4096]
    pinned = Pinned("prefill_attention_tflops", four, spread[4096], "TFLOPS",
                    f"{_file('mla')}/wideep_context_mla_perf.parquet (fa3, 128 heads)",
                    "SGLang's prefill MLA module minus the model's projections, 4K prompts, "
                    f"{MICRO_BATCH_TOKENS:,} tokens (interval: 1-4 prompts); the same rows per "
                    "prompt length give `Hardware.prefill_attention`")
    return tuple(table), pinned, spread


def overhead_rows(gemm_efficiency: float) -> list[tuple[int, int, float]]:
    """``(batch, cached tokens, seconds)``: the decode MLA module's and the shared-expert MLP's
    measured time beyond the model's stages for them, at each measured decode batch."""
    m, hw = deepseek_v3, h100
    proj = _projections(gemm_efficiency)
    h, i = m.hidden, m.moe_intermediate
    mlp = GemmCurve(DEEPGEMM_DENSE, ((2 * i, h), (h, i)), efficiency=gemm_efficiency,
                    substitute={(2 * i, h): (4096, 7168), (h, i): (7168, 2048)})
    mlp_ms = dict(kt.MLP_GENERATION)
    out = []
    for b, isl, ms in kt.MLA_GENERATION:
        a2 = max(b * isl * m.decode_flops_per_pair / (hw.mla_decode_tflops * 1e12),
                 b * isl * kt.FLASHMLA_FP8_KV_BYTES / (hw.mla_decode_gbps * 1e9))
        mla_excess = ms * 1e-3 - float(proj.seconds(float(b))) - a2
        mlp_excess = mlp_ms[b] * 1e-3 - float(mlp.seconds(float(b)))
        out.append((b, isl, mla_excess + mlp_excess))
    return out


def pin_overhead(gemm_efficiency: float) -> Pinned:
    rows = overhead_rows(gemm_efficiency)
    p = kt.DECODE_POINT
    at = next(s for b, isl, s in rows if b == p["batch"] and isl == p["isl"])
    vals = [s for _, _, s in rows]
    return Pinned("layer_overhead_s", at, (min(vals), max(vals)), "s",
                  f"{_file('mla')}/wideep_generation_mla_perf.parquet (flashinfer) and "
                  f"{_file('mlp')}/wideep_generation_mlp_perf.parquet",
                  "SGLang's decode MLA module and shared-expert MLP beyond the model's "
                  f"projections, FlashMLA attention and MLP GEMMs, {p['batch']} requests at "
                  f"{p['isl']:,} cached tokens (interval: 64-256 requests, 1,024-4,096 tokens)")


def pin_all() -> tuple[dict[str, Pinned], tuple[tuple[int, float], ...], dict]:
    """Every pinned constant by name, the prefill attention table and its per-length spread."""
    g = pin_gemm()
    table, attention, spread = pin_attention(g.value)
    pins = {p.name: p for p in (g, pin_grouped(), attention, pin_overhead(g.value))}
    return pins, table, spread


def main() -> int:
    pins, table, spread = pin_all()
    for p in pins.values():
        lo, hi = p.interval
        print(f"{p.name} = {p.value:.4g} [{lo:.4g}, {hi:.4g}] {p.unit}: {p.how}; {p.source}")
    print("prefill attention (prompt tokens, TFLOPS):", table)
    print("  spread over batch sizes:",
          {k: (round(a), round(b)) for k, (a, b) in spread.items()})
    if not all(math.isfinite(p.value) and p.value > 0 for p in pins.values()):
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
