"""Hugging Face ``config.json`` fixtures: only the fields the serving cost reads, copied from
each model's public config (values verbatim; the repository and commit in ``_source``, which
the reader ignores). AIC = ai-dynamo/aiconfigurator@095f58a51c4ca8e61b66ec108d86f223f8d559ce,
aic-core/src/aiconfigurator_core/model_configs/ (verbatim copies of the Hub files)."""

from __future__ import annotations

import json
from pathlib import Path

AIC = "ai-dynamo/aiconfigurator@095f58a:aic-core/src/aiconfigurator_core/model_configs/"

DEEPSEEK_V3 = {
    "_source": AIC + "deepseek-ai--DeepSeek-V3_config.json",
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "num_hidden_layers": 61, "first_k_dense_replace": 3, "moe_layer_freq": 1,
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "n_routed_experts": 256, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4,
    "n_shared_experts": 1, "num_attention_heads": 128, "num_key_value_heads": 128,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "vocab_size": 129280, "torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                            "weight_block_size": [128, 128]},
}

DEEPSEEK_V32 = {
    **DEEPSEEK_V3,
    "_source": AIC + "deepseek-ai--DeepSeek-V3.2_config.json",
    "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
    "index_n_heads": 64, "index_head_dim": 128, "index_topk": 2048,
}

KIMI_K2 = {
    "_source": AIC + "moonshotai--Kimi-K2-Instruct_config.json",
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
    "num_hidden_layers": 61, "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "n_routed_experts": 384, "num_experts_per_tok": 8, "n_group": 1, "topk_group": 1,
    "n_shared_experts": 1, "num_attention_heads": 64, "num_key_value_heads": 64,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "vocab_size": 163840, "torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "fp8"},
}

QWEN3_30B = {
    "_source": AIC + "Qwen--Qwen3-30B-A3B_config.json",
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "num_hidden_layers": 48, "hidden_size": 2048, "intermediate_size": 6144,
    "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
    "sliding_window": None, "use_sliding_window": False, "max_window_layers": 48,
    "mlp_only_layers": [], "decoder_sparse_step": 1, "vocab_size": 151936,
    "torch_dtype": "bfloat16",
}

# Qwen/Qwen1.5-MoE-A2.7B(-Chat), the model of ../shared/traces/qwen1.5-moe-harmoeny: the
# defaults of huggingface/transformers@008e574391258935f3ecc3035c882e73bbcac419
# src/transformers/models/qwen2_moe/configuration_qwen2_moe.py (checkpoint
# "Qwen/Qwen1.5-MoE-A2.7B"), num_key_value_heads as in the published config.json
QWEN15_MOE = {
    "_source": "huggingface/transformers@008e574:src/transformers/models/qwen2_moe/"
               "configuration_qwen2_moe.py (Qwen/Qwen1.5-MoE-A2.7B defaults)",
    "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
    "num_hidden_layers": 24, "hidden_size": 2048, "intermediate_size": 5632,
    "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
    "num_experts": 60, "num_experts_per_tok": 4, "num_attention_heads": 16,
    "num_key_value_heads": 16, "decoder_sparse_step": 1, "vocab_size": 151936,
    "torch_dtype": "bfloat16",
}

QWEN35_397B = {
    "_source": AIC + "Qwen--Qwen3.5-397B-A17B_config.json",
    "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
    "text_config": {
        "model_type": "qwen3_5_moe_text", "num_hidden_layers": 60, "hidden_size": 4096,
        "moe_intermediate_size": 1024, "num_experts": 512, "num_experts_per_tok": 10,
        "shared_expert_intermediate_size": 1024, "num_attention_heads": 32,
        "num_key_value_heads": 2, "head_dim": 256,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 15,
        "full_attention_interval": 4, "linear_num_key_heads": 16,
        "linear_num_value_heads": 64, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "mamba_ssm_dtype": "float32", "attn_output_gate": True,
        "mlp_only_layers": [], "vocab_size": 248320, "dtype": "bfloat16",
    },
}

