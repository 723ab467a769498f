"""GPU presets for the step-time model (`Hardware`: ``h800``, ``h100``, ``h200``), every constant
with its public source (DeepGEMM, FlashMLA, DeepEP, aiconfigurator), DeepEP's bandwidths
converted to the traffic model's accounting (`deepep_bench_bytes`), and the stack constants
fitted on SGLang's 96 x H100 run (`KernelFit`, `FITTED`). GB/s = 1e9 bytes/s, TFLOPS = 1e12
FLOP/s; sources and conversions in docs/serving-calibration.md, "Hardware"."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from eplb.errors import InputError
from eplb.evaluation.traffic import visit_probability
from eplb.topology import Topology

if TYPE_CHECKING:
    from eplb.evaluation.serving.config.roofline import Efficiency

DISPATCH_BYTES = 1 + 4 / 128  # FP8 element + one FP32 scale per 128 (DeepEP's fp8_factor)
COMBINE_BYTES = 2.0  # BF16 combine
# ``lp`` dispatch: seconds per MoE layer and micro-batch on the critical path (the all-reduce of
# per-expert counts plus the solve). DeepSeek's LPLB README gives ~100 us for its single-SM
# interior-point solve; its maintainers put the whole overhead at ~100-200 us (issue #3).
LP_OVERHEAD_S = 100e-6
BENCH_TOKENS = 4096  # tokens per rank in DeepEP's normal-kernel benchmarks
BENCH_EXPERTS, BENCH_TOP_K, BENCH_TOPK_GROUPS = 256, 8, 4  # DeepSeek-V3 shape in both sweeps


@dataclass(frozen=True)
class KernelFit:
    """The serving-stack constants: four pinned by measured kernel tables, one fitted end to
    end (docs/serving-calibration.md, "Calibration"; `scripts/calibrate_serving.py` derives
    the pinned ones from the cited rows and fits the last).

    Pinned by kernel tables (aiconfigurator's H100 SGLang 0.5.6.post2 measurements,
    `scripts/kernel_tables.py`):

    - ``gemm_efficiency``: dense FP8 GEMM throughput in SGLang over DeepGEMM's README rows
      (`DEEPGEMM_DENSE`) at the same ``(M, N, K)``;
    - ``grouped_gemm_efficiency``: the MoE core (DeepGEMM grouped GEMMs with their activation
      and casts) over DeepGEMM's grouped rows (`DEEPGEMM_GROUPED`); None: ``gemm_efficiency``;
    - ``prefill_attention_tflops``: MLA prefill core attention (computed as multi-head
      attention, causal) in TFLOPS at 4K prompts, for presets without a length table
      (`Hardware.prefill_attention`);
    - ``layer_overhead_s``: seconds per layer and micro-batch of the small kernels the stage
      formulas leave out (norms, RoPE, casts, activation), read as the measured modules'
      excess over the model's stages at SGLang's decode operating point;
    - ``step_overhead_s``: fixed seconds per step (scheduling, sampling); not fitted, 0.

    Fitted end to end (no table measures it):

    - ``engine_efficiency``: the serving engine's compute throughput over the kernels'
      standalone tables (two micro-batches sharing the SMs with communication, launch gaps,
      what no single-kernel benchmark sees); multiplies every GEMM and prefill attention.
    """

    gemm_efficiency: float
    prefill_attention_tflops: float
    layer_overhead_s: float
    step_overhead_s: float = 0.0
    grouped_gemm_efficiency: float | None = None
    engine_efficiency: float = 1.0

    def __post_init__(self) -> None:
        for name in ("gemm_efficiency", "prefill_attention_tflops", "engine_efficiency"):
            if not getattr(self, name) > 0:
                raise InputError(f"KernelFit.{name} must be > 0, got {getattr(self, name)}")
        if self.grouped_gemm_efficiency is not None and not self.grouped_gemm_efficiency > 0:
            raise InputError("KernelFit.grouped_gemm_efficiency must be > 0 or None, got "
                             f"{self.grouped_gemm_efficiency}")
        for name in ("layer_overhead_s", "step_overhead_s"):
            if not getattr(self, name) >= 0:
                raise InputError(f"KernelFit.{name} must be >= 0, got {getattr(self, name)}")

    @property
    def dense_scale(self) -> float:
        """What multiplies DeepGEMM's dense rows: ``gemm_efficiency x engine_efficiency``."""
        return self.gemm_efficiency * self.engine_efficiency

    @property
    def grouped_scale(self) -> float:
        """What multiplies DeepGEMM's grouped rows: the grouped (else dense) kernel efficiency
        x ``engine_efficiency``."""
        g = self.gemm_efficiency if self.grouped_gemm_efficiency is None \
            else self.grouped_gemm_efficiency
        return g * self.engine_efficiency


