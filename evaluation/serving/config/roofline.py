"""Hardware from its datasheet: kernel figures as a roofline of the peak FLOPS, HBM and link
bandwidths times efficiencies (`Efficiency`), for GPUs no kernel table was measured on.

`HOPPER` holds the efficiencies the Hopper measurements give: each is a public kernel
benchmark on H800 over the H800 datasheet figure (DeepGEMM, FlashMLA, DeepEP;
`derive_hopper` recomputes them from the measured preset's tables, and
`scripts/roofline_check.py --check` fails when the stored ones drift by more than 1%). On top,
the serving-stack constants of SGLang's H100 run (`hardware.FITTED`: the fitted
``engine_efficiency``, the pinned ``layer_overhead_s`` and ``prefill_attention_tflops`` as a
fraction of the H100 BF16 peak) are read by name, so a roofline preset carries the Hopper
calibration to another GPU without refitting. `hardware_from_spec` builds such a `Hardware`;
its kernel curves (`steptime.roofline`) are labelled ``roofline`` wherever they are printed."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

import numpy as np

from eplb.errors import InputError
from eplb.evaluation.serving.config.hardware import (
    BENCH_TOP_K,
    COMBINE_BYTES,
    DISPATCH_BYTES,
    FITTED,
    Hardware,
    KernelFit,
)

BENCH_HIDDEN = 7168  # DeepEP's benchmark hidden size (DeepSeek-V3), the low-latency table's
LL_NODES = (1, 2, 4, 8, 16, 32, 64)  # nodes of the roofline low-latency rows
H100_BF16_TFLOPS = 989.0  # the GPU the stack constants were fitted on (NVIDIA H100 SXM)


@dataclass(frozen=True)
class Efficiency:
    """Fractions of the datasheet figures a GPU's kernels reach (each in (0, 1]):

    - ``gemm_compute``: of the dense FP8 (BF16) peak, a large grouped GEMM;
    - ``gemm_memory``: of HBM bandwidth, a GEMM that streams its weights (few tokens);
    - ``decode_attention_compute`` / ``decode_attention_memory``: decode core attention, of the
      BF16 peak / of HBM bandwidth;
    - ``a2a_nvlink`` / ``a2a_rdma``: the prefill (normal) all-to-all kernels, of the NVLink
      (xGMI) bandwidth per GPU and direction / of the NIC's, in this model's byte accounting;
    - ``ll_nvlink`` / ``ll_rdma``: the decode (low-latency) kernels, the same fractions, with
      ``ll_latency_s`` seconds per call on top.

    The serving-stack factors (``engine_efficiency``, the prefill-attention fraction, the
    per-layer overhead) are not here: they come from `hardware.FITTED` by name.
    """

    gemm_compute: float
    gemm_memory: float
    decode_attention_compute: float
    decode_attention_memory: float
    a2a_nvlink: float
    a2a_rdma: float
    ll_nvlink: float
    ll_rdma: float
    ll_latency_s: float
    source: str = ""

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name in ("source", "ll_latency_s"):
                continue
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
                raise InputError(f"hardware efficiency.{f.name} must be a fraction in (0, 1], "
                                 f"got {v!r}")
        v = self.ll_latency_s
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
            raise InputError(f"hardware efficiency.ll_latency_s must be seconds in [0, 1), "
                             f"got {v!r}")


# Derived from the H800 measurements (`derive_hopper(h800)`, 3 digits; `--check` recomputes):
HOPPER = Efficiency(
    # DeepGEMM README @a6d97a1, grouped GEMMs at 8,192 tokens per expert (1297 gate+up / 1099
    # down TFLOPS, time-weighted over DeepSeek-V3's expert) over the H800's 1979 dense FP8
    gemm_compute=0.618,
    # the same table's 64-token rows (287 / 295 TFLOPS): weights + FP8 inputs + BF16 outputs
    # read and written at 0.707 of the H800's 3.35 TB/s
    gemm_memory=0.707,
    # FlashMLA README (2025-04-22): 660 TFLOPS compute-bound of 989 BF16, 3000 GB/s of 3350
    decode_attention_compute=0.667,
    decode_attention_memory=0.896,
    # DeepEP README @dd758ca docs/legacy.md, normal kernels on H800: EP8 153 / 158 GB/s NVLink
    # (133.9 / 138.3 in this model's accounting) over 200 GB/s per direction; RDMA EP16-EP64,
    # the median of the rows (43-58 GB/s, x (N-1)/N) over CX7's 50 GB/s
    a2a_nvlink=0.680,
    a2a_rdma=0.863,
    # DeepEP low-latency kernels on H800 (128 tokens, top-8, hidden 7168): EP8's dispatch and
    # combine (77 / 114 us) give 37.6 us per call and 192 GB/s of 200 over NVLink; EP16-EP256
    # the mean RDMA fraction of the remote picks' bytes over 50 GB/s
    ll_nvlink=0.961,
    ll_rdma=0.925,
    ll_latency_s=37.6e-6,
    source="Hopper: DeepGEMM, FlashMLA and DeepEP on H800 (derive_hopper)",
)


def derive_hopper(h800: Hardware) -> Efficiency:
    """`HOPPER` recomputed from the measured H800 preset's tables (unrounded)."""
    H, I = BENCH_HIDDEN, 2048
    f_gu, f_dn = 2.0 * 2 * I * H, 2.0 * H * I
    rows = {r[0]: r for r in h800.grouped_gemm}
    top = rows[max(rows)]
    compute = (f_gu + f_dn) / (f_gu / top[1] + f_dn / top[2]) / h800.fp8_tflops
    low = rows[min(rows)]
    m = float(low[0])
    t = m * (f_gu / (low[1] * 1e12) + f_dn / (low[2] * 1e12))
    moved = 3 * H * I + m * (H + I) + 2 * m * (2 * I + H)  # FP8 weights and inputs, BF16 out
    memory = moved / t / (h800.hbm_gbps * 1e9)
    nv = h800.normal_a2a[0]
    a2a_nv = (nv[1] + nv[2]) / 2 / h800.nvlink_gbps
    rd = [x for r in h800.normal_a2a[1:] for x in (r[3], r[4])]
    a2a_rd = float(np.median(rd)) / h800.rdma_gbps
    bd, bc = _ll_bytes(DISPATCH_BYTES), _ll_bytes(COMBINE_BYTES)
    ll = {r[0]: r for r in h800.ll_a2a}
    _, d8, c8 = ll[8]
    bw = (bc - bd) / (c8 - d8)
    lat = d8 - bd / bw
    fr = []
    for ep, d, c in h800.ll_a2a:
        n = ep // 8
        if n > 1:
            r = (n - 1) / n
            fr += [r * bd / (d - lat), r * bc / (c - lat)]
    return Efficiency(
        gemm_compute=compute, gemm_memory=memory,
        decode_attention_compute=h800.mla_decode_tflops / h800.bf16_tflops,
        decode_attention_memory=h800.mla_decode_gbps / h800.hbm_gbps,
        a2a_nvlink=a2a_nv, a2a_rdma=a2a_rd,
        ll_nvlink=bw / (h800.nvlink_gbps * 1e9),
        ll_rdma=float(np.mean(fr)) / (h800.rdma_gbps * 1e9),
        ll_latency_s=lat, source="derived from h800's tables",
    )


