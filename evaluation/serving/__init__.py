"""Serving layer: what a placement is worth in TTFT / TPOT / tokens per second.

Wings: `workload` (request frames, readers, generators, the Day-6 mix), `kvcache` (prefix KV
store), `balancers` (DP balancers), `config` (`ClusterConfig`; cited hardware, model and
cluster presets), `steptime` (`StepModel`), `simulator` (`simulate`), `results` (`SimResult`,
plots, `steady_state`), `compare` (paired runs over seeds, closed-loop or counterfactual),
`capacity` (the largest rate within a goodput target), `advise` (what each balancing
lever buys on a dump) and `intervals` (confidence intervals);
their public names are here.
docs/serving.md and docs/serving-calibration.md explain them; of the library, only the CLI
imports this package."""

from eplb.evaluation.serving import balancers, workload
from eplb.evaluation.serving.advise import Advice, advise
from eplb.evaluation.serving.balancers import RankState, RequestBatch
from eplb.evaluation.serving.capacity import capacity, capacity_mix, capacity_table
from eplb.evaluation.serving.compare import compare, paired_table
from eplb.evaluation.serving.config import (
    ClusterConfig,
    EplbConfig,
    KVConfig,
    RoutingConfig,
    SchedulerConfig,
    SLOConfig,
    UnitConfig,
)
from eplb.evaluation.serving.config.faults import GpuFailure
from eplb.evaluation.serving.config.hardware import (
    Hardware,
    KernelFit,
    get_hardware,
    h100,
    h200,
    h800,
)
from eplb.evaluation.serving.config.model import ModelSpec, deepseek_v3, get_model
from eplb.evaluation.serving.intervals import ci_table, mean_ci
from eplb.evaluation.serving.kvcache import KVStore, RankCaches
from eplb.evaluation.serving.results.result import SimResult
from eplb.evaluation.serving.results.steady import steady_state
from eplb.evaluation.serving.simulator import simulate
from eplb.evaluation.serving.steptime import RankBatch, StepModel, StepTime, step_time
from eplb.evaluation.serving.workload import Workload, rescale

__all__ = [
    "Advice",
    "ClusterConfig",
    "EplbConfig",
    "GpuFailure",
    "Hardware",
    "KVConfig",
    "KVStore",
    "KernelFit",
    "ModelSpec",
    "RankBatch",
    "RankCaches",
    "RankState",
    "RequestBatch",
    "RoutingConfig",
    "SchedulerConfig",
    "SLOConfig",
    "SimResult",
    "StepModel",
    "StepTime",
    "UnitConfig",
    "Workload",
    "balancers",
    "advise",
    "capacity",
    "capacity_mix",
    "capacity_table",
    "ci_table",
    "compare",
    "deepseek_v3",
    "get_hardware",
    "get_model",
    "h100",
    "h200",
    "h800",
    "mean_ci",
    "paired_table",
    "rescale",
    "simulate",
    "steady_state",
    "step_time",
    "workload",
]
