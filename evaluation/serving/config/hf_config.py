"""A Hugging Face ``config.json`` read into a `ModelSpec` (`read`; `describe` also returns what
was assumed). Families (``model_type``; ``architectures`` when it is missing):

- MLA (DeepSeek-V2/V3/R1, V3.1, Kimi K2: ``deepseek_v2``, ``deepseek_v3``, ``kimi_k2``), with
  DeepSeek Sparse Attention (``deepseek_v32``, GLM-5 ``glm_moe_dsa``);
- GQA/MHA (Qwen1.5/Qwen2 MoE ``qwen2_moe``, Qwen3 MoE ``qwen3_moe``, GLM-4.5/4.6/4.7
  ``glm4_moe``, gpt-oss ``gpt_oss`` with its sliding-window layers, Mixtral ``mixtral``);
- hybrid linear + GQA (Qwen3-Next ``qwen3_next``, Qwen3.5 MoE ``qwen3_5_moe``, its fields
  under ``text_config``): Gated DeltaNet layers estimated from the kernel's arithmetic;
- DeepSeek-V4 (``deepseek_v4``): compressed and indexed attention with a sliding window.

Fields the cost depends on are required; a missing one, an unknown family or a quantisation
method this model does not know is one `InputError` naming the field. Fields whose absence has
a documented default in transformers (``n_group``, ``decoder_sparse_step``, ``head_dim``, ...)
take it, and `describe` says so. Data types: weights from ``quantization_config`` (``fp8``:
FP8 everywhere; ``mxfp4``: FP4 routed experts, the rest BF16) else ``torch_dtype``/``dtype``;
the KV cache is assumed BF16 (what config.json cannot say; override ``kv_cache_bytes``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from eplb.errors import InputError
from eplb.safeload import json_loads, read_text

MLA = ("deepseek_v2", "deepseek_v3", "kimi_k2", "deepseek_v32", "glm_moe_dsa")
GQA = ("qwen2_moe", "qwen3_moe", "glm4_moe", "gpt_oss", "mixtral")
HYBRID = ("qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text")
DSV4 = ("deepseek_v4",)
FAMILIES = (*MLA, *GQA, *HYBRID, *DSV4)
ARCHITECTURES = {  # architectures[0] -> model_type, where model_type is missing or a re-pack's
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "DeepseekV32ForCausalLM": "deepseek_v32",
    "DeepseekV4ForCausalLM": "deepseek_v4",
    "GlmMoeDsaForCausalLM": "glm_moe_dsa",
    "Glm4MoeForCausalLM": "glm4_moe",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Qwen3NextForCausalLM": "qwen3_next",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe",
    "GptOssForCausalLM": "gpt_oss",
    "MixtralForCausalLM": "mixtral",
}
TORCH_DTYPES = {"bfloat16": "bf16", "float16": "bf16", "float32": "bf16", "float8_e4m3fn": "fp8"}
STATE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0}


class _Fields:
    """A config's fields, each read once: `need` raises naming the field, `get` takes a
    default and records it when it was absent."""

    def __init__(self, data: Mapping, source: str) -> None:
        self.data, self.source, self.notes = data, source, []

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def need(self, *keys: str, why: str, kind=int):
        for key in keys:
            value = self.data.get(key)
            if value is not None:
                return self._typed(key, value, kind)
        names = " or ".join(repr(k) for k in keys)
        raise InputError(f"{self.source}: config.json has no {names} ({why}); give the model's "
                         "full config.json")

    def get(self, key: str, default, note: str | None = None, kind=int):
        value = self.data.get(key)
        if value is None:
            if note:
                self.notes.append(f"{key} absent: {note}")
            return default
        return self._typed(key, value, kind)

    def _typed(self, key: str, value, kind):
        if kind is int:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InputError(f"{self.source}: {key} must be a whole number >= 0, got "
                                 f"{value!r}")
        elif kind is list:
            if not isinstance(value, list):
                raise InputError(f"{self.source}: {key} must be a list, got {value!r}")
        elif kind is str:
            if not isinstance(value, str):
                raise InputError(f"{self.source}: {key} must be a string, got {value!r}")
        elif kind is bool and not isinstance(value, bool):
            raise InputError(f"{self.source}: {key} must be true or false, got {value!r}")
        return value


def read(config: str | os.PathLike | Mapping, **overrides) -> Any:
    """The `ModelSpec` of ``config`` (a ``config.json`` path or its parsed dict), with
    ``overrides`` (`ModelSpec` field names) set instead of what the file gives or implies."""
    return describe(config, **overrides)[0]


def describe(config: str | os.PathLike | Mapping, **overrides) -> tuple[Any, list[str]]:
    """``(spec, notes)``: `read`'s `ModelSpec` and what was assumed or not modelled."""
    from eplb.evaluation.serving.config.model import ModelSpec

    data, source = _load(config)
    f = _Fields(data, source)
    family = _family(f)
    kw: dict[str, Any] = dict(
        name=str(data.get("_name_or_path") or family),
        num_layers=f.need("num_hidden_layers", why="layers"),
        hidden=f.need("hidden_size", why="hidden size"),
        vocab=f.need("vocab_size", why="the output head"),
        num_heads=f.need("num_attention_heads", why="attention heads"),
    )
    if kw["num_layers"] < 1:
        raise InputError(f"{source}: num_hidden_layers must be >= 1, got {kw['num_layers']}")
    _moe(f, family, kw)
    _layers(f, family, kw)
    if family in MLA:
        _mla(f, kw)
    elif family in DSV4:
        _dsv4(f, kw)
    else:
        _gqa(f, family, kw)
    _dtypes(f, family, kw)
    if _fp8_kv(f.data.get("quantization_config")):
        kw["kv_cache_bytes"] = 1.0
        f.notes.append("KV cache FP8 (the quantization_config's KV cache scheme)")
    else:
        f.notes.append("KV cache assumed BF16 (2 bytes per element; config.json does not say "
                       "what the server uses): override kv_cache_bytes")
    known = {x.name for x in fields(ModelSpec)}
    bad = sorted(set(overrides) - known)
    if bad:
        raise InputError(f"unknown ModelSpec field {bad[0]!r}; fields: {', '.join(sorted(known))}")
    kw.update(overrides)
    try:
        spec = ModelSpec(**kw)
    except InputError as exc:
        raise InputError(f"{source}: {exc}") from None
    return spec, f.notes