def _ll_bytes(per_element: float) -> float:
    """Bytes one GPU sends in DeepEP's low-latency benchmark call (128 tokens, top-8)."""
    return 128 * BENCH_TOP_K * BENCH_HIDDEN * per_element


def ll_seconds(nodes: int, nvlink_gbps: float, nic_gbps: float, eff: Efficiency,
               per_element: float) -> float:
    """Roofline seconds of one low-latency call at the benchmark's shape on ``nodes`` nodes:
    the latency plus the slower of the local picks' bytes over NVLink and the remote picks'
    ((N - 1) / N of them) over the NIC."""
    b = _ll_bytes(per_element)
    local = b / nodes / (nvlink_gbps * 1e9 * eff.ll_nvlink)
    remote = b * (nodes - 1) / nodes / (nic_gbps * 1e9 * eff.ll_rdma) if nodes > 1 else 0.0
    return eff.ll_latency_s + max(local, remote)


def comm_rows(nvlink_gbps: float, nic_gbps: float, gpus_per_node: int, eff: Efficiency
              ) -> tuple[tuple, tuple]:
    """``(normal_a2a, ll_a2a)`` rows in `Hardware`'s layout from the link figures: normal
    kernels at ``a2a_*`` of the NVLink and NIC bandwidths at every EP size; low-latency
    seconds per call (`ll_seconds`) at 1, 2, 4, ... nodes of ``gpus_per_node``."""
    nv, rd = nvlink_gbps * eff.a2a_nvlink, nic_gbps * eff.a2a_rdma
    g = gpus_per_node
    normal = ((g, nv, nv, math.nan, math.nan),
              *((g * n, nv, nv, rd, rd) for n in LL_NODES[1:]))
    ll = tuple((g * n, ll_seconds(n, nvlink_gbps, nic_gbps, eff, DISPATCH_BYTES),
                ll_seconds(n, nvlink_gbps, nic_gbps, eff, COMBINE_BYTES)) for n in LL_NODES)
    return normal, ll


