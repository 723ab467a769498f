"""Models from their Hugging Face config.json (`ModelSpec.from_hf_config`) and the step-time
model on them: DeepSeek-V3's config gives exactly the preset; every supported family reads
(fixtures in tests/hf_configs.py, each citing its source); GQA attention FLOPs and KV bytes
match hand arithmetic from the config; windows, hybrid and compressed attention follow their
rules; bad configs are one `InputError` naming the field."""

from __future__ import annotations

import copy
from dataclasses import fields

import numpy as np
import pytest

from eplb.errors import EplbError, InputError
from eplb.evaluation.serving import ClusterConfig, advise, simulate, steady_state, workload
from eplb.evaluation.serving.config import hf_config
from eplb.evaluation.serving.config.hardware import h800
from eplb.evaluation.serving.config.model import ModelSpec, deepseek_v3, get_model
from eplb.evaluation.serving.steptime import RankBatch, StepModel
from eplb.evaluation.serving.steptime.comm import Comm
from eplb.topology import Topology
from tests import hf_configs as H


def test_deepseek_v3_config_is_exactly_the_preset():
    spec = ModelSpec.from_hf_config(H.DEEPSEEK_V3)
    for f in fields(ModelSpec):
        assert getattr(spec, f.name) == getattr(deepseek_v3, f.name), f.name
    assert spec == deepseek_v3


def test_a_path_reads_as_the_dict(tmp_path):
    path = H.write(H.KIMI_K2, tmp_path)
    assert get_model(str(path)) == ModelSpec.from_hf_config(H.KIMI_K2)
    assert get_model(path) is get_model(str(path))  # read once per version of the file


@pytest.mark.parametrize("family, want", [
    ("kimi_k2", dict(attention="mla", num_layers=61, dense_layers=1, num_experts=384, top_k=8,
                     num_groups=1, topk_groups=1, shared_experts=1, num_heads=64)),
    ("deepseek_v32", dict(attention="mla", index_topk=2048, index_heads=64,
                          index_head_dim=128, num_groups=8, topk_groups=4)),
    ("qwen3_moe", dict(attention="gqa", num_layers=48, dense_layers=0, num_experts=128,
                       top_k=8, num_groups=1, shared_experts=0, num_kv_heads=4, head_dim=128,
                       weight_dtype="bf16", expert_dtype="bf16")),
    ("qwen2_moe", dict(attention="gqa", num_experts=60, top_k=4, shared_experts=1,
                       shared_intermediate=5632, num_kv_heads=16, head_dim=128)),
    ("qwen3_5_moe", dict(attention="gqa", num_layers=60, linear_layers=45, num_experts=512,
                         top_k=10, shared_experts=1, shared_intermediate=0, head_dim=256,
                         attention_output_gate=True, linear_value_heads=64)),
    ("qwen3_next", dict(attention="gqa", num_layers=48, linear_layers=36, num_experts=512,
                        top_k=10, shared_experts=1, head_dim=256, attention_output_gate=True,
                        linear_value_heads=32, linear_state_bytes=4.0)),
    ("gpt_oss", dict(attention="gqa", num_layers=36, sliding_layers=18, sliding_window=128,
                     num_experts=128, top_k=4, shared_experts=0, moe_intermediate=2880,
                     weight_dtype="bf16", expert_dtype="fp4")),
    ("mixtral", dict(attention="gqa", num_experts=8, top_k=2, shared_experts=0,
                     moe_intermediate=14336, dense_layers=0, sliding_layers=0, head_dim=128)),
    ("glm4_moe", dict(attention="gqa", num_layers=92, dense_layers=3, num_experts=160,
                      shared_experts=1, moe_intermediate=1536, dense_intermediate=12288,
                      weight_dtype="fp8")),
    ("deepseek_v4", dict(attention="dsv4", num_layers=61, dense_layers=0, num_experts=384,
                         top_k=6, head_dim=512, index_topk=1024, weight_dtype="fp8",
                         expert_dtype="fp4")),
])
def test_each_family_reads_its_serving_fields(family, want):
    spec = ModelSpec.from_hf_config(H.FAMILIES[family])
    assert {k: getattr(spec, k) for k in want} == want
    assert sum(g.layers for g in spec.attention_layers) == spec.num_layers