# Pinned by `python scripts/pin_kernels.py` from the kernel rows in scripts/kernel_tables.py
# (aiconfigurator's H100 SGLang 0.5.6.post2 tables); the engine efficiency fitted by
# `python scripts/calibrate_serving.py --fit` on SGLang's 96 x H100 blog figures (prefill
# 1K/2K/4K, decode 2K x 256) with balanced routing. `calibrate_serving.py --check` re-derives
# and refits and fails when a stored value drifted by more than 1%. Not tuned to any DeepSeek
# figure. A preset without DeepGEMM tables (a roofline preset) takes its own kernel
# efficiencies and this `engine_efficiency` (`KernelFit.dense_scale`, `grouped_scale`).
FITTED = KernelFit(
    gemm_efficiency=0.9446,  # pinned: SGLang FP8 GEMM rows / DeepGEMM README
    prefill_attention_tflops=694.4,  # pinned: SGLang MLA prefill module, 4K prompts
    layer_overhead_s=73.94e-6,  # pinned: decode modules' excess over the stages
    grouped_gemm_efficiency=1.016,  # pinned: SGLang decode MoE core / DeepGEMM
    engine_efficiency=0.6798,  # fitted (SGLang, H100), the one end-to-end constant
)


@dataclass(frozen=True)
class Hardware:
    """One GPU type and its interconnect, as the step-time model sees it.

    - ``dense_gemm``: ``(M, N, K, TFLOPS)`` rows of DeepGEMM's dense FP8 table.
    - ``grouped_gemm``: ``(tokens per expert, TFLOPS gate+up (N=4096, K=7168),
      TFLOPS down (N=7168, K=2048))`` rows of DeepGEMM's grouped tables.
    - ``normal_a2a``: ``(EP size, dispatch NVLink, combine NVLink, dispatch RDMA, combine RDMA)``
      effective GB/s of DeepEP's normal kernels in this model's accounting (NVLink figures
      from the single-node row; RDMA ``nan`` there).
    - ``ll_a2a``: ``(EP size, dispatch s, combine s)`` of DeepEP's low-latency kernels at
      ``ll_tokens`` tokens per rank, top-8, hidden 7168.
    - ``comm_sms``: SMs the normal kernels occupy while in flight (prefill compute slows by
      ``sms / (sms - comm_sms)``); the low-latency kernels hold none in flight.
    - ``prefill_attention``: ``(prompt tokens, TFLOPS)`` rows of MLA prefill core attention
      measured standalone, interpolated in log2 of a rank's effective prompt length (twice its
      mean keys per query) and flat beyond; empty: ``fit.prefill_attention_tflops`` at every
      length. Both are multiplied by ``fit.engine_efficiency``.
    - ``gpus_per_node``: GPUs in one scale-up (NVLink, xGMI) domain.
    - ``roofline``: None for a GPU with measured kernel tables; else the `roofline.Efficiency`
      its curves are built with (`roofline.hardware_from_spec`: empty ``dense_gemm`` and
      ``grouped_gemm``, the other tables computed from the datasheet figures).
    """

    name: str
    sms: int
    fp8_tflops: float
    bf16_tflops: float
    hbm_gbps: float
    hbm_gb: float
    nvlink_gbps: float
    rdma_gbps: float
    dense_gemm: tuple[tuple[int, int, int, float], ...]
    grouped_gemm: tuple[tuple[int, float, float], ...]
    mla_decode_tflops: float
    mla_decode_gbps: float
    normal_a2a: tuple[tuple[int, float, float, float, float], ...]
    ll_a2a: tuple[tuple[int, float, float], ...]
    ll_tokens: int = 128
    comm_sms: int = 24
    prefill_attention: tuple[tuple[int, float], ...] = ()
    fit: KernelFit = field(default=FITTED)
    sources: tuple[str, ...] = ()
    gpus_per_node: int = 8
    roofline: Efficiency | None = None

    @property
    def curves(self) -> str:
        """``"measured"`` (kernel tables from benchmarks) or ``"roofline"`` (datasheet
        figures times efficiencies)."""
        return "measured" if self.roofline is None else "roofline"

    def check_node(self, gpus_per_node: int, field: str) -> None:
        """Refuse a unit whose nodes hold more GPUs than this GPU's scale-up domain (``field``
        names the setting in the message)."""
        if gpus_per_node > self.gpus_per_node:
            raise InputError(
                f"{field} {gpus_per_node} is more than the {self.gpus_per_node} GPUs {self.name} "
                f"links by NVLink (its gpus_per_node); use nodes of {self.gpus_per_node} or "
                "fewer GPUs"
            )

    @classmethod
    def from_spec(cls, spec: Mapping | None = None, /, **keys) -> Hardware:
        """A GPU from its datasheet figures (`roofline.hardware_from_spec`: peak dense FP8 and
        BF16 TFLOPS, HBM GB and GB/s, NVLink/xGMI and NIC GB/s per GPU and direction, GPUs
        per node), its kernel curves a roofline of those figures times efficiencies."""
        from eplb.evaluation.serving.config.roofline import hardware_from_spec

        return hardware_from_spec(spec, **keys)

    def with_fit(self, fit: KernelFit) -> Hardware:
        """A copy with other fitted constants (used by the calibration script)."""
        return replace(self, fit=fit)

    def topology(self, num_nodes: int, gpus_per_node: int, slots_per_gpu: int) -> Topology:
        """A `Topology` with this GPU's effective NVLink and RDMA bandwidths (GB/s)."""
        ep = num_nodes * gpus_per_node
        nv = float(self.normal_a2a[0][1])
        rdma = float(
            np.interp(
                np.log2(max(ep, 16)),
                np.log2([r[0] for r in self.normal_a2a[1:]]),
                [r[3] for r in self.normal_a2a[1:]],
            )
        )
        return Topology(num_nodes, gpus_per_node, slots_per_gpu, nvlink_gbps=nv, rdma_gbps=rdma)