# ------------------------------------------------------------------ pieces
def _load(config) -> tuple[Mapping, str]:
    """The config's fields (``text_config``'s over the top level's, for vision-language
    wrappers such as Qwen3.5) and a name for messages."""
    if isinstance(config, Mapping):
        data, source = config, "model config"
    elif isinstance(config, (str, os.PathLike)) and not isinstance(config, bool):
        path = Path(config)
        data = json_loads(read_text(path, "model config"), f"model config {path}")
        source = str(path)
    else:
        raise InputError(f"a model config must be a config.json path or a dict, got "
                         f"{type(config).__name__}")
    if not isinstance(data, Mapping):
        raise InputError(f"{source}: config.json must hold a JSON object, got "
                         f"{type(data).__name__}")
    text = data.get("text_config")
    if isinstance(text, Mapping):
        data = {**{k: v for k, v in data.items() if k != "text_config"}, **text}
    return data, source


def _family(f: _Fields) -> str:
    mt = f.data.get("model_type")
    arch = f.data.get("architectures")
    first = arch[0] if isinstance(arch, list) and arch and isinstance(arch[0], str) else None
    if mt not in FAMILIES and first in ARCHITECTURES:
        mt = ARCHITECTURES[first]
    if mt not in FAMILIES:
        shown = mt if mt is not None else first
        raise InputError(
            f"{f.source}: model_type {shown!r} is not a supported MoE architecture; supported: "
            f"{', '.join(FAMILIES)} (or architectures {', '.join(ARCHITECTURES)})"
        )
    return str(mt)


