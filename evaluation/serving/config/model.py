"""Models for the step-time model (`ModelSpec`): layer counts, widths, attention and MoE
dimensions, weight and KV data types. The preset ``deepseek_v3`` is written from DeepSeek-V3's
``config.json`` and technical report (docs/serving-calibration.md, "Model"); any other model is
read from its Hugging Face ``config.json`` (`ModelSpec.from_hf_config`, `config.hf_config`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from eplb.errors import InputError
from eplb.evaluation.serving.config.attention import (
    AttentionLayers,
    gdn_layers,
    gqa_flops_per_pair,
    gqa_shapes,
)

# bytes per stored element: FP4 is MXFP4, 4 bits and one 8-bit scale per 32 (OCP MX spec)
DTYPE_BYTES = {"bf16": 2, "fp8": 1, "fp4": 0.53125}
ATTENTION = ("mla", "gqa", "dsv4")  # MLA (DeepSeek-V2/V3), GQA/MHA, DeepSeek-V4's compressed
# sizes far above any model's (the largest public MoE configs have ~100 layers, 512 experts,
# hidden 7168, vocabularies of ~250k): a config beyond them is a typo, and would allocate
# arrays of that size
LIMITS = {"num_layers": 4096, "num_experts": 65536, "top_k": 1024, "hidden": 1 << 20,
          "moe_intermediate": 1 << 22, "dense_intermediate": 1 << 22, "num_heads": 1 << 14,
          "vocab": 1 << 24, "shared_experts": 64, "shared_intermediate": 1 << 22}


@dataclass(frozen=True)
class ModelSpec:
    """A MoE transformer as the step-time model counts it. Widths in elements, counts per layer.

    Layers: ``num_layers``, of which ``dense_layers`` have a dense FFN of width
    ``dense_intermediate`` (the first ones, or the layers not in ``moe_layer_ids`` when that is
    given); the MoE layers have ``num_experts`` routed experts (top-``top_k``; ``num_groups``
    expert groups of which a token uses ``topk_groups``; 1 and 1 without groups) and
    ``shared_experts`` shared experts, routed experts of width ``moe_intermediate``, shared
    ones of ``shared_intermediate`` (0: ``moe_intermediate``); every FFN is SwiGLU.

    Attention (``attention``):

    - ``"mla"``: DeepSeek's multi-head latent attention, ``num_heads`` heads, ``q_lora_rank``
      (0: no query compression), ``kv_lora_rank``, ``qk_nope_dim``, ``qk_rope_dim``,
      ``v_head_dim``; with ``index_topk`` > 0 DeepSeek Sparse Attention (V3.2, GLM-5): an
      indexer of ``index_heads`` x ``index_head_dim`` picks ``index_topk`` keys per query.
    - ``"gqa"``: grouped-query (MHA when ``num_kv_heads == num_heads``) with ``head_dim``;
      ``attention_output_gate`` (Qwen3.5) doubles the query projection; ``sliding_layers`` of
      the layers attend to the last ``sliding_window`` tokens only; ``linear_layers`` are Gated
      DeltaNet layers (``linear_key_heads`` x ``linear_key_dim``, ``linear_value_heads`` x
      ``linear_value_dim``, state of ``linear_state_bytes`` per element) with no KV cache.
    - ``"dsv4"``: DeepSeek-V4: ``num_heads`` query heads on one shared key/value head of
      ``head_dim``, query LoRA ``q_lora_rank``, grouped output LoRA (``o_groups`` x
      ``o_lora_rank``), a ``sliding_window`` in every layer plus per layer
      (``compress_ratios``) no other keys (0), indexed top-``index_topk`` of the keys compressed
      x4, or all keys compressed x128.

    Data types: ``weight_dtype`` (attention, dense FFN, shared experts) and ``expert_dtype``
    (routed experts), each ``"bf16"``, ``"fp8"`` or ``"fp4"`` (MXFP4); the embedding and the
    output head are BF16; ``kv_cache_bytes`` per cached element.
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
    kv_cache_bytes: float = 2.0  # per element of the KV cache (BF16)
    attention: str = "mla"
    num_kv_heads: int = 0
    head_dim: int = 0
    attention_output_gate: bool = False
    sliding_window: int = 0
    sliding_layers: int = 0
    linear_layers: int = 0
    linear_key_heads: int = 0
    linear_value_heads: int = 0
    linear_key_dim: int = 0
    linear_value_dim: int = 0
    linear_state_bytes: float = 4.0  # FP32 recurrent state (Qwen3.5's ``mamba_ssm_dtype``)
    index_heads: int = 0
    index_head_dim: int = 0
    index_topk: int = 0
    compress_ratios: tuple[int, ...] = ()
    o_lora_rank: int = 0
    o_groups: int = 0
    shared_intermediate: int = 0
    moe_layer_ids: tuple[int, ...] = ()
    weight_dtype: str = "fp8"
    expert_dtype: str = "fp8"

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden", "moe_intermediate", "num_experts", "top_k",
                     "num_groups", "topk_groups", "num_heads", "vocab"):
            _positive(self, name)
        for name, top in LIMITS.items():
            if getattr(self, name) > top:
                raise InputError(f"model {self.name!r}: {name} {getattr(self, name):,} is over "
                                 f"{top:,}; is the config right?")
        for name in ("dense_intermediate", "shared_experts", "q_lora_rank", "kv_lora_rank",
                     "qk_nope_dim", "qk_rope_dim", "v_head_dim", "num_kv_heads", "head_dim",
                     "sliding_window", "sliding_layers", "linear_layers", "linear_key_heads",
                     "linear_value_heads", "linear_key_dim", "linear_value_dim", "index_heads",
                     "index_head_dim", "index_topk", "o_lora_rank", "o_groups",
                     "shared_intermediate"):
            _positive(self, name, zero=True)
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
        if self.top_k > self.num_experts:
            raise InputError(f"model {self.name!r}: top_k {self.top_k} is more than its "
                             f"{self.num_experts} experts")
        if self.dense_layers and not self.dense_intermediate:
            raise InputError(f"model {self.name!r}: {self.dense_layers} dense layers need "
                             "dense_intermediate > 0")
        for name in ("weight_dtype", "expert_dtype"):
            if getattr(self, name) not in DTYPE_BYTES:
                raise InputError(f"model {self.name!r}: {name} must be one of "
                                 f"{', '.join(DTYPE_BYTES)}, got {getattr(self, name)!r}")
        for name in ("kv_cache_bytes", "linear_state_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 8:
                raise InputError(f"model {self.name!r}: {name} must be bytes per element in "
                                 f"(0, 8], got {v!r}")
        self._check_layers()
        self._check_attention()

    def _check_layers(self) -> None:
        ids = self.moe_layer_ids
        if not isinstance(ids, tuple):
            object.__setattr__(self, "moe_layer_ids", ids := tuple(ids))
        if not ids:
            return
        ok = all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
        if not ok or list(ids) != sorted(set(ids)) or ids[0] < 0 or ids[-1] >= self.num_layers:
            raise InputError(f"model {self.name!r}: moe_layer_ids must be distinct increasing "
                             f"layer ids in 0..{self.num_layers - 1}, got {list(ids)[:8]}")
        if len(ids) != self.num_layers - self.dense_layers:
            raise InputError(f"model {self.name!r}: {len(ids)} moe_layer_ids but "
                             f"{self.num_layers} layers of which {self.dense_layers} dense")

    def _check_attention(self) -> None:
        kind = self.attention
        if kind not in ATTENTION:
            raise InputError(f"model {self.name!r}: attention must be one of "
                             f"{', '.join(ATTENTION)}, got {kind!r}")
        need = {
            "mla": ("kv_lora_rank", "qk_nope_dim", "qk_rope_dim", "v_head_dim"),
            "gqa": ("num_kv_heads", "head_dim"),
            "dsv4": ("head_dim", "q_lora_rank", "o_lora_rank", "o_groups", "sliding_window"),
        }[kind]
        for name in need:
            if not getattr(self, name):
                raise InputError(f"model {self.name!r}: {kind} attention needs {name} > 0")
        if kind == "gqa" and self.num_heads % self.num_kv_heads:
            raise InputError(f"model {self.name!r}: num_kv_heads {self.num_kv_heads} must "
                             f"divide num_heads {self.num_heads}")
        if self.sliding_layers and not self.sliding_window:
            raise InputError(f"model {self.name!r}: sliding_layers need sliding_window > 0")
        if kind != "gqa" and (self.sliding_layers or self.linear_layers):
            raise InputError(f"model {self.name!r}: sliding_layers and linear_layers are "
                             "GQA models' (attention 'gqa')")
        if self.sliding_layers + self.linear_layers > self.num_layers or (
                self.linear_layers == self.num_layers):
            raise InputError(f"model {self.name!r}: sliding_layers + linear_layers must be at "
                             "most num_layers, with one softmax-attention layer at least")
        if self.linear_layers and not (self.linear_key_heads and self.linear_value_heads
                                       and self.linear_key_dim and self.linear_value_dim):
            raise InputError(f"model {self.name!r}: linear_layers need linear_key_heads, "
                             "linear_value_heads, linear_key_dim and linear_value_dim > 0")
        if self.index_topk and not (self.index_heads and self.index_head_dim):
            raise InputError(f"model {self.name!r}: index_topk needs index_heads and "
                             "index_head_dim > 0")
        ratios = self.compress_ratios
        if not isinstance(ratios, tuple):
            object.__setattr__(self, "compress_ratios", ratios := tuple(ratios))
        if kind == "dsv4":
            if len(ratios) != self.num_layers or any(r not in (0, 4, 128) for r in ratios):
                raise InputError(f"model {self.name!r}: dsv4 attention needs compress_ratios, "
                                 f"one of 0, 4, 128 per layer ({self.num_layers}), got "
                                 f"{list(ratios)[:8]}")
            if 4 in ratios and not self.index_topk:
                raise InputError(f"model {self.name!r}: compress ratio 4 layers need an "
                                 "indexer (index_topk > 0)")
            if self.num_heads % self.o_groups:
                raise InputError(f"model {self.name!r}: o_groups {self.o_groups} must divide "
                                 f"num_heads {self.num_heads}")
        elif ratios:
            raise InputError(f"model {self.name!r}: compress_ratios are dsv4 attention's")

    # ------------------------------------------------------------------ counts
    @property
    def moe_layers(self) -> int:
        """MoE layers (the rows of a load matrix ``float[L, E]``)."""
        return self.num_layers - self.dense_layers

    @property
    def moe_layer_index(self) -> tuple[int, ...]:
        """Model layer ids of the MoE layers, in order (the dense ones first by default)."""
        return self.moe_layer_ids or tuple(range(self.dense_layers, self.num_layers))

    @property
    def mla_shapes(self) -> tuple[tuple[int, int], ...]:
        """``(N, K)`` of the MLA projection GEMMs per token: fused q_a + kv_a down projection,
        q_b up projection, kv_b up projection, output projection (DeepGEMM's table rows);
        without query compression (``q_lora_rank`` 0) the query is one projection of the
        hidden state."""
        h, heads = self.hidden, self.num_heads
        q = heads * (self.qk_nope_dim + self.qk_rope_dim)
        kv_a = self.kv_lora_rank + self.qk_rope_dim
        head = ((self.q_lora_rank + kv_a, h), (q, self.q_lora_rank)) if self.q_lora_rank \
            else ((kv_a, h), (q, h))
        return (
            *head,
            (heads * (self.qk_nope_dim + self.v_head_dim), self.kv_lora_rank),
            (h, heads * self.v_head_dim),
        )

    @property
    def attention_params(self) -> int:
        """Projection weights of one attention layer, averaged over the layer kinds (the MLA
        block's sum of ``N * K`` over `mla_shapes` for DeepSeek-V3)."""
        groups = self.attention_layers
        if len(groups) == 1:
            return groups[0].params
        return round(sum(g.layers * g.params for g in groups) / self.num_layers)

    @property
    def expert_params(self) -> int:
        """Weights of one routed expert: gate + up (``2I x H``) and down (``H x I``)."""
        return 3 * self.hidden * self.moe_intermediate

    @property
    def expert_bytes(self) -> float:
        """Bytes of one routed expert's weights (``expert_dtype``): what a migration moves."""
        return self.expert_params * DTYPE_BYTES[self.expert_dtype]

    @property
    def shared_width(self) -> int:
        """Width of one shared expert (``shared_intermediate``, else ``moe_intermediate``)."""
        return self.shared_intermediate or self.moe_intermediate

    @property
    def shared_params(self) -> int:
        """Weights of one shared expert."""
        return 3 * self.hidden * self.shared_width

    @property
    def dense_ffn_params(self) -> int:
        return 3 * self.hidden * self.dense_intermediate

    @cached_property
    def attention_layers(self) -> tuple[AttentionLayers, ...]:
        """The model's attention layers by kind (`config.attention.AttentionLayers`), their
        ``layers`` summing to ``num_layers``."""
        return _attention_layers(self)

    @property
    def prefill_flops_per_pair(self) -> int:
        """FLOPs per attended (query, key) pair in prefill, MLA computed as multi-head
        attention: ``2 * heads * (qk_dim + v_dim)`` (QK^T and PV); GQA ``4 * heads *
        head_dim``. (Full-attention layers; `attention_layers` has every kind's.)"""
        return int(self.attention_layers[0].prefill_flops)

    @property
    def decode_flops_per_pair(self) -> int:
        """FLOPs per (query token, cached token) pair in decode with the up-projections
        absorbed (FlashMLA): keys of ``kv_lora + rope`` and values of ``kv_lora`` per head;
        GQA as in prefill."""
        return int(self.attention_layers[0].decode_flops)

    @property
    def kv_bytes_per_token(self) -> float:
        """KV cache bytes per context token per layer, averaged over the layers (MLA: ``(kv_lora
        + rope) * kv_cache_bytes``), so ``kv_bytes_per_token * num_layers`` is a token's KV
        cache in every layer. Sliding-window layers hold at most a window per request and
        linear-attention layers a fixed state (`state_bytes_per_request`): neither grows with
        the context, neither is counted here."""
        groups = self.attention_layers
        if len(groups) == 1:
            return groups[0].kv_bytes_per_context_token
        total = sum(g.layers * g.kv_bytes_per_context_token for g in groups)
        return total / self.num_layers

    @property
    def state_bytes_per_request(self) -> float:
        """Bytes per request that do not grow with the context: linear-attention state and
        sliding windows (full), over every layer."""
        return float(sum(g.layers * (g.state_bytes + g.window * g.window_bytes)
                         for g in self.attention_layers))

    def weight_bytes_per_gpu(self, slots_per_gpu: int) -> float:
        """Weights one EP rank holds (bytes): attention, dense FFNs and shared experts at
        ``weight_dtype``, ``slots_per_gpu`` routed experts per MoE layer at ``expert_dtype``,
        BF16 embedding and output head."""
        w, e = DTYPE_BYTES[self.weight_dtype], DTYPE_BYTES[self.expert_dtype]
        attn = sum(g.layers * g.params for g in self.attention_layers)
        dense = (
            attn * w
            + self.dense_layers * self.dense_ffn_params * w
            + self.moe_layers * self.shared_experts * self.shared_params * w
            + self.moe_layers * slots_per_gpu * self.expert_params * e
        )
        return float(dense + 2 * 2 * self.vocab * self.hidden)

    def to_dict(self) -> dict:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}

    def assumptions(self) -> list[str]:
        """What the step-time model assumes or leaves out for this model, one sentence each
        (printed beside results on it)."""
        out = [f"weights {self.weight_dtype} (attention, dense, shared experts), routed experts "
               f"{self.expert_dtype}; KV cache {self.kv_cache_bytes:g} bytes per element; "
               "embedding and output head BF16"]
        if self.expert_dtype == "fp4":
            out.append("FP4 routed experts: 0.53 bytes per weight, math at the FP8 peak (W4A8); "
                       "no measured FP4 kernel table, so their curve is the roofline")
        for g in self.attention_layers:
            if g.state_bytes:
                out.append(f"{g.layers} Gated DeltaNet layers: cost from the chunked kernel's "
                           f"arithmetic (roofline); {g.state_bytes / 2**20:.1f} MiB of state per "
                           "request and layer, not in the KV-capacity tokens")
            elif g.window and not g.compress:
                out.append(f"{g.layers} {g.kind} layers: at most {g.window} keys per query; "
                           "their KV (one window per request) is not in the KV-capacity tokens")
            elif g.compress > 1 or g.topk:
                out.append(f"{g.layers} {g.kind} layers: each query attends to "
                           + (f"its last {g.window} keys and " if g.window else "")
                           + (f"the top {g.topk} of the keys" if g.topk else "all keys")
                           + (f" compressed x{g.compress}" if g.compress > 1 else "")
                           + ("; the indexer scores them all" if g.index_flops else ""))
        if self.attention == "dsv4":
            out.append("DeepSeek-V4: the KV compressor's projections, hyper-connections and the "
                       "attention sink are not counted")
        return out

    # ------------------------------------------------------------------ readers
    @classmethod
    def from_hf_config(cls, config: str | os.PathLike | Mapping, **overrides) -> ModelSpec:
        """The model a Hugging Face ``config.json`` (a path, or its parsed dict) describes
        (`config.hf_config.read`: the families supported and what is assumed for each);
        ``overrides``: `ModelSpec` fields to set instead (``kv_cache_bytes=1.0`` for an FP8 KV
        cache, ``weight_dtype="fp8"`` for weights quantised at load). One `InputError` naming
        the field for an unknown architecture or a missing field."""
        from eplb.evaluation.serving.config import hf_config

        return hf_config.read(config, **overrides)


