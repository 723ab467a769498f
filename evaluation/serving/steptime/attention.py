"""Core attention (``a2``) per DP rank and micro-batch, from the model's attention layer kinds
(`config.attention.AttentionLayers`) and the hardware's attention figures, averaged over the
layers (the step-time model runs one attention stage per layer).

Prefill: the FLOPs of the pairs each kind attends to at the measured prefill-attention
throughput at the rank's effective prompt length (`Hardware.prefill_attention`, else
``fit.prefill_attention_tflops``), times ``fit.engine_efficiency``. Decode:
the longer of the FLOPs at the decode-attention throughput and the bytes read (cached keys,
indexer keys, recurrent state) at the decode-attention bandwidth. A batch gives sums over its
queries, so a window or top-k caps the pairs at ``tokens x window`` (each query sees at most
that many keys): exact when every query's context is past the cap or none is, an upper bound
in between."""

from __future__ import annotations

import numpy as np

from eplb.evaluation.serving.config.hardware import Hardware
from eplb.evaluation.serving.config.model import ModelSpec


class AttentionTime:
    """``a2`` of one micro-batch per rank (``float64[G]`` in, ``float64[G]`` out)."""

    def __init__(self, model: ModelSpec, hardware: Hardware) -> None:
        self.groups = [(g.layers / model.num_layers, g) for g in model.attention_layers]
        first = model.attention_layers[0]
        self.plain = len(self.groups) == 1 and first.plain
        self.prefill_flops, self.decode_flops = first.prefill_flops, first.decode_flops
        self.kv_bytes = first.kv_bytes
        self.prefill_tflops = hardware.fit.prefill_attention_tflops
        rows = hardware.prefill_attention  # (prompt tokens, TFLOPS) rows or ()
        # the length table in log2 of the prompt tokens, built once (every prefill step reads it)
        self.prefill_x = np.log2([r[0] for r in rows]) if rows else None
        self.prefill_y = np.array([r[1] for r in rows], dtype=np.float64) if rows else None
        self.engine = hardware.fit.engine_efficiency
        self.decode_tflops, self.decode_gbps = hardware.mla_decode_tflops, hardware.mla_decode_gbps

    def prefill(self, pairs: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """Seconds for ``pairs`` attended (query, key) pairs (as if every key were attended)
        of ``tokens`` query tokens, per rank."""
        rate = self._prefill_rate(pairs, tokens)
        if self.plain:
            return pairs * self.prefill_flops / rate
        flops = np.zeros_like(pairs, dtype=np.float64)
        for w, g in self.groups:
            main, win, idx = _pairs(g, pairs, tokens)
            flops += w * ((main + win) * g.prefill_flops + idx * g.index_flops
                          + tokens * g.token_flops)
        return flops / rate

    def _prefill_rate(self, pairs, tokens):
        """FLOP/s of prefill attention per rank: the table's TFLOPS interpolated in log2 of the
        effective prompt length ``2 x pairs / tokens`` (flat beyond its rows), else the
        constant; times the engine efficiency."""
        if self.prefill_x is None:
            return self.prefill_tflops * self.engine * 1e12
        tokens = np.asarray(tokens, dtype=np.float64)
        length = 2.0 * np.asarray(pairs, dtype=np.float64) / np.maximum(tokens, 1.0)
        tflops = np.interp(np.log2(np.maximum(length, 1.0)), self.prefill_x, self.prefill_y)
        return tflops * self.engine * 1e12

    def decode(self, pairs: np.ndarray, kv: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """Seconds for ``tokens`` query tokens attending ``pairs`` (query, cached key) pairs
        over ``kv`` cached keys (summed over the rank's requests), per rank."""
        if self.plain:
            return np.maximum(pairs * self.decode_flops / (self.decode_tflops * 1e12),
                              kv * self.kv_bytes / (self.decode_gbps * 1e9))
        requests = np.where(pairs > 0, tokens * kv / np.maximum(pairs, 1e-300), tokens)
        out = np.zeros_like(pairs, dtype=np.float64)
        for w, g in self.groups:
            main, win, idx = _pairs(g, pairs, tokens)
            flops = (main + win) * g.decode_flops + idx * g.index_flops + tokens * g.token_flops
            kmain, kwin, kidx = _pairs(g, kv, requests)
            moved = (kmain * g.kv_bytes + kwin * g.window_bytes + kidx * g.index_bytes
                     + requests * g.state_bytes)
            out += w * np.maximum(flops / (self.decode_tflops * 1e12),
                                  moved / (self.decode_gbps * 1e9))
        return out


def _pairs(g, total: np.ndarray, rows: np.ndarray):
    """``(main, window, scored)`` of ``total`` pairs (or keys) over ``rows`` queries (or
    requests) for layer kind ``g``: main keys ``total / compress`` capped at ``rows x topk``,
    window keys capped at ``rows x window``, the indexer's scored keys ``total / compress``."""
    zero = np.zeros_like(total, dtype=np.float64)
    scored = total / g.compress if g.compress else zero
    main = np.minimum(scored, rows * g.topk) if g.topk else scored
    win = np.minimum(total, rows * g.window) if g.window else zero
    return main, win, (scored if g.index_flops or g.index_bytes else zero)
