"""``ilp_weighted``: the exact model with ``replica_share`` per layer (a MIP through OR-Tools'
SCIP), warm-started from ``greedy_weighted`` (or ``hierarchical`` with optimal shares), with a
proven bound. ``time_limit``: wall seconds for the whole solve (default: 10 wall seconds per
layer; SCIP has no deterministic clock). docs/solvers.md, "ilp and ilp_weighted".
"""

from __future__ import annotations

import time

import numpy as np

from eplb.placement import Placement
from eplb.solvers.analysis.bounds import lower_bound
from eplb.solvers.primitives.group_placement import contract_fallback
from eplb.solvers.primitives.ilp_layers import solve_layers, summary
from eplb.solvers.primitives.ilp_model import CPSAT_MAX_SEED, DEFAULT_DETERMINISTIC, LayerProblem
from eplb.solvers.primitives.shares import optimal_shares
from eplb.solvers.primitives.validation import (
    NonNegFloat,
    PositiveInt,
    Threads,
    check_groups,
    check_seed,
)
from eplb.solvers.primitives.warm_start import warm_start
from eplb.solvers.registry import register
from eplb.topology import Topology


@register(
    "ilp_weighted",
    guarantees=lambda o, topology, groups: {"group_contract"} if o["hierarchical"] else set(),
    needs_groups=lambda o: o["hierarchical"],
)
def ilp_weighted(
    load: np.ndarray,
    topology: Topology,
    *,
    num_groups: int | None = None,
    seed: int = 0,
    time_limit: float | None = None,
    hierarchical: bool = False,
    rdma_weight: NonNegFloat = 0.0,
    workers: PositiveInt | None = None,
    threads: Threads = 1,
    progress: bool | None = None,
) -> Placement:
    """Exact weighted model (slots and ``replica_share``) per layer of ``load: float64[L,
    E]`` (module docstring). ``time_limit``: wall seconds for the whole solve (default: 10
    wall seconds per layer). ``hierarchical``, ``rdma_weight``, ``workers``, ``threads`` as
    for ``ilp``. ``previous=`` is applied by `solvers.solve` (relabeling)."""
    start = time.time()
    L, E = load.shape
    seed = check_seed(seed, hi=CPSAT_MAX_SEED)
    groups = check_groups(num_groups, E, topology.num_nodes) if hierarchical else None
    why = contract_fallback(E, topology, groups) if hierarchical else None
    if why is not None:  # DeepSeek's rule: the global model, said so
        hierarchical, groups = False, None
    det = DEFAULT_DETERMINISTIC if time_limit is None else None
    warm, warm_name = warm_start(load, topology, groups, rdma_weight, weighted=True)
    lb = lower_bound(load, topology, num_groups=groups, hierarchical=hierarchical, weighted=True)
    problems = [
        LayerProblem(
            load[layer],
            topology,
            warm.phy2log[layer],
            warm_share=warm.replica_share[layer],
            bound=float(lb[layer]),
            hierarchical=hierarchical,
            num_groups=groups,
            weighted=True,
            rdma_weight=rdma_weight,
            deterministic_time=det,
            seed=seed,
            threads=threads,
        )
        for layer in range(L)
    ]
    results = solve_layers(
        problems,
        start=start,
        time_limit=time_limit,
        workers=workers,
        progress=progress,
        desc="ilp_weighted",
    )
    phy2log = np.stack([r.slots for r in results])
    share = np.stack(
        [r.share if r.share is not None else np.full(topology.num_slots, np.nan) for r in results]
    )
    if np.isnan(share).any():
        share, _ = optimal_shares(load, phy2log, topology)
    info = summary(results, hierarchical, warm_name, time_limit, None)
    info["weighted"] = True
    if why is not None:
        info.update(fallback=why, fallback_to="ilp_weighted")
    if rdma_weight:
        info["rdma_weight"] = rdma_weight
    return Placement(phy2log, E, topology, share, meta={"solver": info})