def test_dense_layers_that_are_not_a_prefix():
    cfg = dict(H.QWEN3_30B, mlp_only_layers=[0, 5], decoder_sparse_step=1)
    spec = ModelSpec.from_hf_config(cfg)
    assert spec.dense_layers == 2 and spec.moe_layers == 46
    assert 0 not in spec.moe_layer_index and 5 not in spec.moe_layer_index
    every_other = ModelSpec.from_hf_config(dict(H.QWEN3_30B, decoder_sparse_step=2))
    assert every_other.moe_layer_index == tuple(range(1, 48, 2))


def test_gqa_prefill_flops_and_decode_kv_bytes_are_the_hand_arithmetic():
    """Qwen3-30B-A3B: 32 heads, 4 KV heads of 128. Prefill: QK^T and PV are 2 x 128 FLOPs each
    per head and pair; decode reads K and V, 4 heads x 128 BF16 elements each, per token."""
    cfg = H.QWEN3_30B
    heads, kv_heads, hd = (cfg["num_attention_heads"], cfg["num_key_value_heads"],
                           cfg["head_dim"])
    spec = ModelSpec.from_hf_config(cfg)
    flops_per_pair = heads * (2 * hd + 2 * hd)  # 16,384
    kv_bytes = 2 * kv_heads * hd * 2  # 2,048
    assert spec.prefill_flops_per_pair == flops_per_pair == spec.decode_flops_per_pair
    assert spec.kv_bytes_per_token == kv_bytes
    topo = Topology(1, 8, 16)
    pre = StepModel("prefill", topo, model=spec, hardware=h800)
    b = RankBatch.uniform("prefill", 8, tokens=4096, context=2048)
    pairs = 4096 * (2048 + 1) / 2 / 2  # per rank and micro-batch
    # the measured prefill-attention TFLOPS at the effective prompt length 2 x pairs / tokens
    # (2,049 here: between the table's 2,048 and 4,096 rows, interpolated in log2), times the
    # engine efficiency (hardware.KernelFit)
    rows = dict(h800.prefill_attention)
    length = 2 * pairs / 2048
    assert 2048 < length < 4096
    w = np.log2(length / 2048)  # log2(4096 / 2048) = 1
    tflops = rows[2048] * (1 - w) + rows[4096] * w
    want = pairs * flops_per_pair / (tflops * h800.fit.engine_efficiency * 1e12)
    assert pre.rank.stages(b)[1] == pytest.approx(np.full(8, want), rel=1e-12)
    dec = StepModel("decode", topo, model=spec, hardware=h800)
    b = RankBatch.uniform("decode", 8, tokens=64, context=4096)
    kv = 64 * 4096 / 2
    memory = kv * kv_bytes / (h800.mla_decode_gbps * 1e9)
    compute = kv * flops_per_pair / (h800.mla_decode_tflops * 1e12)
    assert memory > compute  # the KV bytes decide here, so they are what is checked
    assert dec.rank.stages(b)[1] == pytest.approx(np.full(8, memory), rel=1e-12)
    assert dec.rank.decode_rows(b)[1] == pytest.approx(np.full(8, memory), rel=1e-12)


def test_sliding_window_layers_read_at_most_the_window():
    """gpt-oss-120b: half the layers attend to the last 128 tokens, so at a 4K context they
    read 128 of the 4,096 keys per request; the other half read all of them."""
    spec = ModelSpec.from_hf_config(H.GPT_OSS_120B)
    dec = StepModel("decode", Topology(1, 8, 16), model=spec, hardware=h800)
    b = RankBatch.uniform("decode", 8, tokens=64, context=4096)
    per_key = 2 * 8 * 64 * 2  # K and V, 8 KV heads of 64, BF16
    bw = h800.mla_decode_gbps * 1e9
    full, window = 64 * 4096 / 2, 64 * 128 / 2
    want = 0.5 * full * per_key / bw + 0.5 * window * per_key / bw
    assert dec.rank.stages(b)[1] == pytest.approx(np.full(8, want), rel=1e-12)
    assert spec.kv_bytes_per_token == per_key * 18 / 36  # windows are per request, not token


