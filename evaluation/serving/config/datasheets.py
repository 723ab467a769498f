"""GPU presets from public datasheets (`DATASHEETS`), every figure cited; their kernel curves
are a roofline of these figures times the Hopper efficiencies (`roofline.HOPPER`) and the
H100-fitted stack constants: no kernel was measured on these GPUs by this project, and every
figure built on them is labelled ``roofline``.

Figures are per GPU, dense (NVIDIA's datasheets print FP8/BF16 with 2:4 sparsity: halved here),
link bandwidths per direction (a "900 GB/s bidirectional" NVLink is 450). Efficiency assumed for
every preset: the Hopper one, the ratio the H800 kernel benchmarks reach of the H800 datasheet
(one defensible choice, stated; docs/serving.md "Your model, your GPU"). Known bias: the
aiconfigurator B200/GB200 grouped-MoE sweeps reach about 0.42 of the FP8 peak in SGLang's path
where H100 reaches 0.55 (research notes, AIC wideep_context_moe_perf), so compute-bound MoE on
Blackwell is likely optimistic here by up to a quarter. The ``*_roofline`` twins of the measured
Hopper presets run the same datasheet figures through the roofline (`roofline.roofline_twin`),
for the cross-hardware check (`scripts/roofline_check.py`)."""

from __future__ import annotations

from eplb.evaluation.serving.config.hardware import HARDWARE, Hardware
from eplb.evaluation.serving.config.roofline import roofline_hardware, roofline_twin

# LMSYS blog 2025-09-26 (lm-sys/lm-sys.github.io@2896b379, blog/2025-09-26-sglang-ant-group.md),
# table "H20-96G vs H800-80G": FP8 296 / BF16 148 TFLOPS, 96 GB, 4000 GB/s, NVLink 900 GB/s
# (bidirectional: 450 per direction), RDMA 4 x 400 Gb/s per 8-GPU node (25 GB/s per GPU).
# Dense figures also in citsjtu2020/LLM-Prof@8434c8d hardware_spec.md (NVIDIA_H20_SXM5_96GB).
h20 = roofline_hardware(
    "h20", fp8_tflops=296.0, bf16_tflops=148.0, hbm_gb=96.0, hbm_gbps=4000.0,
    nvlink_gbps=450.0, nic_gbps=25.0, gpus_per_node=8,
    sources=("LMSYS blog 2025-09-26 (SGLang on H20, lm-sys.github.io@2896b379): H20-96G "
             "figures", "SMs: not cited, 132 / 24 assumed as on H800 (the share held by the "
             "all-to-all)"),
)

# NVIDIA Blackwell datasheet (nvdam.widen.net/s/wwnsxrhm2w/blackwell-datasheet-3384703, cited
# by aiconfigurator@095f58a systems/b200_sxm.yaml): HGX B200 per GPU FP8 9 PFLOPS and BF16
# 4.5 PFLOPS "with sparsity" (dense 4500 / 2250), 180 GB HBM3e at 7.7 TB/s, NVLink 1.8 TB/s
# bidirectional (900 per direction); DGX B200 user guide: 8 x ConnectX-7 400 Gb/s (50 GB/s
# per GPU; aiconfigurator's 100 GB/s assumes CX8 800 Gb/s).
b200 = roofline_hardware(
    "b200", fp8_tflops=4500.0, bf16_tflops=2250.0, hbm_gb=180.0, hbm_gbps=7700.0,
    nvlink_gbps=900.0, nic_gbps=50.0, gpus_per_node=8,
    sources=("NVIDIA Blackwell datasheet (HGX B200, dense = sparse / 2)",
             "NVIDIA DGX B200 user guide: 8 x ConnectX-7 400 Gb/s"),
)

# The same datasheet, GB200 NVL72 per GPU: FP8 10 / BF16 5 PFLOPS with sparsity (dense 5000 /
# 2500), 186 GB HBM3e at 8 TB/s, NVLink 1.8 TB/s bidirectional per GPU across the 72-GPU NVLink
# domain (NVIDIA DGX GB200 user guide, networking): gpus_per_node is that domain; between racks
# aiconfigurator@095f58a systems/gb200.yaml's inter_rack_bw 100 GB/s per GPU (CX8 800 Gb/s).
gb200 = roofline_hardware(
    "gb200", fp8_tflops=5000.0, bf16_tflops=2500.0, hbm_gb=186.0, hbm_gbps=8000.0,
    nvlink_gbps=900.0, nic_gbps=100.0, gpus_per_node=72,
    sources=("NVIDIA Blackwell datasheet (GB200 NVL72 per GPU, dense = sparse / 2)",
             "NVIDIA DGX GB200 user guide (NVLink 1.8 TB/s per GPU, 72 GPUs)",
             "aiconfigurator systems/gb200.yaml: inter-rack 100 GB/s per GPU"),
)

# ROCm/ROCm@e396b489 docs/conceptual/gpu-arch/mi300.md, "Peak-performance capabilities of the
# MI300X" (non-sparse): Matrix FP8 2614.9, FP16/BF16 1307.4 TFLOPS, 5.3 TB/s; seven Infinity
# Fabric links, fully connected 8-GPU node, 128 GB/s bidirectional each (7 x 64 = 448 GB/s per
# direction; gpu.blog "896 GB/s"); 192 GB (ROCm gpu-specs). NIC: no first-party figure; one
# 400 Gb/s NIC per GPU assumed (50 GB/s; deployments vary).
mi300x = roofline_hardware(
    "mi300x", fp8_tflops=2614.9, bf16_tflops=1307.4, hbm_gb=192.0, hbm_gbps=5300.0,
    nvlink_gbps=448.0, nic_gbps=50.0, gpus_per_node=8,
    sources=("ROCm docs mi300.md @e396b489 (peak dense FP8 / BF16, HBM, 7 xGMI links)",
             "xGMI 128 GB/s bidirectional per link (gpu.blog)",
             "NIC: 400 Gb/s per GPU assumed"),
)

# MI355X: 288 GB HBM3E at 8 TB/s (Tom's Hardware, The Register 2025-06-12); FP8 dense
# 256 CUs x 8192 FLOPS/clock x 2.4 GHz = 5033 TFLOPS ("five petaflops", ISSCC 2026 report;
# the same formula gives MI300X's 2614.9), BF16 half of it (CDNA ratio, assumed); Infinity
# Fabric ~153.6 GB/s bidirectional per link (humeconsulting.co, third party), 7 links assumed
# as on MI300X: 538 GB/s per direction. NIC as MI300X (assumed).
mi355x = roofline_hardware(
    "mi355x", fp8_tflops=5033.0, bf16_tflops=2516.0, hbm_gb=288.0, hbm_gbps=8000.0,
    nvlink_gbps=538.0, nic_gbps=50.0, gpus_per_node=8,
    sources=("MI355X 288 GB / 8 TB/s (press); FP8 = 256 CU x 8192 x 2.4 GHz (derived)",
             "BF16 = FP8 / 2, 7 xGMI links at 153.6 GB/s bidirectional, NIC 400 Gb/s: "
             "assumed"),
)

DATASHEETS: dict[str, Hardware] = {
    "h20": h20,
    "b200": b200,
    "gb200": gb200,
    "mi300x": mi300x,
    "mi355x": mi355x,
    **{f"{k}_roofline": roofline_twin(v) for k, v in HARDWARE.items()},
}
