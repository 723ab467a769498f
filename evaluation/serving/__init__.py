"""Serving components: hardware and model presets, the step-time model, cluster configs and
steady-state throughput (this helper's part; workloads, DP balancers and the KV store join
from the other serving branch).

- `evaluation.serving.hardware`: `Hardware` presets ``h800``, ``h100``, ``h200``.
- `evaluation.serving.model`: `ModelSpec` preset ``deepseek_v3``.
- `evaluation.serving.steptime`: `RankBatch`, `StepModel`, `step_time`, `StepTime`.
- `evaluation.serving.config`: `ClusterConfig` (+ `UnitConfig`, `EplbConfig`, `KVConfig`,
  `SLOConfig`, `RoutingConfig`) with TOML files and presets.
- `evaluation.serving.steady`: `steady_state`.
"""

from evaluation.serving.config import (
    ClusterConfig,
    EplbConfig,
    KVConfig,
    RoutingConfig,
    SLOConfig,
    UnitConfig,
)
from evaluation.serving.hardware import Hardware, KernelFit, get_hardware, h100, h200, h800
from evaluation.serving.model import ModelSpec, deepseek_v3, get_model
from evaluation.serving.steady import steady_state
from evaluation.serving.steptime import RankBatch, StepModel, StepTime, step_time

__all__ = [
    "ClusterConfig",
    "EplbConfig",
    "Hardware",
    "KVConfig",
    "KernelFit",
    "ModelSpec",
    "RankBatch",
    "RoutingConfig",
    "SLOConfig",
    "StepModel",
    "StepTime",
    "UnitConfig",
    "deepseek_v3",
    "get_hardware",
    "get_model",
    "h100",
    "h200",
    "h800",
    "steady_state",
    "step_time",
]
