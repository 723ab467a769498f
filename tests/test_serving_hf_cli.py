"""``--model config.json`` and ``--hardware PRESET|FILE`` on the command line: advise on a dump
of another model on a datasheet GPU (the first lines say the curves are a roofline), the shared
Qwen1.5-MoE trace with its own config, simulate with both options, solve / evaluate taking the
expert groups from the model, and one ``eplb: error:`` line for a bad config or GPU file."""

from __future__ import annotations

import json

import numpy as np
import pytest

from eplb.cli import option_groups as og
from eplb.evaluation.serving.config.hardware import hardware_names
from eplb.evaluation.serving.config.model import MODELS
from tests import hf_configs as H
from tests._cli import run_cli

B200_TOML = """[hardware]
name = "my_b200"
fp8_tflops = 4500
bf16_tflops = 2250
hbm_gb = 180
hbm_gbps = 7700
nvlink_gbps = 900
nic_gbps = 50
gpus_per_node = 8
"""


def _dump(tmp_path, layers: int, experts: int, seed: int = 0):
    """An SGLang expert-count JSON of ``layers`` x ``experts`` with skewed loads."""
    rng = np.random.default_rng(seed)
    load = rng.pareto(1.5, (layers, experts)) * 100 + 1
    path = tmp_path / "dump.json"
    path.write_text(json.dumps({"logical_count": load.tolist()}))
    return path


def test_cli_preset_copies_match_the_library():
    assert og.MODEL_PRESETS == tuple(MODELS)
    assert (*og.MEASURED_GPUS, *og.DATASHEET_GPUS) == hardware_names()


@pytest.mark.parametrize("hardware", ["b200", "file"])
def test_advise_another_model_on_a_datasheet_gpu(tmp_path, hardware):
    """Mixtral (8 experts, top-2, no shared expert, no groups) on B200: the result's second
    line says which figures are a roofline."""
    model = H.write(H.MIXTRAL_8X7B, tmp_path)
    gpu = "b200"
    if hardware == "file":
        gpu = tmp_path / "gpu.toml"
        gpu.write_text(B200_TOML)
    code, out, err = run_cli("advise", _dump(tmp_path, 32, 8), "--model", model,
                             "--hardware", gpu, "--topology", "1x8", "--slots", "16",
                             "--levers", "rebalance,bound", "--tokens-per-rank", "16",
                             "--max-tokens", "32", "--redundant", "8")
    assert code == 0, err
    lines = out.splitlines()
    assert "mixtral" in lines[0] and lines[1].startswith("ROOFLINE:")
    assert "grouped gemm roofline" in lines[1] and "engine efficiency calibrated" in lines[1]
    assert "routed experts bf16" in out  # the model's assumptions are printed


def test_advise_on_a_measured_gpu_says_measured(tmp_path):
    model = H.write(H.KIMI_K2, tmp_path)
    code, out, err = run_cli("advise", _dump(tmp_path, 60, 384), "--model", model,
                             "--hardware", "h100", "--topology", "4x8", "--slots", "384",
                             "--levers", "rebalance", "--tokens-per-rank", "8",
                             "--max-tokens", "16")
    assert code == 0, err
    assert out.splitlines()[1].startswith("h100: kernel tables measured")
    assert "ROOFLINE" not in out


def test_qwen15_moe_trace_through_advise_with_its_config(tmp_path, shared_traces):
    trace = shared_traces / "qwen1.5-moe-harmoeny"
    if not trace.is_dir():
        pytest.skip(f"{trace} not found")
    model = H.write(H.QWEN15_MOE, tmp_path)
    code, out, err = run_cli("advise", trace, "--model", model, "--hardware", "b200",
                             "--topology", "1x4", "--slots", "64", "--levers",
                             "rebalance,bound", "--tokens-per-rank", "64", "--max-tokens",
                             "64", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert res["meta"]["layers"] == 24 and res["meta"]["model"] == "qwen2_moe"
    assert res["meta"]["curves"]["grouped_gemm"] == "roofline"
    rows = {r["lever"]: r for r in res["rows"]}
    assert rows["rebalance"]["balance"] < rows["today"]["balance"]
    assert all(r["step_ms"] > 0 for r in res["rows"])


def test_simulate_with_model_and_hardware_options(tmp_path):
    model = H.write(H.QWEN3_30B, tmp_path)
    gpu = tmp_path / "gpu.toml"
    gpu.write_text(B200_TOML)
    out_dir = tmp_path / "run"
    code, out, err = run_cli(
        "simulate", "deepseek_day6", "--model", model, "--hardware", gpu,
        "--set", "routing.source=uniform", "--set", "prefill.nodes=1", "--set",
        "prefill.slots_per_layer=128", "--set", "decode.nodes=1", "--set",
        "decode.slots_per_layer=128", "--set", "decode.kv_capacity_tokens=200000",
        "--workload", "synth:n=40,rate=10", "--duration", "5", "--no-plots",
        "--no-progress", "-o", out_dir)
    assert code == 0, err
    assert out.splitlines()[0].startswith("deepseek_day6: ROOFLINE: my_b200")
    written = (out_dir / "config.toml").read_text()
    assert f'model = "{model}"' in written and f'hardware = "{gpu}"' in written


def test_solve_and_evaluate_take_groups_from_the_model(tmp_path):
    model = H.write(H.DEEPSEEK_V3, tmp_path)
    load = tmp_path / "load.json"
    rng = np.random.default_rng(1)
    load.write_text(json.dumps({"logical_count": (rng.random((58, 256)) * 100 + 1).tolist()}))
    out = tmp_path / "p.json"
    code, text, err = run_cli("solve", load, "--topology", "4x8", "--slots", "288",
                              "--model", model, "-o", out)
    assert code == 0, err
    assert json.loads(out.read_text())["solver"]["params"]["num_groups"] == 8
    code, text, err = run_cli("evaluate", out, load, "--model", model, "--json")
    assert code == 0, err
    meta = json.loads(text)
    assert meta["traffic"]["groups"] == [8, 4] and meta["traffic"]["hidden"] == 7168


@pytest.mark.parametrize("what, content, needle", [
    ("--model", json.dumps({**H.QWEN3_30B, "num_experts_per_tok": None}),
     "num_experts_per_tok"),
    ("--model", json.dumps({"model_type": "llama", "num_hidden_layers": 2}),
     "model_type 'llama'"),
    ("--hardware", "[hardware]\nfp8_tflops = 1\n", "bf16_tflops is missing"),
    ("--hardware", B200_TOML.replace("nic_gbps = 50", "nic_gbps = -1"), "nic_gbps"),
])
def test_bad_files_are_one_error_line(tmp_path, what, content, needle):
    path = tmp_path / ("m.json" if what == "--model" else "gpu.toml")
    path.write_text(content)
    other = ["--hardware", "b200"] if what == "--model" else []
    code, out, err = run_cli("advise", _dump(tmp_path, 48, 128), what, path, *other,
                             "--topology", "1x8", "--slots", "128")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("eplb: error:"), err
    assert needle in lines[0]