def deepep_bench_bytes(
    num_nodes: int, *, phase: str, tokens: int = BENCH_TOKENS, gpus_per_node: int = 8
) -> float:
    """Bytes per GPU this model counts for DeepEP's normal-kernel benchmark: ``tokens`` per
    rank, ``BENCH_EXPERTS`` experts top-8, groups = nodes with ``min(nodes, 4)`` selected
    (`tests/test_internode.py`), no limit on one node (`test_intranode.py`). On one node
    the NVLink bytes a GPU sends, else the RDMA bytes (the bottleneck there)."""
    per = DISPATCH_BYTES if phase == "dispatch" else COMBINE_BYTES
    hidden = 7168
    ep = num_nodes * gpus_per_node
    if num_nodes == 1:
        v = visit_probability(
            BENCH_EXPERTS / ep,
            num_experts=BENCH_EXPERTS,
            top_k=BENCH_TOP_K,
            num_groups=1,
            topk_groups=1,
        )
        return float(tokens * (gpus_per_node - 1) * v * hidden * per)
    vn = visit_probability(
        BENCH_EXPERTS / num_nodes,
        num_experts=BENCH_EXPERTS,
        top_k=BENCH_TOP_K,
        num_groups=num_nodes,
        topk_groups=min(num_nodes, BENCH_TOPK_GROUPS),
    )
    return float(tokens * (num_nodes - 1) * vn * hidden * per)


