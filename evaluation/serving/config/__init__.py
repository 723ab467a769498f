"""The cluster a serving run models: `ClusterConfig` (`cluster`) built from the blocks of
`schema`, read and written as TOML (`toml`); a unit's dispatch policy and its settings
(`dispatch`: `DuplicateConfig`, `unit_dispatch`); the cited presets apart: clusters
(`presets`), GPUs (`hardware`), models (`model`); faults to inject (`faults`)."""

from eplb.evaluation.serving.config.cluster import ClusterConfig
from eplb.evaluation.serving.config.dispatch import DuplicateConfig
from eplb.evaluation.serving.config.faults import GpuFailure
from eplb.evaluation.serving.config.presets import kv_capacity_tokens
from eplb.evaluation.serving.config.schema import (
    DEFAULT_TOKEN_BUDGET,
    EplbConfig,
    EplbMode,
    InitialPlacement,
    KVConfig,
    RoutingConfig,
    SchedulerConfig,
    SLOConfig,
    UnitConfig,
)

__all__ = [
    "DEFAULT_TOKEN_BUDGET",
    "ClusterConfig",
    "DuplicateConfig",
    "EplbConfig",
    "EplbMode",
    "GpuFailure",
    "InitialPlacement",
    "KVConfig",
    "RoutingConfig",
    "SchedulerConfig",
    "SLOConfig",
    "UnitConfig",
    "kv_capacity_tokens",
]