def test_sparse_and_linear_attention_follow_their_caps():
    """DeepSeek-V3.2: past 2,048 keys the main attention stops growing (the indexer still
    scores every key); Qwen3.5's linear layers cost the same at any context."""
    v32 = ModelSpec.from_hf_config(H.DEEPSEEK_V32)
    pre = StepModel("prefill", Topology(1, 8, 32), model=v32, hardware=h800)
    short = pre.rank.stages(RankBatch.uniform("prefill", 8, tokens=4096, context=4096))[1]
    long = pre.rank.stages(RankBatch.uniform("prefill", 8, tokens=4096, context=32768))[1]
    dense = StepModel("prefill", Topology(1, 8, 32), model=deepseek_v3, hardware=h800)
    long_dense = dense.rank.stages(RankBatch.uniform("prefill", 8, tokens=4096,
                                                     context=32768))[1]
    assert (long > short).all() and (long < 0.5 * long_dense).all()
    q35 = ModelSpec.from_hf_config(H.QWEN35_397B)
    (lin,) = [g for g in q35.attention_layers if g.state_bytes]
    assert lin.layers == 45 and lin.state_bytes == 64 * 128 * 128 * 4
    dec = StepModel("decode", Topology(1, 8, 64), model=q35, hardware=h800)
    a = dec.rank.stages(RankBatch.uniform("decode", 8, tokens=32, context=1024))[1]
    b = dec.rank.stages(RankBatch.uniform("decode", 8, tokens=64, context=1024))[1]
    assert b == pytest.approx(2 * a, rel=1e-9)  # state and KV reads both scale with requests


def test_low_latency_comm_is_per_pick_of_the_benchmark_and_per_byte_of_the_model():
    """The low-latency table's calls are 128 tokens x top-8 of hidden 7168: a top-2 model's
    pick costs the same seconds per byte, not four times more."""
    topo = Topology(2, 8, 8)
    ds = Comm("decode", Topology(2, 8, 16), deepseek_v3, h800).ll
    mix = Comm("decode", topo, ModelSpec.from_hf_config(H.MIXTRAL_8X7B), h800).ll
    assert mix == pytest.approx((ds[0] * 4096 / 7168, ds[1] * 4096 / 7168), rel=1e-12)


MI355X_TABLE = ("[hardware]\nname = \"mi355x-like\"\nfp8_tflops = 5033\nbf16_tflops = 2516\n"
                "hbm_gb = 288\nhbm_gbps = 8000\nnvlink_gbps = 538\nnic_gbps = 50\n"
                "gpus_per_node = 8\n")