def _from_deepep(ep: int, gbps: float, *, nvlink: bool) -> float:
    """DeepEP-benchmark GB/s -> this model's accounting (docs/serving-calibration.md)."""
    nodes = ep // 8
    return gbps * (7 / 8 if nvlink else (nodes - 1) / nodes)


def _from_times(nodes: int, dispatch_s: float, combine_s: float) -> tuple[float, float]:
    """Effective (dispatch, combine) GB/s from measured benchmark times."""
    return (
        deepep_bench_bytes(nodes, phase="dispatch") / dispatch_s / 1e9,
        deepep_bench_bytes(nodes, phase="combine") / combine_s / 1e9,
    )


# ------------------------------------------------------------------------------ tables
# DeepGEMM README @a6d97a1 (deepseek-ai/DeepGEMM, the first release's tables), the one version
# both DeepGEMM tables below come from: its dense table sits beside contiguous grouped rows of
# 1297 / 1099 TFLOPS (checked on a stored copy of that README). "Normal GEMMs for dense
# models" (H800 SXM5, NVCC 12.8): M, N, K, TFLOPS. The (N, K) pairs are DeepSeek-V3's own
# GEMMs: fused q_a+kv_a (2112, 7168), q_b (24576, 1536), kv_b (32768, 512), o_proj (7168,
# 16384), expert gate+up (4096, 7168) and down (7168, 2048).
DEEPGEMM_DENSE = (
    (64, 2112, 7168, 206.0),
    (64, 24576, 1536, 289.0),
    (64, 32768, 512, 219.0),
    (64, 7168, 16384, 336.0),
    (64, 4096, 7168, 287.0),
    (64, 7168, 2048, 295.0),
    (128, 2112, 7168, 352.0),
    (128, 24576, 1536, 535.0),
    (128, 32768, 512, 358.0),
    (128, 7168, 16384, 645.0),
    (128, 4096, 7168, 533.0),
    (128, 7168, 2048, 510.0),
    (4096, 2112, 7168, 1058.0),
    (4096, 24576, 1536, 990.0),
    (4096, 32768, 512, 590.0),
    (4096, 7168, 16384, 1358.0),
    (4096, 4096, 7168, 1304.0),
    (4096, 7168, 2048, 1025.0),
)
# The same README (@a6d97a1), grouped GEMMs for MoE (H800): tokens per expert, TFLOPS for
# gate+up (N=4096, K=7168) and down (N=7168, K=2048). Contiguous layout at 8x4096 and 4x8192
# groups; masked layout at 1x1024, 2x512, 4x256. Below 256 tokens per expert one expert is a
# dense GEMM: the dense table's M=64 and M=128 rows of the same shapes. (The later README
# @327ec92, 2025-04-09, lists faster contiguous rows, 1346 / 1214; they are not mixed in.)
DEEPGEMM_GROUPED = (
    (64, 287.0, 295.0),
    (128, 533.0, 510.0),
    (256, 932.0, 815.0),
    (512, 1040.0, 916.0),
    (1024, 1233.0, 925.0),
    (4096, 1288.0, 1093.0),
    (8192, 1297.0, 1099.0),
)
# MLA prefill core attention, TFLOPS of the model's attention FLOPs (128 heads x (192 + 128) x
# 2 per attended pair) by prompt length: aiconfigurator's H100 SGLang 0.5.6.post2 measurement
# of the whole MLA module in prefill (ai-dynamo/aiconfigurator@095f58a:aic-core/src/
# aiconfigurator_core/systems/data/h100_sxm/mla/sglang/0.5.6.post2/wideep_context_mla_perf.parquet,
# fa3, 128 heads) minus the model's projections at the pinned `gemm_efficiency`, at 8,192 tokens
# per call (16,384 for the 16K prompt). Derived by scripts/pin_kernels.py; `calibrate_serving.py
# --check` re-derives it. Used for H800 too (the same GH100 compute; an assumption).
SGLANG_MLA_PREFILL_H100 = (
    (512, 360.9),
    (1024, 526.9),
    (2048, 635.6),
    (4096, 694.4),
    (8192, 732.2),
    (16384, 737.6),
)
# DeepEP README (V1 legacy table, @dd758ca docs/legacy.md), H800 + CX7 400 Gb/s, normal
# kernels, 4096 tokens, hidden 7168, top-4 groups, top-8, FP8 dispatch / BF16 combine,
# DeepEP's accounting: EP -> (dispatch, combine) GB/s; EP8 is NVLink, the rest RDMA.
DEEPEP_NORMAL_H800 = {8: (153.0, 158.0), 16: (43.0, 43.0), 32: (58.0, 57.0), 64: (51.0, 50.0)}
# DeepEP README low-latency kernels, H800, 128 tokens per rank, top-8: EP -> (dispatch s,
# combine s).
DEEPEP_LL_H800 = {
    8: (77e-6, 114e-6),
    16: (118e-6, 195e-6),
    32: (155e-6, 273e-6),
    64: (173e-6, 314e-6),
    128: (192e-6, 369e-6),
    256: (194e-6, 360e-6),
}
# aiconfigurator (ai-dynamo/aiconfigurator), systems/data/h100_sxm/comm/sglang/0.5.6.post2/
# wideep_deepep_{normal,ll}_perf.parquet, DeepSeek shape, tokens per rank.
# Normal kernels at 4096 tokens (best SM setting): nodes -> (dispatch s, combine s). The
# 8-node dispatch (5.45 ms, slower than its combine with half the bytes) is kept as published.
AIC_NORMAL_H100 = {
    1: (0.49e-3, 0.97e-3),
    2: (0.75e-3, 1.78e-3),
    4: (1.79e-3, 3.52e-3),
    8: (5.45e-3, 4.46e-3),
}
# Low-latency kernels at 128 tokens: nodes -> (dispatch s, combine s).
AIC_LL_H100 = {1: (40e-6, 72e-6), 2: (102e-6, 186e-6), 4: (143e-6, 263e-6), 8: (167e-6, 305e-6)}