def _moe(f: _Fields, family: str, kw: dict) -> None:
    """Experts, top-k, groups, shared experts and the FFN widths."""
    experts = f.need("n_routed_experts", "num_experts", "num_local_experts",
                     why="routed experts: is this a MoE model?")
    if experts < 1:
        raise InputError(f"{f.source}: the model has no routed experts (a dense model); "
                         "expert balancing needs a MoE model")
    kw["num_experts"] = experts
    kw["top_k"] = f.need("num_experts_per_tok", "experts_per_token", why="experts per token")
    kw["num_groups"] = f.get("n_group", 1, "no expert groups (1 group)") or 1
    kw["topk_groups"] = f.get("topk_group", 1, "no group limit") or 1
    if family in ("mixtral", "gpt_oss"):  # one FFN width: the experts'
        kw["moe_intermediate"] = f.need("intermediate_size", why="the experts' width")
        kw["dense_intermediate"] = 0
    else:
        kw["moe_intermediate"] = f.need("moe_intermediate_size", why="the experts' width")
        kw["dense_intermediate"] = f.get("intermediate_size", 0)
    if family in ("qwen2_moe", *HYBRID):
        width = f.get("shared_expert_intermediate_size", 0, "no shared expert")
        kw["shared_experts"] = 1 if width else 0
        kw["shared_intermediate"] = 0 if width == kw["moe_intermediate"] else width
    elif family in ("qwen3_moe", "mixtral", "gpt_oss"):
        kw["shared_experts"], kw["shared_intermediate"] = 0, 0
    else:
        kw["shared_experts"] = f.get("n_shared_experts", 0, "no shared expert")
        kw["shared_intermediate"] = 0


def _layers(f: _Fields, family: str, kw: dict) -> None:
    """Which layers are MoE: DeepSeek's dense prefix (``first_k_dense_replace``, every
    ``moe_layer_freq``-th after it), Qwen's ``mlp_only_layers`` and ``decoder_sparse_step``;
    every layer otherwise."""
    L = kw["num_layers"]
    if family in MLA or family == "glm4_moe":
        k = f.get("first_k_dense_replace", 0, "no dense layers")
        freq = f.get("moe_layer_freq", 1) or 1
        ids = [i for i in range(L) if i >= k and i % freq == 0]
    elif family in ("qwen2_moe", "qwen3_moe", *HYBRID):
        dense = f.get("mlp_only_layers", [], kind=list)
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in dense):
            raise InputError(f"{f.source}: mlp_only_layers must list layer ids, got {dense!r}")
        step = f.get("decoder_sparse_step", 1) or 1
        ids = [i for i in range(L) if i not in dense and (i + 1) % step == 0]
    else:
        ids = list(range(L))
    if not ids:
        raise InputError(f"{f.source}: no layer is a MoE layer (first_k_dense_replace / "
                         "mlp_only_layers / decoder_sparse_step leave none)")
    kw["dense_layers"] = L - len(ids)
    kw["moe_layer_ids"] = () if ids == list(range(L - len(ids), L)) else tuple(ids)
    if kw["dense_layers"] and not kw["dense_intermediate"]:
        f.need("intermediate_size", why=f"the {kw['dense_layers']} dense layers' FFN width")


def _mla(f: _Fields, kw: dict) -> None:
    kw["q_lora_rank"] = f.get("q_lora_rank", 0, "no query compression")
    kw["kv_lora_rank"] = f.need("kv_lora_rank", why="MLA's KV latent")
    kw["qk_nope_dim"] = f.need("qk_nope_head_dim", why="MLA's head width")
    kw["qk_rope_dim"] = f.need("qk_rope_head_dim", why="MLA's RoPE width")
    kw["v_head_dim"] = f.need("v_head_dim", why="MLA's value width")
    if f.has("index_topk"):
        kw["index_topk"] = f.need("index_topk", why="sparse attention")
        kw["index_heads"] = f.need("index_n_heads", why="the sparse-attention indexer")
        kw["index_head_dim"] = f.need("index_head_dim", why="the sparse-attention indexer")
        f.notes.append("DeepSeek Sparse Attention: each query attends to index_topk keys; the "
                       "indexer scores every key (FP8 keys, one FP32 scale each, assumed)")