def _cluster(tmp_path, family: str, hardware: str) -> ClusterConfig:
    """A 2 x 8 GPU cluster TOML with ``model = "config.json"`` beside it and ``hardware`` (a
    preset name, or "table": a ``[hardware]`` table of datasheet figures)."""
    spec = ModelSpec.from_hf_config(H.FAMILIES[family])
    H.write(H.FAMILIES[family], tmp_path)
    slots = -(-spec.num_experts // 16) * 16
    gpu = MI355X_TABLE if hardware == "table" else f'hardware = "{hardware}"\n'
    (tmp_path / "c.toml").write_text(
        'model = "config.json"\n'
        + (gpu if hardware != "table" else "")
        + f"[prefill]\nnodes = 2\nslots_per_layer = {slots}\n"
        f"[decode]\nnodes = 2\nslots_per_layer = {slots}\nmax_running_requests = 32\n"
        "kv_capacity_tokens = 200000\n"
        '[routing]\nsource = "uniform"\n[eplb]\nsolver = "greedy"\n'
        + (gpu if hardware == "table" else ""))
    cfg = ClusterConfig.from_toml(tmp_path / "c.toml")
    assert cfg.model_spec == spec
    return cfg


@pytest.mark.parametrize("family", sorted(H.FAMILIES))
@pytest.mark.parametrize("hardware", ["table", "h800"])
def test_steady_state_runs_every_family(family, hardware, tmp_path):
    """TOML ``model = "config.json"`` beside the file, both phases, a measured GPU and a
    ``[hardware]`` table: finite, positive step times, labelled; the same without shared
    experts, groups or top-8."""
    cfg = _cluster(tmp_path, family, hardware)
    for phase in ("prefill", "decode"):
        r = steady_state(cfg, phase, batch=2048 if phase == "prefill" else 32)
        assert np.isfinite(r["step_s"]) and r["step_s"] > 0 and r["tok_s_per_node"] > 0
        assert (r["curves"]["dispatch_combine"] == "roofline") == (hardware == "table")


@pytest.mark.parametrize("family", sorted(H.FAMILIES))
def test_advise_and_simulate_run_every_family(family, tmp_path):
    """`advise` on a skewed dump of the model's shape on b200, and a short simulation with a
    ``[hardware]`` table: rebalancing helps the dump's balance, every request is served."""
    cfg = _cluster(tmp_path, family, "table")
    spec = cfg.model_spec
    load = np.random.default_rng(0).pareto(1.2, (spec.moe_layers, spec.num_experts)) + 0.1
    a = advise(load, "2x8", cfg.decode.slots_per_layer, model=str(tmp_path / "config.json"),
               hardware="b200", levers=["rebalance"], tokens_per_rank=16, max_tokens=16)
    today, rebalanced = a.table["balance"]
    assert rebalanced < today and a.meta["curves"]["grouped_gemm"] == "roofline"
    wl = workload.from_spec("synth:n=20,rate=10,seed=1", block_size=cfg.kv.block_size)
    res = simulate(cfg, wl, seed=0, duration_s=4.0, progress=False)
    assert len(res.requests) == 20 and len(res.steps) > 0


@pytest.mark.parametrize("change, needle", [
    ({"num_experts_per_tok": None}, "num_experts_per_tok"),
    ({"hidden_size": None}, "hidden_size"),
    ({"kv_lora_rank": None}, "kv_lora_rank"),
    ({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}, "model_type 'llama'"),
    ({"n_routed_experts": 0}, "no routed experts"),
    ({"quantization_config": {"quant_method": "gptq"}}, "quant_method 'gptq'"),
    ({"first_k_dense_replace": 61}, "no layer is a MoE layer"),
    ({"n_group": 3}, "num_groups 3 must divide"),
    ({"num_hidden_layers": "61"}, "num_hidden_layers must be a whole number"),
    ({"quantization_config": None, "torch_dtype": "int8"}, "torch_dtype 'int8'"),
])
def test_bad_configs_are_one_error_naming_the_field(change, needle):
    cfg = copy.deepcopy(H.DEEPSEEK_V3)
    for k, v in change.items():
        if v is None:
            del cfg[k]
        else:
            cfg[k] = v
    with pytest.raises(InputError) as info:
        ModelSpec.from_hf_config(cfg)
    assert needle in str(info.value) and isinstance(info.value, EplbError)


def test_bad_files_and_overrides(tmp_path):
    (tmp_path / "bad.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(InputError, match="not valid JSON"):
        ModelSpec.from_hf_config(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(InputError, match="JSON object"):
        ModelSpec.from_hf_config(tmp_path / "list.json")
    with pytest.raises(InputError, match="unknown model"):
        get_model(str(tmp_path / "missing.json"))
    with pytest.raises(InputError, match="unknown ModelSpec field 'kv_bytes'"):
        ModelSpec.from_hf_config(H.QWEN3_30B, kv_bytes=1)
    fp8_kv = ModelSpec.from_hf_config(H.QWEN3_30B, kv_cache_bytes=1.0)
    assert fp8_kv.kv_bytes_per_token == 1024
    # a checkpoint whose quantisation config stores the KV cache in FP8 (NVIDIA's NVFP4
    # re-packs: modelopt's kv_cache_quant_algo) reads as an FP8 KV cache with FP4 experts
    nvfp4 = dict(H.QWEN3_30B, quantization_config={
        "quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"})
    spec = ModelSpec.from_hf_config(nvfp4)
    assert (spec.kv_cache_bytes, spec.expert_dtype, spec.weight_dtype) == (1.0, "fp4", "bf16")
    v4 = dict(H.DEEPSEEK_V4_PRO, num_key_value_heads=2)
    with pytest.raises(InputError, match="not modelled"):
        ModelSpec.from_hf_config(v4)
    _, notes = hf_config.describe(H.QWEN35_397B)
    assert any("Gated DeltaNet" in n for n in notes) and any("KV cache" in n for n in notes)
