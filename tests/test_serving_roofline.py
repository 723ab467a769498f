"""GPUs from their datasheet (`Hardware.from_spec`, `config.roofline`, `config.datasheets`): the
roofline curves are monotone and never beat the datasheet roofline; the stored Hopper
efficiencies are the H800 kernel tables'; the roofline twins of the measured Hopper presets
reproduce them on the calibration points within 15% (scripts/roofline_check.py); every figure
says what it rests on; bad specs are one `InputError` naming the key."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from eplb.errors import InputError
from eplb.evaluation.serving.config.datasheets import DATASHEETS
from eplb.evaluation.serving.config.hardware import HARDWARE, Hardware, get_hardware, h800
from eplb.evaluation.serving.config.model import DTYPE_BYTES, ModelSpec, deepseek_v3
from eplb.evaluation.serving.config.roofline import HOPPER, derive_hopper
from eplb.evaluation.serving.steptime import kernels
from eplb.evaluation.serving.steptime.curves import ExpertCurve
from eplb.evaluation.serving.steptime.gpu_side import GpuSide
from eplb.evaluation.serving.steptime.roofline import RooflineExpert
from eplb.topology import Topology
from tests import hf_configs as H

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "roofline_check.py"
B200 = dict(name="b", fp8_tflops=4500, bf16_tflops=2250, hbm_gb=180, hbm_gbps=7700,
            nvlink_gbps=900, nic_gbps=50, gpus_per_node=8)
MODELS = {"deepseek_v3": deepseek_v3, "qwen3_bf16": ModelSpec.from_hf_config(H.QWEN3_30B),
          "gpt_oss_fp4": ModelSpec.from_hf_config(H.GPT_OSS_120B)}


@pytest.mark.parametrize("gpu", sorted(DATASHEETS))
@pytest.mark.parametrize("model", sorted(MODELS))
def test_grouped_gemm_curve_is_monotone_and_respects_the_roofline(gpu, model):
    hw, m = DATASHEETS[gpu], MODELS[model]
    curve = kernels.expert_curve(hw, m)
    assert isinstance(curve, RooflineExpert)
    tokens = np.unique(np.round(np.logspace(0, 16, 400, base=2)))
    t = curve.seconds(tokens)
    flops = tokens * 2 * 3 * m.hidden * m.moe_intermediate
    assert (np.diff(t) >= 0).all()  # more tokens never take less time
    assert (np.diff(flops / t) >= -1e-9 * (flops / t)[1:]).all()  # throughput never falls
    peak = (hw.bf16_tflops if m.expert_dtype == "bf16" else hw.fp8_tflops) * 1e12
    weights = 3 * m.hidden * m.moe_intermediate * DTYPE_BYTES[m.expert_dtype]
    assert (t >= flops / peak).all()  # never above the compute roof
    assert (t >= weights / (hw.hbm_gbps * 1e9)).all()  # nor above the memory roof
    gpu = GpuSide(Topology(1, 8, 1 + m.num_experts // 8), m, hw)
    assert gpu.expert_table is gpu.expert  # the hot path runs the exact roofline


def test_measured_presets_keep_their_tables_and_labels():
    curve = kernels.expert_curve(h800, deepseek_v3)
    assert isinstance(curve, ExpertCurve)
    lab = kernels.labels(h800, deepseek_v3)
    assert "roofline" not in lab.values() and lab["grouped_gemm"] == "measured"
    # prefill attention and the layer overhead are pinned by kernel tables (measured); the one
    # constant fitted end to end is the engine efficiency
    assert lab["prefill_attention"] == "measured" and lab["layer_overhead"] == "measured"
    assert lab["engine_efficiency"] == "calibrated"
    assert kernels.labels(DATASHEETS["b200"], deepseek_v3)["grouped_gemm"] == "roofline"
    fp4 = MODELS["gpt_oss_fp4"]  # no FP4 table on Hopper: that curve is the roofline
    assert isinstance(kernels.expert_curve(h800, fp4), RooflineExpert)
    assert kernels.labels(h800, fp4)["grouped_gemm"] == "roofline"
    assert kernels.describe(DATASHEETS["b200"], deepseek_v3).startswith("ROOFLINE")
    assert not kernels.describe(h800, deepseek_v3).startswith("ROOFLINE")


def test_hopper_efficiencies_are_the_h800_tables():
    derived = derive_hopper(h800)
    for f in fields(HOPPER):
        if f.name != "source":
            assert getattr(HOPPER, f.name) == pytest.approx(getattr(derived, f.name),
                                                            rel=0.01), f.name


@pytest.fixture(scope="module")
def check():
    sys.path.insert(0, str(SCRIPT.parent))  # as running the script does
    spec = importlib.util.spec_from_file_location("roofline_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("calibrate_serving", None)
        sys.path.remove(str(SCRIPT.parent))


def test_roofline_twins_reproduce_the_measured_presets_on_the_calibration_points(check):
    rows = check.rows()
    assert {r["gpu"] for r in rows} == set(HARDWARE)
    assert len(rows) == len(HARDWARE) * len(check.CASES)
    worst = max(abs(r["error"]) for r in rows)
    assert worst <= check.TOL, [r for r in rows if abs(r["error"]) > check.TOL]
    assert not check.drift()


def test_datasheet_presets_are_dense_cited_and_roofline():
    for name, hw in DATASHEETS.items():
        assert hw.curves == "roofline" and hw.roofline is not None and hw.sources, name
        assert hw.fp8_tflops == pytest.approx(2 * hw.bf16_tflops, rel=0.01), name
        assert get_hardware(name) is hw
    assert DATASHEETS["gb200"].gpus_per_node == 72
    assert DATASHEETS["h100_roofline"].fp8_tflops == HARDWARE["h100"].fp8_tflops


def test_from_spec_table_file_and_preset_agree(tmp_path):
    hw = Hardware.from_spec(B200)
    assert hw.normal_a2a == DATASHEETS["b200"].normal_a2a
    assert hw.ll_a2a == DATASHEETS["b200"].ll_a2a
    assert hw.mla_decode_gbps == DATASHEETS["b200"].mla_decode_gbps
    lines = "\n".join(f"{k} = {v!r}" if isinstance(v, str) else f"{k} = {v}"
                      for k, v in B200.items()).replace("'", '"')
    (tmp_path / "gpu.toml").write_text("[hardware]\n" + lines + "\n[hardware.efficiency]\n"
                                       "gemm_compute = 0.4\n")
    slow = get_hardware(tmp_path / "gpu.toml")
    assert slow.roofline.gemm_compute == 0.4 and slow.roofline.gemm_memory == HOPPER.gemm_memory
    (tmp_path / "flat.toml").write_text(lines + "\n")
    assert get_hardware(str(tmp_path / "flat.toml")).ll_a2a == hw.ll_a2a


@pytest.mark.parametrize("change, needle", [
    ({"fp8_tflops": None}, "fp8_tflops is missing"),
    ({"nic_gbps": -5}, "nic_gbps must be a number"),
    ({"hbm_gbps": True}, "hbm_gbps must be a number"),
    ({"gpus_per_node": 0}, "gpus_per_node must be a whole number"),
    ({"tdp_w": 1000}, "unknown key 'tdp_w'"),
    ({"efficiency": {"gemm_compute": 1.5}}, "efficiency.gemm_compute must be a fraction"),
    ({"efficiency": {"speed": 0.5}}, "unknown efficiency 'speed'"),
    ({"sms": 24, "comm_sms": 24}, "comm_sms 24 must be below sms 24"),
])
def test_bad_specs_are_one_error_naming_the_key(change, needle):
    spec = dict(B200)
    for k, v in change.items():
        if v is None:
            spec.pop(k)
        else:
            spec[k] = v
    with pytest.raises(InputError) as info:
        Hardware.from_spec(spec)
    assert needle in str(info.value)


def test_bad_hardware_names_and_files(tmp_path):
    with pytest.raises(InputError, match="unknown hardware 'b300'"):
        get_hardware("b300")
    (tmp_path / "bad.toml").write_text("[hardware]\nfp8_tflops = 1\n")
    with pytest.raises(InputError, match=r"bad\.toml: hardware: bf16_tflops is missing"):
        get_hardware(tmp_path / "bad.toml")
    (tmp_path / "junk.toml").write_text("fp8 = [\n")
    with pytest.raises(InputError, match="not valid TOML"):
        get_hardware(tmp_path / "junk.toml")


def test_a_node_is_at_most_the_gpus_nvlink_domain():
    """An EP unit's nodes hold at most the GPUs one NVLink (xGMI) domain links: 16 per node
    on H800 is refused by name; GB200 NVL72's 72 is one node."""
    from eplb.evaluation.serving import ClusterConfig, UnitConfig

    base = ClusterConfig.deepseek_day6()
    wide = UnitConfig(nodes=2, gpus_per_node=16, slots_per_layer=288, token_budget=16384)
    with pytest.raises(InputError, match=r"prefill.gpus_per_node 16 is more than the 8 GPUs"):
        base.replace(prefill=wide)
    nvl = UnitConfig(nodes=1, gpus_per_node=72, slots_per_layer=288, token_budget=16384)
    assert base.replace(hardware="gb200", prefill=nvl).topology("prefill").num_nodes == 1
