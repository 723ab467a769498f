"""Communication cost: the all-to-all of one micro-batch as per-GPU token copies per link class
(`Comm.links`) and the dispatch / combine seconds of the slowest GPU (`Comm.seconds`). Prefill:
DeepEP's normal kernels (NVLink / RDMA bytes over the effective bandwidths, the traffic model's
accounting); decode: the low-latency kernels, one copy per pick (docs/serving-calibration.md)."""

from __future__ import annotations

import numpy as np

from eplb.evaluation import traffic
from eplb.evaluation.serving.config.hardware import (
    BENCH_TOP_K,
    COMBINE_BYTES,
    DISPATCH_BYTES,
    Hardware,
)
from eplb.evaluation.serving.config.model import ModelSpec
from eplb.evaluation.serving.config.roofline import BENCH_HIDDEN
from eplb.topology import Topology


class Comm:
    """The all-to-all of one unit.

    Prefill: ``bw_nv``, ``bw_rd`` effective (dispatch, combine) bytes/s of NVLink and RDMA at
    the unit's EP size; decode: ``ll`` (dispatch, combine) seconds per pick of the low-latency
    kernels. ``v_bal`` / ``vn_bal``: probability that a token visits a GPU / a node under
    perfectly balanced routing (`traffic.visit_probability`).
    """

    def __init__(self, phase: str, topology: Topology, model: ModelSpec, hardware: Hardware):
        self.phase, self.topology, self.model = phase, topology, model
        G, N = topology.num_gpus, topology.num_nodes
        ep = np.log2(G)
        if phase == "prefill":
            rows = hardware.normal_a2a
            self.bw_nv = (rows[0][1] * 1e9, rows[0][2] * 1e9)
            multi = [r for r in rows if r[0] > rows[0][0]]
            xm = np.log2([r[0] for r in multi])
            self.bw_rd = (
                float(np.interp(ep, xm, [r[3] for r in multi])) * 1e9,
                float(np.interp(ep, xm, [r[4] for r in multi])) * 1e9,
            )
        else:
            # the table's calls move ll_tokens x top-8 picks of hidden 7168: seconds per pick,
            # scaled by the model's hidden size (bytes per pick)
            rows = hardware.ll_a2a
            x = np.log2([r[0] for r in rows])
            per_pick = hardware.ll_tokens * BENCH_TOP_K
            width = model.hidden / BENCH_HIDDEN
            self.ll = (
                float(np.interp(ep, x, [r[1] for r in rows])) / per_pick * width,
                float(np.interp(ep, x, [r[2] for r in rows])) / per_pick * width,
            )
        kw = dict(
            num_experts=model.num_experts,
            top_k=model.top_k,
            num_groups=model.num_groups,
            topk_groups=model.topk_groups,
        )
        self.v_bal = float(traffic.visit_probability(model.num_experts / G, **kw))
        self.vn_bal = float(traffic.visit_probability(model.num_experts / N, **kw))

    def balanced_visits(self, num_layers: int) -> tuple[np.ndarray, np.ndarray]:
        """``(float64[L, G], float64[L, N])`` visit probabilities under balanced routing."""
        topo = self.topology
        return (
            np.full((num_layers, topo.num_gpus), self.v_bal),
            np.full((num_layers, topo.num_nodes), self.vn_bal),
        )

    def links(self, src, recv, v, vn, report=None) -> list:
        """All-to-all links of one micro-batch: per link class ``(out, in, seconds per copy in
        dispatch, in combine)`` with ``out``, ``in: float[L, G]`` token copies a GPU sends in
        dispatch (its rank's tokens) and receives (its experts' share).

        Shape: ``src: float[G]`` tokens each rank sends; ``recv: float[L, G]`` picks each GPU
        receives; ``v: float[L, G]``, ``vn: float[L, N]`` visit probabilities (prefill);
        ``report``: a `traffic.TrafficReport` whose bytes replace ``v``/``vn`` (slow path).
        """
        m = self.model
        if self.phase == "decode":  # low-latency kernels: one copy per pick, no dedup
            out = np.broadcast_to(m.top_k * src, recv.shape)
            return [(out, recv, self.ll[0], self.ll[1])]
        if report is not None:  # bytes -> token copies
            per = m.hidden * DISPATCH_BYTES
            nv_out, nv_in = report.nvlink_out / per, report.nvlink_in / per
            rd_out, rd_in = report.rdma_out / per, report.rdma_in / per
        else:
            nv_out, nv_in, rd_out, rd_in = traffic.expected_copies(src, v, vn, self.topology)
        hd = m.hidden
        links = [
            (nv_out, nv_in, hd * DISPATCH_BYTES / self.bw_nv[0], hd * COMBINE_BYTES / self.bw_nv[1])
        ]
        if self.topology.num_nodes > 1:
            links.append(
                (
                    rd_out,
                    rd_in,
                    hd * DISPATCH_BYTES / self.bw_rd[0],
                    hd * COMBINE_BYTES / self.bw_rd[1],
                )
            )
        return links

    @staticmethod
    def seconds(links, reduce_out, reduce_in) -> tuple[np.ndarray, np.ndarray]:
        """Dispatch and combine seconds ``float64[L]`` of one micro-batch: the slowest link
        class, each at ``max(reduce_out(out), reduce_in(in))`` copies (reductions over GPUs)."""
        d = c = 0.0
        for out, inn, sd, sc in links:
            copies = np.maximum(reduce_out(out, axis=-1), reduce_in(inn, axis=-1))
            d = np.maximum(d, copies * sd)
            c = np.maximum(c, copies * sc)
        return d, c