def _normal_from_deepep(table: dict) -> tuple:
    nv = table[8]
    rows = [
        (
            8,
            _from_deepep(8, nv[0], nvlink=True),
            _from_deepep(8, nv[1], nvlink=True),
            float("nan"),
            float("nan"),
        )
    ]
    for ep, (d, c) in sorted(table.items()):
        if ep > 8:
            rows.append(
                (
                    ep,
                    rows[0][1],
                    rows[0][2],
                    _from_deepep(ep, d, nvlink=False),
                    _from_deepep(ep, c, nvlink=False),
                )
            )
    return tuple(rows)


def _normal_from_times(table: dict) -> tuple:
    nv = _from_times(1, *table[1])
    rows = [(8, nv[0], nv[1], float("nan"), float("nan"))]
    for nodes, times in sorted(table.items()):
        if nodes > 1:
            rows.append((8 * nodes, nv[0], nv[1], *_from_times(nodes, *times)))
    return tuple(rows)


def _ll_rows(table: dict, *, by_nodes: bool) -> tuple:
    return tuple((8 * k if by_nodes else k, d, c) for k, (d, c) in sorted(table.items()))


_SOURCES = (
    "DeepGEMM README (H800, NVCC 12.8): dense and grouped FP8 GEMM tables",
    "FlashMLA README: 660 TFLOPS compute-bound, 3000 GB/s memory-bound (H800 SXM5)",
    "DeepEP README @dd758ca docs/legacy.md: normal and low-latency kernels (H800, CX7)",
    "aiconfigurator @095f58a h100_sxm sglang 0.5.6.post2: MLA prefill module (attention table)",
)