def _positive(spec: ModelSpec, name: str, *, zero: bool = False) -> None:
    value = getattr(spec, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if zero else 1):
        raise InputError(
            f"model {spec.name!r}: {name} must be a {'non-negative' if zero else 'positive'} "
            f"integer, got {value!r}"
        )


def _attention_layers(m: ModelSpec) -> tuple[AttentionLayers, ...]:
    """`ModelSpec.attention_layers`: the layer kinds and their counts."""
    kvb = m.kv_cache_bytes
    if m.attention == "mla":
        h, qk = m.num_heads, m.qk_nope_dim + m.qk_rope_dim
        kv = (m.kv_lora_rank + m.qk_rope_dim) * kvb
        prefill = 2 * h * (qk + m.v_head_dim)
        decode = 2 * h * (2 * m.kv_lora_rank + m.qk_rope_dim)
        if not m.index_topk:
            return (AttentionLayers("mla", m.num_layers, m.mla_shapes, prefill, decode, kv),)
        # DeepSeek Sparse Attention: the indexer's q from the query latent (or the hidden
        # state), its k and per-head weights from the hidden state; FP8 keys with an FP32
        # scale each (DeepSeek-V3.2's indexer cache)
        ih, idim = m.index_heads, m.index_head_dim
        src = m.q_lora_rank or m.hidden
        shapes = (*m.mla_shapes, (ih * idim, src), (idim, m.hidden), (ih, m.hidden))
        return (AttentionLayers("mla + sparse indexer", m.num_layers, shapes, prefill, decode,
                                kv, topk=m.index_topk, index_flops=2 * ih * idim,
                                index_bytes=idim + 4),)
    if m.attention == "gqa":
        shapes = gqa_shapes(m.hidden, m.num_heads, m.num_kv_heads, m.head_dim,
                            output_gate=m.attention_output_gate)
        f = gqa_flops_per_pair(m.num_heads, m.head_dim)
        kv = 2 * m.num_kv_heads * m.head_dim * kvb
        mha = m.num_kv_heads == m.num_heads
        full = m.num_layers - m.sliding_layers - m.linear_layers
        out = [AttentionLayers("mha" if mha else "gqa", full, shapes, f, f, kv)] if full else []
        if m.sliding_layers:
            out.append(AttentionLayers(f"gqa, sliding window {m.sliding_window}",
                                       m.sliding_layers, shapes, f, f, kv,
                                       window=m.sliding_window, window_bytes=kv, compress=0))
        if m.linear_layers:
            out.append(gdn_layers(m.linear_layers, m.hidden, m.linear_key_heads,
                                  m.linear_value_heads, m.linear_key_dim, m.linear_value_dim,
                                  m.linear_state_bytes))
        return tuple(out)
    return _dsv4_layers(m)