def stack_fit(bf16_tflops: float, fit: KernelFit = FITTED) -> KernelFit:
    """The serving-stack constants fitted on H100 carried to a GPU of ``bf16_tflops``:
    ``engine_efficiency`` and ``layer_overhead_s`` as they are, prefill attention at the same
    fraction of the BF16 peak (``prefill_attention_tflops / 989``)."""
    return replace(fit, prefill_attention_tflops=fit.prefill_attention_tflops
                   / H100_BF16_TFLOPS * bf16_tflops)


# ------------------------------------------------------------------ specs
SPEC_KEYS = {  # [hardware] keys: (meaning, unit, required)
    "name": ("a name for messages", "", False),
    "fp8_tflops": ("peak dense FP8 tensor throughput (not the 2:4-sparse figure)", "TFLOPS", True),
    "bf16_tflops": ("peak dense BF16 tensor throughput", "TFLOPS", True),
    "hbm_gb": ("HBM capacity", "GB", True),
    "hbm_gbps": ("HBM bandwidth", "GB/s", True),
    "nvlink_gbps": ("scale-up link (NVLink, xGMI) bandwidth per GPU, one direction", "GB/s", True),
    "nic_gbps": ("scale-out NIC bandwidth per GPU, one direction", "GB/s", True),
    "gpus_per_node": ("GPUs in one scale-up (NVLink) domain", "", True),
    "sms": ("streaming multiprocessors (compute units); default 132", "", False),
    "comm_sms": ("of them held by the prefill all-to-all kernels; default 24", "", False),
    "efficiency": ("a table overriding efficiencies by name (`Efficiency`)", "", False),
}


