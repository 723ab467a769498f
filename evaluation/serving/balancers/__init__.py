"""Data-parallel balancers: which attention rank serves each request.

``serving.balancers.assign(name, requests, state, *, seed=0, commit=True, **options)``;
`available()`, `get(name)`, `register(name)`, `options(name)`. Registered: ``round_robin``,
``random``, ``least_requests``, ``least_tokens``, ``power_of_two``, ``cache_aware`` (SGLang
router), ``deepseek_prefill``, ``deepseek_decode`` (DeepSeek's published objectives). Inputs:
`RequestBatch` and `RankState` (see `evaluation.serving.balancers.state`).
"""

from eplb.evaluation.serving.balancers import cache_aware as _cache_aware  # noqa: F401
from eplb.evaluation.serving.balancers import deepseek as _deepseek  # noqa: F401
from eplb.evaluation.serving.balancers import simple as _simple  # noqa: F401
from eplb.evaluation.serving.balancers.registry import assign, available, get, options, register
from eplb.evaluation.serving.balancers.state import (
    PHASES,
    Ledger,
    RankState,
    RequestBatch,
    make_rng,
)

__all__ = [
    "PHASES",
    "Ledger",
    "RankState",
    "RequestBatch",
    "assign",
    "available",
    "get",
    "make_rng",
    "options",
    "register",
]