def _gqa(f: _Fields, family: str, kw: dict) -> None:
    heads, L = kw["num_heads"], kw["num_layers"]
    kw.update(q_lora_rank=0, kv_lora_rank=0, qk_nope_dim=0, qk_rope_dim=0, v_head_dim=0,
              attention="gqa")
    kw["num_kv_heads"] = f.get("num_key_value_heads", heads, "multi-head attention (KV "
                               "heads = attention heads)")
    kw["head_dim"] = f.get("head_dim", kw["hidden"] // heads, "head_dim = hidden / heads")
    types = f.get("layer_types", None, kind=list)
    if family in HYBRID:
        kw["attention_output_gate"] = f.get("attn_output_gate", True, kind=bool)
        if types is None:
            every = f.need("full_attention_interval", "layer_types",
                           why="which layers are linear attention")
            types = ["full_attention" if (i + 1) % every == 0 else "linear_attention"
                     for i in range(L)]
        kw["linear_layers"] = _count(f, types, "linear_attention", L)
        kw["linear_key_heads"] = f.need("linear_num_key_heads", why="linear attention")
        kw["linear_value_heads"] = f.need("linear_num_value_heads", why="linear attention")
        kw["linear_key_dim"] = f.need("linear_key_head_dim", why="linear attention")
        kw["linear_value_dim"] = f.need("linear_value_head_dim", why="linear attention")
        dt = f.get("mamba_ssm_dtype", "float32", "recurrent state assumed FP32", kind=str)
        if dt not in STATE_BYTES:
            raise InputError(f"{f.source}: mamba_ssm_dtype {dt!r} is not one of "
                             f"{', '.join(STATE_BYTES)}")
        kw["linear_state_bytes"] = STATE_BYTES[dt]
        f.notes.append(
            f"{kw['linear_layers']} of {L} layers are Gated DeltaNet (linear attention): their "
            "cost is estimated from the chunked kernel's arithmetic (roofline, no measured "
            "table); their recurrent state is per request, not in the KV-capacity tokens")
    window = f.get("sliding_window", 0) if (family in ("gpt_oss", "mixtral")
                                            or f.data.get("use_sliding_window")) else 0
    if window and types is not None and "sliding_attention" in types:
        kw["sliding_layers"] = _count(f, types, "sliding_attention", L)
    elif window and family == "mixtral":
        kw["sliding_layers"] = L  # Mistral's rule: every layer attends to the window
    elif window:  # Qwen: layers from max_window_layers on use the window
        first = f.get("max_window_layers", L)
        kw["sliding_layers"] = max(0, L - first)
    if kw.get("sliding_layers"):
        kw["sliding_window"] = window
        f.notes.append(f"{kw['sliding_layers']} of {L} layers attend to the last {window} "
                       "tokens only (their KV cache: one window per request)")
    if family == "gpt_oss":
        f.notes.append("gpt-oss attention sinks and biases are not counted (a few FLOPs per "
                       "head)")


def _dsv4(f: _Fields, kw: dict) -> None:
    L = kw["num_layers"]
    if f.get("num_key_value_heads", 1) != 1:
        raise InputError(f"{f.source}: num_key_value_heads {f.data['num_key_value_heads']} "
                         "is not DeepSeek-V4's single shared key/value head; this attention "
                         "kind is not modelled")
    kw.update(attention="dsv4", kv_lora_rank=0, qk_nope_dim=0, v_head_dim=0)
    kw["qk_rope_dim"] = f.get("qk_rope_head_dim", 0)
    kw["head_dim"] = f.need("head_dim", why="the shared key/value head")
    kw["q_lora_rank"] = f.need("q_lora_rank", why="the query LoRA")
    kw["o_lora_rank"] = f.need("o_lora_rank", why="the grouped output LoRA")
    kw["o_groups"] = f.need("o_groups", why="the grouped output LoRA")
    kw["sliding_window"] = f.need("sliding_window", why="the window of uncompressed keys")
    kw["index_topk"] = f.need("index_topk", why="the indexed compressed keys")
    kw["index_heads"] = f.need("index_n_heads", why="the indexer")
    kw["index_head_dim"] = f.need("index_head_dim", why="the indexer")
    ratios = f.need("compress_ratios", why="each layer's KV compression", kind=list)
    if len(ratios) < L:
        raise InputError(f"{f.source}: compress_ratios has {len(ratios)} entries for {L} "
                         "layers; give one per layer")
    kw["compress_ratios"] = tuple(ratios[:L])  # entries past num_hidden_layers: the MTP layers
    f.notes.append(
        "DeepSeek-V4 attention modelled as a window of the last sliding_window keys plus, per "
        "layer, the top index_topk of the keys compressed x4 (indexer over all of them) or "
        "every key compressed x128; the compressor's own projections, hyper-connections "
        "(hc_mult) and hash routing of the first layers are not counted")


def _count(f: _Fields, types: list, kind: str, L: int) -> int:
    if len(types) < L or not all(isinstance(t, str) for t in types[:L]):
        raise InputError(f"{f.source}: layer_types must name each of the {L} layers")
    known = {"full_attention", "sliding_attention", "linear_attention"}
    bad = [t for t in types[:L] if t not in known]
    if bad:
        raise InputError(f"{f.source}: layer_types entry {bad[0]!r} is not modelled; known: "
                         f"{', '.join(sorted(known))}")
    return sum(t == kind for t in types[:L])


def _dtypes(f: _Fields, family: str, kw: dict) -> None:
    """Weight data types from ``quantization_config`` else ``torch_dtype`` / ``dtype``."""
    q = f.data.get("quantization_config")
    expert_override = f.data.get("expert_dtype")  # DeepSeek-V4: "fp4" experts
    if isinstance(q, Mapping):
        method = q.get("quant_method")
        if method == "fp8":
            kw["weight_dtype"] = kw["expert_dtype"] = "fp8"
        elif method == "mxfp4":
            kw["weight_dtype"], kw["expert_dtype"] = "bf16", "fp4"
            f.notes.append("mxfp4: routed experts FP4 (math at the FP8 peak, W4A8), attention "
                           "and the rest BF16 (its modules_to_not_convert)")
        elif method in ("compressed-tensors", "modelopt") and _four_bit(q):
            kw["weight_dtype"] = kw["expert_dtype"] = _torch_dtype(f)
            kw["expert_dtype"] = "fp4"
            f.notes.append(f"{method}: 4-bit routed experts (counted as FP4 bytes, math at the "
                           "FP8 peak); attention and the rest assumed at torch_dtype")
        else:
            raise InputError(
                f"{f.source}: quantization_config.quant_method {method!r} is not modelled "
                "(fp8, mxfp4, and 4-bit compressed-tensors / modelopt are); drop "
                "quantization_config from a copy of config.json to model the unquantised "
                "weights, or set weight_dtype / expert_dtype"
            )
    else:
        kw["weight_dtype"] = kw["expert_dtype"] = _torch_dtype(f)
    if expert_override is not None:
        if expert_override not in ("fp4", "fp8", "bf16"):
            raise InputError(f"{f.source}: expert_dtype {expert_override!r} is not one of "
                             "fp4, fp8, bf16")
        kw["expert_dtype"] = expert_override


def _torch_dtype(f: _Fields) -> str:
    dt = f.data.get("torch_dtype", f.data.get("dtype"))
    if dt is None:
        f.notes.append("no torch_dtype: weights assumed BF16")
        return "bf16"
    if dt not in TORCH_DTYPES:
        raise InputError(f"{f.source}: torch_dtype {dt!r} is not one of "
                         f"{', '.join(TORCH_DTYPES)}")
    return TORCH_DTYPES[dt]


def _four_bit(q: Mapping) -> bool:
    """A quantisation config whose weights are 4-bit (``config_groups.*.weights.num_bits``,
    or a ``quant_algo`` naming FP4 / INT4)."""
    algo = str(q.get("quant_algo", "")).upper()
    if "FP4" in algo or "INT4" in algo or "W4" in algo:
        return True
    groups = q.get("config_groups")
    if isinstance(groups, Mapping):
        return any(isinstance(g, Mapping) and isinstance(g.get("weights"), Mapping)
                   and g["weights"].get("num_bits") == 4 for g in groups.values())
    return False


def _fp8_kv(q) -> bool:
    """A quantisation config that stores the KV cache in 8 bits (compressed-tensors'
    ``kv_cache_scheme``, modelopt's ``kv_cache_quant_algo``)."""
    if not isinstance(q, Mapping):
        return False
    scheme = q.get("kv_cache_scheme")
    if isinstance(scheme, Mapping) and scheme.get("num_bits") == 8:
        return True
    return str(q.get("kv_cache_quant_algo") or "").upper() in ("FP8", "INT8")
