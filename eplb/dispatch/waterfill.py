"""Waterfill: the shared expert as a balancing resource (SGLang PR #19290, "[DeepEP] Add
waterfill load balancing for shared expert dispatch", on the fusion of #20089). Each token's
shared-expert work becomes one extra DeepEP dispatch slot; the router's top-k picks are
unchanged, only the rank that runs the shared slot is chosen, the least-loaded ones first, so
that each rank's routed picks plus shared work fill up to a common waterline. `waterline` is
that rule on counts; `shipped` the shared-expert tokens it moves off their source rank
(docs/serving-calibration.md, "Waterfill")."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from eplb.dispatch.shared import SharedExpert

__all__ = ["Waterfill", "shipped", "waterline"]


@dataclass(frozen=True)
class Waterfill(SharedExpert):
    """``waterfill``: the shared tokens of all ranks poured by `waterline` onto the ranks'
    routed picks; `shipped` what moves."""

    name = "waterfill"
    pooled = True

    def split(self, routed, own):
        return waterline(routed, np.add.reduce(own))

    def shipped(self, share, own, nodes):
        return shipped(share, own, nodes)


def waterline(routed: np.ndarray, total: np.ndarray | float) -> np.ndarray:
    """``float64[..., G]``: shared-expert tokens each rank runs when ``total: float[...]`` of
    them (>= 0) are poured onto ranks whose routed picks are ``routed: float[..., G]`` (>= 0):
    rank ``g`` gets ``max(0, W - routed[g])`` with the level ``W`` set so the shares sum to
    ``total``. Hence ``max(routed + share) == max(W, max(routed))``, never above any other
    split of ``total`` (in particular the local one), and the shares sum to ``total``."""
    r = np.asarray(routed, dtype=np.float64)
    total = np.asarray(total, dtype=np.float64)
    s = np.sort(r, axis=-1)
    k = np.arange(1, r.shape[-1] + 1)
    level = (total[..., None] + np.cumsum(s, axis=-1)) / k  # W if the k lowest ranks fill
    # the k lowest fill iff their level reaches the k-th lowest load (a prefix of k's holds)
    n = np.maximum((level >= s).sum(-1), 1)
    w = np.take_along_axis(level, (n - 1)[..., None], -1)
    return np.maximum(w - r, 0.0)


def shipped(share: np.ndarray, own: np.ndarray, nodes: int):
    """Shared-expert tokens moved by the waterline: ``(out, inn, rd_out, rd_in)``, each
    ``float64[..., G]``: tokens a rank sends (``own - share`` where positive: each rank keeps
    its own tokens up to its share) and receives (``share - own`` where positive), and the
    parts that cross nodes (a node's surplus is first matched inside the node over NVLink;
    only its net surplus / deficit goes over RDMA, pro rata per GPU).

    Shape: ``share: float[..., G]`` from `waterline`; ``own: float[G]`` shared-expert tokens
    of each rank's own batch; ``nodes`` divides ``G``."""
    out = np.maximum(own - share, 0.0)
    inn = np.maximum(share - own, 0.0)
    if nodes <= 1:
        zero = np.zeros_like(out)
        return out, inn, zero, zero
    shape = out.shape[:-1] + (nodes, -1)
    o_n, i_n = out.reshape(shape), inn.reshape(shape)
    so, si = o_n.sum(-1, keepdims=True), i_n.sum(-1, keepdims=True)
    f_out = np.where(so > 0, np.maximum(so - si, 0.0) / np.where(so > 0, so, 1.0), 0.0)
    f_in = np.where(si > 0, np.maximum(si - so, 0.0) / np.where(si > 0, si, 1.0), 0.0)
    return out, inn, (o_n * f_out).reshape(out.shape), (i_n * f_in).reshape(inn.shape)