QWEN3_NEXT_80B = {
    "_source": "ai-dynamo/aiconfigurator@1b7cfb1:src/aiconfigurator/model_configs/"
               "Qwen--Qwen3-Next-80B-A3B-Thinking_config.json",
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
    "num_hidden_layers": 48, "hidden_size": 2048, "intermediate_size": 5120,
    "moe_intermediate_size": 512, "num_experts": 512, "num_experts_per_tok": 10,
    "shared_expert_intermediate_size": 512, "num_attention_heads": 16,
    "num_key_value_heads": 2, "head_dim": 256, "full_attention_interval": 4,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "mlp_only_layers": [], "decoder_sparse_step": 1,
    "use_sliding_window": False, "vocab_size": 151936, "torch_dtype": "bfloat16",
}

GPT_OSS_120B = {
    "_source": AIC + "openai--gpt-oss-120b_config.json",
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
    "num_hidden_layers": 36, "hidden_size": 2880, "intermediate_size": 2880,
    "num_local_experts": 128, "num_experts_per_tok": 4, "experts_per_token": 4,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
    "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * 18,
    "vocab_size": 201088, "quantization_config": {"quant_method": "mxfp4"},
}

MIXTRAL_8X7B = {
    "_source": AIC + "mistralai--Mixtral-8x7B-v0.1_config.json",
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
    "num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336,
    "num_local_experts": 8, "num_experts_per_tok": 2, "num_attention_heads": 32,
    "num_key_value_heads": 8, "sliding_window": None, "vocab_size": 32000,
    "torch_dtype": "bfloat16",
}

# GLM-4.5/4.6/4.7 (355B-A32B): ai-dynamo/aiconfigurator@19d098add98ab8ba2366c94795e9e886cdcc915c
# src/aiconfigurator/model_configs/zai-org--GLM-4.7-FP8_config.json
GLM45 = {
    "_source": "ai-dynamo/aiconfigurator@19d098a:src/aiconfigurator/model_configs/"
               "zai-org--GLM-4.7-FP8_config.json",
    "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
    "num_hidden_layers": 92, "first_k_dense_replace": 3, "hidden_size": 5120,
    "intermediate_size": 12288, "moe_intermediate_size": 1536, "n_routed_experts": 160,
    "num_experts_per_tok": 8, "n_shared_experts": 1, "num_attention_heads": 96,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151552,
    "torch_dtype": "bfloat16", "quantization_config": {"quant_method": "fp8"},
}

DEEPSEEK_V4_PRO = {
    "_source": AIC + "deepseek-ai--DeepSeek-V4-Pro_config.json",
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
    "num_hidden_layers": 61, "hidden_size": 7168, "moe_intermediate_size": 3072,
    "n_routed_experts": 384, "num_experts_per_tok": 6, "n_shared_experts": 1,
    "num_attention_heads": 128, "num_key_value_heads": 1, "head_dim": 512,
    "q_lora_rank": 1536, "qk_rope_head_dim": 64, "o_lora_rank": 1024, "o_groups": 16,
    "index_n_heads": 64, "index_head_dim": 128, "index_topk": 1024, "sliding_window": 128,
    # 61 layers and the MTP layer's 0 after them
    "compress_ratios": [128, 128] + [4, 128] * 29 + [4, 0],
    "vocab_size": 129280, "torch_dtype": "bfloat16", "expert_dtype": "fp4",
    "quantization_config": {"quant_method": "fp8"},
}

FAMILIES = {
    "deepseek_v3": DEEPSEEK_V3, "deepseek_v32": DEEPSEEK_V32, "kimi_k2": KIMI_K2,
    "qwen3_moe": QWEN3_30B, "qwen2_moe": QWEN15_MOE, "qwen3_next": QWEN3_NEXT_80B,
    "qwen3_5_moe": QWEN35_397B,
    "gpt_oss": GPT_OSS_120B, "mixtral": MIXTRAL_8X7B, "glm4_moe": GLM45,
    "deepseek_v4": DEEPSEEK_V4_PRO,
}


def write(config: dict, folder: Path, name: str = "config.json") -> Path:
    """``config`` as a ``config.json`` file in ``folder``."""
    path = Path(folder) / name
    path.write_text(json.dumps(config), encoding="utf-8")
    return path
