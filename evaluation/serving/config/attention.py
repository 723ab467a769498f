"""The attention layers of a model as the step-time model counts them: one `AttentionLayers` per
kind of layer (MLA, GQA/MHA, sliding-window, sparse-indexed, compressed, linear), each with its
projection GEMMs, FLOPs per attended (query, key) pair, bytes per cached key and how many keys a
query attends to. `ModelSpec.attention_layers` builds them from a model's fields; the step-time
model's rank side (`steptime.attention`) turns them into seconds.

Keys a query at context ``c`` attends to in one layer: ``min(c, window)`` recent keys (the
window part, when ``window > 0``) plus ``c / compress`` main keys (when ``compress > 0``), at
most ``topk`` of them (when ``topk > 0``, an indexer picks them, scoring all ``c / compress``).
Full attention: ``window 0, compress 1, topk 0``. Units: FLOPs, bytes, tokens."""

from __future__ import annotations

from dataclasses import dataclass

GDN_CHUNK = 64  # tokens per chunk of the chunked Gated DeltaNet kernels (fla's chunk_size)


@dataclass(frozen=True)
class AttentionLayers:
    """``layers`` attention layers of one kind.

    - ``shapes``: the projection GEMMs ``(N, K)`` each token runs (in-projections, output);
    - ``prefill_flops`` / ``decode_flops``: FLOPs per attended (query, key) pair in prefill /
      in decode (MLA decode absorbs the up-projections, so the two differ);
    - ``kv_bytes``: cache bytes per main key (read in decode, stored per context token divided
      by ``compress``); ``window_bytes``: per window key;
    - ``window``, ``compress``, ``topk``: which keys a query attends to (module docstring);
    - ``index_flops`` / ``index_bytes``: the indexer's FLOPs per (query, scored key) pair and
      bytes per scored key (its own key cache), over ``c / compress`` keys;
    - ``token_flops``: FLOPs per token independent of the context (linear attention);
    - ``state_bytes``: bytes of recurrent state per request, read and written every decode
      step (linear attention).
    """

    kind: str
    layers: int
    shapes: tuple[tuple[int, int], ...]
    prefill_flops: float
    decode_flops: float
    kv_bytes: float
    window: int = 0
    window_bytes: float = 0.0
    compress: int = 1
    topk: int = 0
    index_flops: float = 0.0
    index_bytes: float = 0.0
    token_flops: float = 0.0
    state_bytes: float = 0.0

    @property
    def plain(self) -> bool:
        """Full attention over every cached key and nothing else (MLA, GQA, MHA)."""
        return (self.window == 0 and self.compress == 1 and self.topk == 0
                and not self.index_flops and not self.index_bytes and not self.token_flops
                and not self.state_bytes)

    @property
    def kv_bytes_per_context_token(self) -> float:
        """Cache bytes one layer stores per context token (main keys and the indexer's keys;
        a window holds at most ``window`` keys per request, not counted per token)."""
        if self.compress == 0:
            return 0.0
        if self.compress == 1:
            return self.kv_bytes + self.index_bytes
        return (self.kv_bytes + self.index_bytes) / self.compress

    @property
    def params(self) -> int:
        """Projection weights of one layer (sum of ``N * K``)."""
        return sum(n * k for n, k in self.shapes)


def gqa_shapes(hidden: int, heads: int, kv_heads: int, head_dim: int, *,
               output_gate: bool = False) -> tuple[tuple[int, int], ...]:
    """Fused QKV projection (the query twice as wide with an output gate, Qwen3.5's
    ``attn_output_gate``) and the output projection."""
    q = heads * head_dim * (2 if output_gate else 1)
    return ((q + 2 * kv_heads * head_dim, hidden), (hidden, heads * head_dim))


def gqa_flops_per_pair(heads: int, head_dim: int) -> int:
    """``QK^T`` and ``PV``: ``2 * head_dim`` FLOPs each per head and pair."""
    return 4 * heads * head_dim


def gdn_layers(layers: int, hidden: int, key_heads: int, value_heads: int, key_dim: int,
               value_dim: int, state_bytes: float) -> AttentionLayers:
    """Gated DeltaNet (linear attention, Qwen3-Next / Qwen3.5): in-projections of q, k, v, the
    gate z, and the per-head beta and alpha, the output projection; per token and value head
    ``6 * dk * dv`` FLOPs of state (apply to q and k, rank-1 update) and ``4 * C * (dk + dv)``
    of the intra-chunk terms (chunk ``C`` = `GDN_CHUNK`); a state of ``dk * dv`` per value
    head and request. An estimate of the chunked kernel's arithmetic, not a measurement."""
    qkvz = 2 * key_heads * key_dim + 2 * value_heads * value_dim
    shapes = ((qkvz, hidden), (2 * value_heads, hidden), (hidden, value_heads * value_dim))
    per_token = value_heads * (6 * key_dim * value_dim + 4 * GDN_CHUNK * (key_dim + value_dim))
    return AttentionLayers(
        "gated deltanet (linear)", layers, shapes, 0.0, 0.0, 0.0, compress=0,
        token_flops=float(per_token),
        state_bytes=float(value_heads * key_dim * value_dim * state_bytes),
    )
