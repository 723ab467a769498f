"""Model presets for the step-time model (`ModelSpec`): layer counts, widths, MLA and MoE
dimensions; `deepseek_v3` from DeepSeek-V3's ``config.json`` and technical report
(docs/serving-calibration.md, "Model")."""

from __future__ import annotations

from dataclasses import dataclass

from eplb.errors import InputError


@dataclass(frozen=True)
class ModelSpec:
    """An MLA + MoE transformer (DeepSeek-V2/V3 family). Widths in elements, counts per layer.

    The first ``dense_layers`` layers have a dense FFN of width ``dense_intermediate``; the
    other ``num_layers - dense_layers`` are MoE layers with ``num_experts`` routed experts
    (top-``top_k``, ``num_groups`` expert groups of which a token uses ``topk_groups``) and
    ``shared_experts`` shared experts, each a SwiGLU FFN of width ``moe_intermediate``.
    """

    name: str
    num_layers: int
    dense_layers: int
    hidden: int
    dense_intermediate: int
    moe_intermediate: int
    num_experts: int
    top_k: int
    num_groups: int
    topk_groups: int
    shared_experts: int
    num_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_dim: int
    qk_rope_dim: int
    v_head_dim: int
    vocab: int
    kv_cache_bytes: float = 2.0  # per element of the latent KV cache (BF16)

    def __post_init__(self) -> None:
        for name in (
            "num_layers",
            "hidden",
            "dense_intermediate",
            "moe_intermediate",
            "num_experts",
            "top_k",
            "num_groups",
            "topk_groups",
            "num_heads",
            "q_lora_rank",
            "kv_lora_rank",
            "qk_nope_dim",
            "qk_rope_dim",
            "v_head_dim",
            "vocab",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(
                    f"model {self.name!r}: {name} must be a positive integer, got {value!r}"
                )
        if not 0 <= self.dense_layers < self.num_layers:
            raise InputError(
                f"model {self.name!r}: dense_layers must be in 0..num_layers-1, "
                f"got {self.dense_layers}"
            )
        if self.num_experts % self.num_groups or self.topk_groups > self.num_groups:
            raise InputError(
                f"model {self.name!r}: num_groups {self.num_groups} must divide "
                f"{self.num_experts} experts and be >= topk_groups"
            )

    # ------------------------------------------------------------------ counts
    @property
    def moe_layers(self) -> int:
        """MoE layers (the rows of a load matrix ``float[L, E]``)."""
        return self.num_layers - self.dense_layers

    @property
    def mla_shapes(self) -> tuple[tuple[int, int], ...]:
        """``(N, K)`` of the MLA projection GEMMs per token: fused q_a + kv_a down projection,
        q_b up projection, kv_b up projection, output projection (DeepGEMM's table rows)."""
        h, heads = self.hidden, self.num_heads
        return (
            (self.q_lora_rank + self.kv_lora_rank + self.qk_rope_dim, h),
            (heads * (self.qk_nope_dim + self.qk_rope_dim), self.q_lora_rank),
            (heads * (self.qk_nope_dim + self.v_head_dim), self.kv_lora_rank),
            (h, heads * self.v_head_dim),
        )

    @property
    def attention_params(self) -> int:
        """Weights of one MLA block (sum of ``N * K`` over `mla_shapes`)."""
        return sum(n * k for n, k in self.mla_shapes)

    @property
    def expert_params(self) -> int:
        """Weights of one routed or shared expert: gate + up (``2I x H``) and down (``H x I``)."""
        return 3 * self.hidden * self.moe_intermediate

    @property
    def dense_ffn_params(self) -> int:
        return 3 * self.hidden * self.dense_intermediate

    @property
    def prefill_flops_per_pair(self) -> int:
        """FLOPs per attended (query, key) pair in prefill, MLA computed as multi-head
        attention: ``2 * heads * (qk_dim + v_dim)`` (QK^T and PV)."""
        qk = self.qk_nope_dim + self.qk_rope_dim
        return 2 * self.num_heads * (qk + self.v_head_dim)

    @property
    def decode_flops_per_pair(self) -> int:
        """FLOPs per (query token, cached token) pair in decode with the up-projections
        absorbed (FlashMLA): keys of ``kv_lora + rope`` and values of ``kv_lora`` per head."""
        return 2 * self.num_heads * (2 * self.kv_lora_rank + self.qk_rope_dim)

    @property
    def kv_bytes_per_token(self) -> float:
        """Latent KV cache bytes per token per layer (``(kv_lora + rope) * kv_cache_bytes``)."""
        return (self.kv_lora_rank + self.qk_rope_dim) * self.kv_cache_bytes

    def weight_bytes_per_gpu(self, slots_per_gpu: int) -> float:
        """Weights one EP rank holds (bytes): FP8 attention, dense FFNs, shared experts and
        ``slots_per_gpu`` routed experts per MoE layer, BF16 embedding and output head."""
        fp8 = (
            self.num_layers * self.attention_params
            + self.dense_layers * self.dense_ffn_params
            + self.moe_layers * (self.shared_experts + slots_per_gpu) * self.expert_params
        )
        return float(fp8 + 2 * 2 * self.vocab * self.hidden)

    def to_dict(self) -> dict:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


# DeepSeek-V3 / R1 (config.json of deepseek-ai/DeepSeek-V3: num_hidden_layers 61,
# first_k_dense_replace 3, hidden_size 7168, intermediate_size 18432, moe_intermediate_size 2048,
# n_routed_experts 256, num_experts_per_tok 8, n_group 8, topk_group 4, n_shared_experts 1,
# num_attention_heads 128, q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128,
# qk_rope_head_dim 64, v_head_dim 128, vocab_size 129280). Latent KV cache in BF16 (Day-6:
# "BF16 for MLA").
deepseek_v3 = ModelSpec(
    name="deepseek_v3",
    num_layers=61,
    dense_layers=3,
    hidden=7168,
    dense_intermediate=18432,
    moe_intermediate=2048,
    num_experts=256,
    top_k=8,
    num_groups=8,
    topk_groups=4,
    shared_experts=1,
    num_heads=128,
    q_lora_rank=1536,
    kv_lora_rank=512,
    qk_nope_dim=128,
    qk_rope_dim=64,
    v_head_dim=128,
    vocab=129280,
)

MODELS: dict[str, ModelSpec] = {"deepseek_v3": deepseek_v3}


def get_model(name: str) -> ModelSpec:
    """The model preset called ``name``; `InputError` listing the presets otherwise."""
    try:
        return MODELS[name]
    except (KeyError, TypeError):
        raise InputError(
            f"unknown model {name!r}; use one of {', '.join(sorted(MODELS))}"
        ) from None