def _dsv4_layers(m: ModelSpec) -> tuple[AttentionLayers, ...]:
    """DeepSeek-V4's layers by compress ratio: projections (q_a + the shared key/value, q_b,
    the grouped output LoRA and its up-projection; the indexer's on ratio-4 layers), FLOPs of
    ``4 * heads * head_dim`` per pair (one shared key/value head of ``head_dim``, as absorbed
    MLA), the window of uncompressed keys and the compressed ones (module docstring of
    `config.attention`). The KV compressor's own small projections, the attention sink and
    the hyper-connections' mixing are not counted."""
    h, heads, hd = m.hidden, m.num_heads, m.head_dim
    base = ((m.q_lora_rank + hd, h), (heads * hd, m.q_lora_rank),
            (m.o_lora_rank, heads * hd), (h, m.o_groups * m.o_lora_rank))
    f = gqa_flops_per_pair(heads, hd)
    kv = hd * m.kv_cache_bytes
    ih, idim = m.index_heads, m.index_head_dim
    index = ((ih * idim, m.q_lora_rank), (idim, h), (ih, h))
    out = []
    for ratio in (0, 4, 128):
        n = m.compress_ratios.count(ratio)
        if not n:
            continue
        if ratio == 0:
            out.append(AttentionLayers(f"window {m.sliding_window}", n, base, f, f, kv,
                                       window=m.sliding_window, window_bytes=kv, compress=0))
        elif ratio == 4:
            out.append(AttentionLayers("compressed x4, indexed", n, (*base, *index), f, f, kv,
                                       window=m.sliding_window, window_bytes=kv, compress=4,
                                       topk=m.index_topk, index_flops=2 * ih * idim,
                                       index_bytes=idim + 4))
        else:
            out.append(AttentionLayers("compressed x128", n, base, f, f, kv,
                                       window=m.sliding_window, window_bytes=kv, compress=128))
    return tuple(out)


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
_READ: dict[tuple, ModelSpec] = {}  # config.json files read, by (path, mtime, size)


def get_model(name: str | os.PathLike | Mapping | ModelSpec) -> ModelSpec:
    """The model ``name`` stands for: a preset name (`MODELS`), a path to a Hugging Face
    ``config.json`` (`ModelSpec.from_hf_config`; read once per version of the file), a parsed
    config dict, or a `ModelSpec` itself; `InputError` naming the presets otherwise."""
    if isinstance(name, ModelSpec):
        return name
    if isinstance(name, Mapping):
        return ModelSpec.from_hf_config(name)
    if isinstance(name, str) and name in MODELS:
        return MODELS[name]
    if isinstance(name, (str, os.PathLike)) and not isinstance(name, bool):
        path = Path(name)
        try:
            if path.is_dir() and (path / "config.json").is_file():  # a model's folder
                path = path / "config.json"
            st = path.stat() if path.is_file() else None
        except (OSError, ValueError):  # a name too long, a NUL byte
            st = None
        if st is not None:
            key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
            if key not in _READ:
                _READ[key] = ModelSpec.from_hf_config(path)
            return _READ[key]
    raise InputError(
        f"unknown model {str(name)[:200]!r}; use one of {', '.join(sorted(MODELS))} or the "
        "path of a Hugging Face config.json"
    )
