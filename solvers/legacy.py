"""Old option spellings mapped to today's policies, so saved metadata and scripts keep running
with the same results (``greedy`` with ``weighted`` / ``rdma_weight`` / ``tolerance`` /
``migration_budget``; ``ilp`` with ``weighted``). docs/solvers.md, "Old spellings".
"""

from __future__ import annotations

from typing import Any

from eplb.errors import InputError
from eplb.solvers.primitives.validation import NonNegFloat, NonNegInt, check_option

LEGACY: dict[str, dict[str, Any]] = {
    "greedy": {
        "weighted": bool,
        "rdma_weight": NonNegFloat,
        "tolerance": NonNegFloat | None,
        "migration_budget": NonNegInt | None,
    },
    "ilp": {"weighted": bool},
}
_ILP_ONLY = ("duplicates", "counts", "max_vars")


def route(name: str, options: dict[str, Any], has_previous: bool) -> tuple[str, dict[str, Any]]:
    """``(policy name, options)`` for a call with old spellings; unchanged otherwise."""
    flags = LEGACY.get(name)
    if not flags or not (flags.keys() & options.keys()):
        return name, options
    opts = dict(options)
    old = {k: check_option(name, k, opts.pop(k), flags[k]) for k in list(opts) if k in flags}
    if name == "ilp":
        if not old.get("weighted"):
            return "ilp", opts
        for k in _ILP_ONLY:
            opts.pop(k, None)
        return "ilp_weighted", opts
    weighted = old.get("weighted", False)
    lam = old.get("rdma_weight", 0.0)
    tolerance, budget = old.get("tolerance"), old.get("migration_budget")
    if has_previous and (tolerance is not None or budget is not None):
        if weighted or lam > 0:
            raise InputError(
                "incremental repair (tolerance / migration_budget with previous=) supports the "
                "even-split greedy only; drop weighted / rdma_weight, or drop tolerance and "
                "migration_budget to solve afresh and relabel"
            )
        return "repair", {**opts, "tolerance": tolerance, "migration_budget": budget}
    if weighted:
        return "greedy_weighted", {**opts, "rdma_weight": lam}
    if lam > 0:
        return "greedy_traffic", {**opts, "rdma_weight": lam}
    return "greedy", opts