def hardware_from_spec(spec: Mapping | None = None, /, **keys) -> Hardware:
    """A roofline `Hardware` from datasheet figures (`SPEC_KEYS`; a mapping, keywords, or
    both): kernel tables built from the roofline with `HOPPER` efficiencies (an
    ``efficiency`` table overrides them by name) and the H100-fitted stack constants
    (`stack_fit`). One `InputError` naming the key for a missing, unknown or bad figure."""
    data = {**(dict(spec) if spec is not None else {}), **keys}
    if spec is not None and not isinstance(spec, Mapping):
        raise InputError(f"a hardware spec must be a table, got {type(spec).__name__}")
    bad = sorted(k for k in data if k not in SPEC_KEYS)
    if bad:
        raise InputError(f"hardware: unknown key {bad[0]!r}; keys: {', '.join(SPEC_KEYS)}")
    missing = [k for k, (_, _, req) in SPEC_KEYS.items() if req and k not in data]
    if missing:
        what, unit, _ = SPEC_KEYS[missing[0]]
        need = ", ".join(k for k, v in SPEC_KEYS.items() if v[2])
        raise InputError(f"hardware: {missing[0]} is missing ({what}"
                         f"{', ' + unit if unit else ''}); give every one of {need}")
    for k in ("fp8_tflops", "bf16_tflops", "hbm_gb", "hbm_gbps", "nvlink_gbps", "nic_gbps"):
        v = data[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1e7:
            raise InputError(f"hardware: {k} must be a number in (0, 1e7) "
                             f"{SPEC_KEYS[k][1]}, got {v!r}")
    for k, default in (("gpus_per_node", None), ("sms", 132), ("comm_sms", 24)):
        v = data.get(k, default)
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 100_000:
            raise InputError(f"hardware: {k} must be a whole number >= 1, got {v!r}")
        data[k] = v
    if data["comm_sms"] >= data["sms"]:
        raise InputError(f"hardware: comm_sms {data['comm_sms']} must be below sms {data['sms']}")
    name = data.get("name", "custom")
    if not isinstance(name, str) or not name:
        raise InputError(f"hardware: name must be a non-empty string, got {name!r}")
    eff = HOPPER
    extra = data.get("efficiency")
    if extra is not None:
        if not isinstance(extra, Mapping):
            raise InputError(f"hardware: efficiency must be a table of fractions, got {extra!r}")
        known = [f.name for f in fields(Efficiency) if f.name != "source"]
        unknown = sorted(k for k in extra if k not in known)
        if unknown:
            raise InputError(f"hardware: unknown efficiency {unknown[0]!r}; known: "
                             f"{', '.join(known)}")
        eff = replace(HOPPER, **dict(extra), source=f"{HOPPER.source}, overridden: "
                      + ", ".join(sorted(extra)))
    return roofline_hardware(
        name, fp8_tflops=float(data["fp8_tflops"]), bf16_tflops=float(data["bf16_tflops"]),
        hbm_gb=float(data["hbm_gb"]), hbm_gbps=float(data["hbm_gbps"]),
        nvlink_gbps=float(data["nvlink_gbps"]), nic_gbps=float(data["nic_gbps"]),
        gpus_per_node=data["gpus_per_node"], sms=data["sms"], comm_sms=data["comm_sms"],
        efficiency=eff, sources=("datasheet figures given in the spec",),
    )


def roofline_hardware(name: str, *, fp8_tflops: float, bf16_tflops: float, hbm_gb: float,
                      hbm_gbps: float, nvlink_gbps: float, nic_gbps: float, gpus_per_node: int,
                      sms: int = 132, comm_sms: int = 24, efficiency: Efficiency = HOPPER,
                      sources: tuple[str, ...] = ()) -> Hardware:
    """The `Hardware` of a GPU known by its datasheet (figures as `SPEC_KEYS`, GB/s and
    TFLOPS): no measured GEMM table (the step-time model's curves are the roofline's), the
    decode-attention and all-to-all figures from ``efficiency``, the stack constants from
    `stack_fit`."""
    normal, ll = comm_rows(nvlink_gbps, nic_gbps, gpus_per_node, efficiency)
    return Hardware(
        name=name, sms=sms, fp8_tflops=fp8_tflops, bf16_tflops=bf16_tflops, hbm_gbps=hbm_gbps,
        hbm_gb=hbm_gb, nvlink_gbps=nvlink_gbps, rdma_gbps=nic_gbps, dense_gemm=(),
        grouped_gemm=(),
        mla_decode_tflops=bf16_tflops * efficiency.decode_attention_compute,
        mla_decode_gbps=hbm_gbps * efficiency.decode_attention_memory,
        normal_a2a=normal, ll_a2a=ll, comm_sms=comm_sms, fit=stack_fit(bf16_tflops),
        sources=(*sources, f"efficiencies: {efficiency.source}",
                 "stack constants: FITTED (SGLang, H100), prefill attention as a fraction of "
                 "the BF16 peak"),
        gpus_per_node=gpus_per_node, roofline=efficiency,
    )


def roofline_twin(hw: Hardware) -> Hardware:
    """``hw``'s datasheet figures through the roofline path (no measured table): what a
    roofline preset would say about a GPU that has measured tables (`scripts/roofline_check.py`
    compares the two)."""
    return roofline_hardware(
        f"{hw.name}_roofline", fp8_tflops=hw.fp8_tflops, bf16_tflops=hw.bf16_tflops,
        hbm_gb=hw.hbm_gb, hbm_gbps=hw.hbm_gbps, nvlink_gbps=hw.nvlink_gbps,
        nic_gbps=hw.rdma_gbps, gpus_per_node=hw.gpus_per_node, sms=hw.sms,
        comm_sms=hw.comm_sms, sources=(f"{hw.name}'s datasheet figures",),
    )
