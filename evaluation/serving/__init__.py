"""Serving layer: request workloads, DP balancers, prefix KV store (and, with the step-time
model and the simulator, what a placement is worth in TTFT / TPOT / tokens per second).

See docs/serving.md. Nothing outside ``evaluation.serving`` imports it.
"""

from evaluation.serving import balancers, workload
from evaluation.serving.balancers import RankState, RequestBatch
from evaluation.serving.kvcache import KVStore, RankCaches
from evaluation.serving.workload import Workload, rescale

__all__ = [
    "KVStore",
    "RankCaches",
    "RankState",
    "RequestBatch",
    "Workload",
    "balancers",
    "rescale",
    "workload",
]
