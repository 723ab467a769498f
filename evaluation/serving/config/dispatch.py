"""A unit's dispatch settings: the ``[duplicate]`` block (`DuplicateConfig`), the checks of the
``dispatch`` and ``shared_expert`` names, and `unit_dispatch`, the registered `eplb.dispatch`
policy configured for one unit (``lp``'s solve seconds, ``duplicate``'s copies)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from eplb.dispatch import DISPATCH, SHARED_EXPERT, Dispatch, SharedExpert
from eplb.errors import InputError
from eplb.evaluation.serving.config.hardware import LP_OVERHEAD_S
from eplb.evaluation.serving.config.model import ModelSpec
from eplb.topology import Topology

__all__ = ["DUP_PLANNER_S", "DuplicateConfig", "check_dispatch", "check_shared_expert",
           "dispatch_names", "unit_dispatch"]

OVERLAP = ("none", "previous_layer")
# Planner seconds per MoE layer and micro-batch: UltraEP gives no planner time in its abstract;
# the default is DeepSeek LPLB's ~100 us on-GPU per-batch solve (README; issue #3), the nearest
# published figure for a per-layer, per-batch planner on the critical path.
DUP_PLANNER_S = 100e-6


def dispatch_names() -> tuple[str, ...]:
    """Every registered dispatch policy a unit may run, in the order the docs list them."""
    return tuple(DISPATCH.names())


def check_dispatch(value) -> Dispatch:
    """The registered `Dispatch` ``value`` names (any of `dispatch_names`), else one
    `InputError`."""
    if not isinstance(value, str) or value not in DISPATCH:
        raise InputError(
            f"unknown dispatch policy {value!r}; available: {', '.join(dispatch_names())}"
        )
    return DISPATCH[value]


def check_shared_expert(value, model: ModelSpec) -> SharedExpert:
    """The registered shared-expert policy ``value`` names, usable with ``model`` (a pooled
    policy needs a shared expert), else one `InputError` naming the field and the fix."""
    if not isinstance(value, str) or value not in SHARED_EXPERT:
        raise InputError(
            f"shared_expert must be one of {', '.join(map(repr, SHARED_EXPERT.names()))}, "
            f"got {value!r}"
        )
    policy = SHARED_EXPERT[value]
    if policy.pooled and model.shared_experts < 1:
        raise InputError(
            f"shared_expert {value!r} needs a model with a shared expert; "
            f"{model.name!r} has none: use shared_expert 'local'"
        )
    return policy


def _seconds(name: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf:
        raise InputError(f"duplicate.{name} must be a finite number >= 0, got {v!r}")
    return float(v)


@dataclass(frozen=True)
class DuplicateConfig:
    """Settings and costs of ``dispatch="duplicate"`` (TOML block ``[duplicate]``).

    - ``experts``: copies the planner may make per node, MoE layer and micro-batch (K; 0 turns
      duplication off and is refused with that dispatch). Assumption (not published): 8, one
      per GPU of an 8-GPU node.
    - ``hbm_gb``: spare HBM per GPU for copies (1e9 bytes), reserved from the KV cache; with
      ``overlap="previous_layer"`` two layers' copies are live at once (double buffer).
      Assumption (not published): 0.5 GB, 11 DeepSeek-V3 FP8 experts, 0.6% of an H800.
    - ``planner_s``: planner seconds per MoE layer and micro-batch (`DUP_PLANNER_S`).
    - ``overlap``: ``"none"`` (UltraEP: the plan and copy follow the gate, on the critical path)
      or ``"previous_layer"`` (weights prefetched during the previous layer on a predicted load,
      as the MoonEP-style prefetch the issue describes: only what exceeds one layer's time per
      micro-batch is exposed; an optimistic bound, the prediction is taken as exact).
    """

    experts: int = 8
    hbm_gb: float = 0.5
    planner_s: float = DUP_PLANNER_S
    overlap: str = "none"

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        k = self.experts
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
            raise InputError(
                f"duplicate.experts must be an integer >= 0 (copies per node, layer and "
                f"micro-batch), got {k!r}"
            )
        _seconds("hbm_gb", self.hbm_gb)
        _seconds("planner_s", self.planner_s)
        if self.overlap not in OVERLAP:
            raise InputError(
                f"duplicate.overlap must be one of {', '.join(map(repr, OVERLAP))}, "
                f"got {self.overlap!r}"
            )

    @property
    def buffers(self) -> int:
        """Layers whose copies are live at once (2 when prefetched under the previous one)."""
        return 2 if self.overlap == "previous_layer" else 1

    def copies_per_gpu(self, expert_bytes: float) -> int:
        """Copies one GPU may hold per layer within ``hbm_gb`` (``expert_bytes`` per copy)."""
        return int(self.hbm_gb * 1e9 // (expert_bytes * self.buffers))

    def check_usable(self, gpus_per_node: int, expert_bytes: float) -> None:
        """Refuse (one `InputError`) a unit that cannot duplicate: one GPU per node (no peer
        in the node to copy to), ``experts`` 0, or a budget below one copy."""
        if gpus_per_node < 2:
            raise InputError(
                "dispatch 'duplicate' copies experts to other GPUs of the same node; this unit "
                "has 1 GPU per node: use dispatch 'even' or 'lp', or more GPUs per node"
            )
        if self.experts < 1:
            raise InputError(
                "dispatch 'duplicate' with duplicate.experts = 0 makes no copies: set "
                "duplicate.experts >= 1 or use dispatch 'even'"
            )
        if self.copies_per_gpu(expert_bytes) < 1:
            need = expert_bytes * self.buffers / 1e9
            raise InputError(
                f"duplicate.hbm_gb = {self.hbm_gb} GB holds no expert copy ({need:.3f} GB each"
                f"{' x 2 buffers' if self.buffers == 2 else ''}): raise duplicate.hbm_gb to "
                f">= {need:.3f} or use dispatch 'even'"
            )

    def settings(self, expert_bytes: float, nvlink_gbps: float) -> dict:
        """The settings of `eplb.dispatch.Duplicate` on a unit whose experts take
        ``expert_bytes`` each and whose GPUs copy over NVLink at ``nvlink_gbps``."""
        return dict(experts=self.experts, cap=self.copies_per_gpu(expert_bytes),
                    planner_s=self.planner_s, copy_s=expert_bytes / (nvlink_gbps * 1e9),
                    prefetch=self.overlap == "previous_layer", hbm_gb=self.hbm_gb)


def unit_dispatch(
    name: str,
    topology: Topology,
    model: ModelSpec,
    *,
    lp_overhead_s: float = LP_OVERHEAD_S,
    duplicate: DuplicateConfig | None = None,
) -> Dispatch:
    """The dispatch policy ``name`` configured for a unit of ``topology`` running ``model``:
    ``lp`` with ``lp_overhead_s`` seconds per MoE layer and micro-batch on the critical path,
    ``duplicate`` with the copies ``duplicate`` (default `DuplicateConfig()`) allows; refuses
    (one `InputError`) an unknown name, bad settings or a unit that cannot run the policy."""
    policy = check_dispatch(name)
    dup = DuplicateConfig() if duplicate is None else duplicate
    if not isinstance(dup, DuplicateConfig):
        raise InputError(f"duplicate must be a DuplicateConfig, got {type(dup).__name__}")
    expert_bytes = float(model.expert_bytes)  # at the experts' data type (FP8: 1 B each)
    if policy.copies:
        dup.check_usable(topology.gpus_per_node, expert_bytes)
    if isinstance(lp_overhead_s, bool) or not isinstance(lp_overhead_s, (int, float)) or not (
        0 <= lp_overhead_s < float("inf")
    ):
        raise InputError(f"lp_overhead_s must be seconds >= 0, got {lp_overhead_s!r}")
    return policy.configure(solve_s=float(lp_overhead_s),
                            **dup.settings(expert_bytes, topology.nvlink_gbps))
