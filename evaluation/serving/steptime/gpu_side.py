"""GPU-side cost: each EP rank's routed-expert grouped GEMMs for the picks its slots receive
(DeepGEMM's grouped tables through `ExpertCurve`, or the roofline's `RooflineExpert`, as
`kernels.expert_curve` picks; `TabulatedCurve` on the hot path)."""

from __future__ import annotations

import numpy as np

from eplb.evaluation.serving.config.hardware import Hardware
from eplb.evaluation.serving.config.model import ModelSpec
from eplb.evaluation.serving.steptime.curves import TabulatedCurve
from eplb.evaluation.serving.steptime.kernels import expert_curve
from eplb.evaluation.serving.steptime.roofline import RooflineExpert
from eplb.evaluation.serving.steptime.routing import per_gpu
from eplb.topology import Topology


class GpuSide:
    """Routed-expert seconds of one unit's GPUs (``topology``, ``model``, ``hardware``).

    Shape: slot picks ``float[L, P]`` in, seconds per GPU ``float64[L, G]`` out.
    """

    def __init__(self, topology: Topology, model: ModelSpec, hardware: Hardware):
        self.topology, self.model = topology, model
        self.expert = expert_curve(hardware, model)

    @property
    def expert_table(self) -> TabulatedCurve | RooflineExpert:
        """The routed-expert curve as a `TabulatedCurve` (built on first use); a roofline
        curve is itself (as cheap as a table, and exact at its kinks, which a table is not)."""
        if isinstance(self.expert, RooflineExpert):
            return self.expert
        table = self.__dict__.get("_expert_table")
        if table is None:
            table = self.__dict__["_expert_table"] = TabulatedCurve(self.expert)
        return table

    def seconds(self, slot: np.ndarray) -> np.ndarray:
        """``float64[L, G]``: expert-GEMM seconds per GPU for ``slot: float[L, P]`` picks
        (exact curve)."""
        topo = self.topology
        L = slot.shape[0]
        return self.expert.seconds(slot).reshape(L, topo.num_gpus, topo.slots_per_gpu).sum(-1)

    def seconds_fast(self, slot: np.ndarray, tabulated: bool) -> np.ndarray:
        """`seconds` of ``slot: float64[L, P]`` by strided sums (the hot path), from
        `expert_table` when ``tabulated``."""
        curve = self.expert_table if tabulated else self.expert
        return per_gpu(curve.seconds(slot), self.topology.slots_per_gpu)

    def balanced(self, tokens: float) -> tuple[np.ndarray, np.ndarray]:
        """Perfectly balanced routing of ``tokens`` (one micro-batch, all ranks): expert-GEMM
        seconds and picks per GPU, both ``float64[L, G]``."""
        m, topo = self.model, self.topology
        L, G, S, K = m.moe_layers, topo.num_gpus, topo.slots_per_gpu, m.top_k
        recv = np.full((L, G), K * tokens / G)
        moe = np.full((L, G), S * float(self.expert.seconds(K * tokens / G / S)))
        return moe, recv
