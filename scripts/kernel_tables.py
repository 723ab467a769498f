"""Measured H100 kernel rows that pin the step-time model's kernel constants
(`scripts/calibrate_serving.py`, docs/serving-calibration.md, "Constants pinned by kernel
tables"). Transcribed numbers, not code: every row is a measurement of SGLang 0.5.6.post2 on
one H100 SXM (80 GB HBM3) from ai-dynamo/aiconfigurator @095f58a51c4ca8e61b66ec108d86f223f8d559ce,
files ``aic-core/src/aiconfigurator_core/systems/data/h100_sxm/<op>/sglang/0.5.6.post2/*.parquet``
(the same version as the DeepEP sweeps `config.hardware` already uses), DeepSeek-V3 shapes,
FP8 block-scaled weights, latency in ms. Each table names its file; rows are the ones the
pinning reads (the full files hold more shapes)."""

from __future__ import annotations

AIC = "ai-dynamo/aiconfigurator@095f58a"
AIC_DIR = "aic-core/src/aiconfigurator_core/systems/data/h100_sxm"

# gemm/sglang/0.5.6.post2/gemm_perf.parquet, gemm_dtype fp8_block: (M, N, K, ms) at the
# (M, N, K) of DeepGEMM's README rows (`hardware.DEEPGEMM_DENSE`) that the file also holds.
GEMM_FP8_BLOCK = (
    (64, 7168, 16384, 0.049122),
    (64, 4096, 7168, 0.012324),
    (64, 7168, 2048, 0.007648),
    (128, 7168, 16384, 0.052337),
    (128, 4096, 7168, 0.014064),
    (128, 7168, 2048, 0.009634),
    (4096, 7168, 16384, 0.707015),
    (4096, 4096, 7168, 0.195056),
    (4096, 7168, 2048, 0.102176),
)

# moe/sglang/0.5.6.post2/wideep_generation_moe_perf.parquet, distribution uniform: the decode
# MoE core (`DeepEPMoE.run_moe_core`, DeepGEMM masked layout, CUDA graph) of one rank of EP
# ``ep`` at ``tokens`` tokens per rank: (ep, tokens per rank, ms). Every local expert gets
# tokens x 8 x ep / 256 picks.
MOE_GENERATION_UNIFORM = (
    (16, 64, 0.278957),
    (16, 128, 0.279517),
    (32, 64, 0.154893),
    (32, 128, 0.163798),
    (64, 64, 0.093712),
    (64, 128, 0.110909),
)

# moe/sglang/0.5.6.post2/wideep_context_moe_perf.parquet, distribution uniform: the prefill MoE
# core (contiguous layout) at ``tokens`` per rank; the collector hands every rank tokens x ep
# rows (those without a local expert masked), so time grows with ep at fixed picks (checked,
# not used to pin: docs).
MOE_CONTEXT_UNIFORM = (
    (8, 2048, 1.833742), (8, 4096, 2.962967), (8, 8192, 5.51973), (8, 16384, 10.770459),
    (16, 1024, 1.236905), (16, 2048, 1.831182), (16, 4096, 3.172274), (16, 8192, 6.046007),
    (16, 16384, 11.795826), (32, 512, 0.958729), (32, 1024, 1.276192), (32, 2048, 2.036919),
    (32, 4096, 3.711488), (32, 8192, 7.153221), (32, 16384, 13.964539), (64, 256, 0.946994),
    (64, 512, 1.04133), (64, 1024, 1.467831), (64, 2048, 2.587429), (64, 4096, 4.83909),
    (64, 8192, 9.348475),
)

# mla/sglang/0.5.6.post2/wideep_context_mla_perf.parquet, kernel_source fa3, 128 heads: the
# whole MLA module in prefill (projections, norms, RoPE, core attention; no prefix) on
# ``batch`` prompts of ``isl`` tokens: (batch, isl, ms).
MLA_CONTEXT = (
    (8, 512, 1.786964), (16, 512, 3.379636), (32, 512, 6.679276),
    (4, 1024, 1.898216), (8, 1024, 3.555416), (16, 1024, 7.09442),
    (2, 2048, 2.084588), (4, 2048, 3.984412), (8, 2048, 7.95168),
    (1, 4096, 2.503848), (2, 4096, 4.882508), (4, 4096, 9.874912),
    (1, 8192, 6.657284), (2, 8192, 13.567632),
    (1, 16384, 20.713072),
)

# mla/sglang/0.5.6.post2/wideep_generation_mla_perf.parquet, kernel_source flashinfer (the
# fa3 rows stop below these sizes), 128 heads, FP8 KV cache: the MLA module in decode
# (CUDA graph) for ``batch`` requests at ``isl`` cached tokens: (batch, isl, ms).
MLA_GENERATION = (
    (64, 1024, 0.187283), (64, 2048, 0.21969), (64, 4096, 0.280368),
    (128, 1024, 0.204726), (128, 2048, 0.266912), (128, 4096, 0.389008),
    (256, 1024, 0.317587), (256, 2048, 0.439686), (256, 4096, 0.681696),
)

# mlp/sglang/0.5.6.post2/wideep_generation_mlp_perf.parquet: the shared expert (gate_up
# 4096 x 7168, SiLU-and-mul with FP8 quantisation, down 7168 x 2048) at ``tokens``:
# (tokens, ms).
MLP_GENERATION = ((64, 0.031123), (128, 0.03321), (256, 0.039347))

# the decode operating point the layer overhead is read at: SGLang's decode run (256 requests
# per rank in two micro-batches of 128, context ~2,050; EP72 ~ the EP64 rows)
DECODE_POINT = {"batch": 128, "isl": 2048, "ep": 64}
FLASHMLA_FP8_KV_BYTES = 656  # FlashMLA README @9241ae3: 512 FP8 + 4 FP32 scales + 64 BF16

# moe/sglang/0.5.6.post2/wideep_generation_moe_perf.parquet, distribution power_law_<alpha>: the
# same decode MoE core on the busiest rank of a power-law routing (the collector draws expert
# counts x ~ x^-alpha on [1, 0.8 x global tokens] by inverse CDF, scales them to tokens x 8
# picks, caps each at the global tokens, swaps the busiest EP rank to rank 0 and times rank 0,
# averaging five draws; collector/helper.py `_generate_power_law_distribution`):
# (ep, tokens per rank, alpha, ms). Used to test whether the hot rank's grouped GEMMs follow
# the model's per-expert curve (scripts/decode_gap.py), not to pin anything.
MOE_GENERATION_POWER_LAW = (
    (32, 64, 0.6, 0.179827), (32, 64, 0.8, 0.179207), (32, 64, 1.01, 0.194545),
    (32, 64, 1.2, 0.229828), (32, 128, 0.6, 0.219056), (32, 128, 0.8, 0.2294),
    (32, 128, 1.01, 0.265231), (32, 128, 1.2, 0.354504), (64, 64, 0.6, 0.136451),
    (64, 64, 0.8, 0.159697), (64, 64, 1.01, 0.19487), (64, 64, 1.2, 0.250614),
    (64, 128, 0.6, 0.214191), (64, 128, 0.8, 0.24192), (64, 128, 1.01, 0.360556),
    (64, 128, 1.2, 0.425137), (128, 64, 0.6, 0.14491), (128, 64, 0.8, 0.191316),
    (128, 64, 1.01, 0.256188), (128, 64, 1.2, 0.376588), (128, 128, 0.6, 0.210681),
    (128, 128, 0.8, 0.305296), (128, 128, 1.01, 0.411038), (128, 128, 1.2, 0.802291),
)