h800 = Hardware(
    name="h800",
    sms=132,  # H800/H100 SXM5: 132 SMs
    fp8_tflops=1979.0,  # NVIDIA H100/H800 SXM datasheet, dense FP8
    bf16_tflops=989.0,  # dense BF16
    hbm_gbps=3350.0,  # HBM3 3.35 TB/s
    hbm_gb=80.0,
    nvlink_gbps=200.0,  # H800 NVLink 400 GB/s bidirectional
    rdma_gbps=50.0,  # ConnectX-7 400 Gb/s per GPU (DeepSeek Day-6, DeepEP README)
    dense_gemm=DEEPGEMM_DENSE,
    grouped_gemm=DEEPGEMM_GROUPED,
    mla_decode_tflops=660.0,  # FlashMLA README (2025-04 update), H800 SXM5
    mla_decode_gbps=3000.0,  # FlashMLA README, memory-bound configuration
    normal_a2a=_normal_from_deepep(DEEPEP_NORMAL_H800),
    ll_a2a=_ll_rows(DEEPEP_LL_H800, by_nodes=False),
    prefill_attention=SGLANG_MLA_PREFILL_H100,
    sources=_SOURCES,
)

h100 = replace(
    h800,
    name="h100",
    nvlink_gbps=450.0,  # H100 SXM NVLink 900 GB/s bidirectional
    normal_a2a=_normal_from_times(AIC_NORMAL_H100),
    ll_a2a=_ll_rows(AIC_LL_H100, by_nodes=True),
    sources=(*_SOURCES[:2], _SOURCES[3],
             "aiconfigurator h100_sxm sglang 0.5.6.post2 DeepEP sweeps"),
)

h200 = replace(
    h100,
    name="h200",
    hbm_gbps=4800.0,  # H200 SXM: HBM3e 4.8 TB/s, 141 GB
    hbm_gb=141.0,
    mla_decode_gbps=3000.0 * 4800.0 / 3350.0,  # FlashMLA's H800 figure scaled by HBM bandwidth
    sources=(*_SOURCES[:2], _SOURCES[3],
             "aiconfigurator h200_sxm (identical to its h100_sxm DeepEP files)"),
)

HARDWARE: dict[str, Hardware] = {"h800": h800, "h100": h100, "h200": h200}


def hardware_names() -> tuple[str, ...]:
    """Every preset name: the measured ones (`HARDWARE`), then the datasheet (roofline) ones
    (`config.datasheets.DATASHEETS`)."""
    from eplb.evaluation.serving.config.datasheets import DATASHEETS

    return (*HARDWARE, *(k for k in DATASHEETS if k not in HARDWARE))


_READ: dict[tuple, Hardware] = {}  # hardware files read, by (path, mtime, size)


def _from_file(path: Path) -> Hardware:
    """A TOML file of datasheet figures: its ``[hardware]`` table, else its top level."""
    from eplb.evaluation.serving.config import toml

    data = toml.read(path)
    table = data["hardware"] if isinstance(data.get("hardware"), Mapping) else data
    try:
        return Hardware.from_spec(table)
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from None


def get_hardware(name: str | os.PathLike | Mapping | Hardware) -> Hardware:
    """The GPU ``name`` stands for: a measured preset (`HARDWARE`), a datasheet preset
    (`config.datasheets`), a TOML file of datasheet figures (at the top level or in a
    ``[hardware]`` table) or such a table itself (`Hardware.from_spec`), or a `Hardware`;
    `InputError` naming the presets otherwise."""
    if isinstance(name, Hardware):
        return name
    if isinstance(name, Mapping):
        return Hardware.from_spec(name)
    if isinstance(name, str) and name in HARDWARE:
        return HARDWARE[name]
    from eplb.evaluation.serving.config.datasheets import DATASHEETS

    if isinstance(name, str) and name in DATASHEETS:
        return DATASHEETS[name]
    if isinstance(name, (str, os.PathLike)) and not isinstance(name, bool):
        path = Path(name)
        try:
            is_file = path.is_file()
        except (OSError, ValueError):  # a name too long, a NUL byte
            is_file = False
        if is_file:
            st = path.stat()
            key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
            if key not in _READ:
                _READ[key] = _from_file(path)
            return _READ[key]
    raise InputError(
        f"unknown hardware {str(name)[:200]!r}; use one of {', '.join(hardware_names())}, a "
        "TOML file of datasheet figures or a [hardware] table (docs/serving.md, \"Your model, "
        "your GPU\")"
    )
