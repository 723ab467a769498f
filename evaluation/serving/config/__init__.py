"""The cluster a serving run models: `ClusterConfig` and its blocks, with the cited presets
(`config.hardware`, `config.model`) and faults (`GpuFailure`)."""

from eplb.evaluation.serving.config.cluster import (
    DEFAULT_TOKEN_BUDGET,
    ClusterConfig,
    EplbConfig,
    KVConfig,
    RoutingConfig,
    SLOConfig,
    UnitConfig,
    kv_capacity_tokens,
)
from eplb.evaluation.serving.config.faults import GpuFailure

__all__ = [
    "DEFAULT_TOKEN_BUDGET",
    "ClusterConfig",
    "EplbConfig",
    "GpuFailure",
    "KVConfig",
    "RoutingConfig",
    "SLOConfig",
    "UnitConfig",
    "kv_capacity_tokens",
]
