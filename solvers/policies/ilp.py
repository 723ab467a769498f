"""``ilp``: the exact even-split model per layer (OR-Tools CP-SAT; the exact pairing method for
two slots per GPU), warm-started from the greedy the options ask for, with a proven bound.

``time_limit`` is wall seconds for the whole solve; ``deterministic_time`` (CP-SAT seconds per
layer) gives reproducible runs. Models: `solvers.primitives.ilp_model`; time, workers, progress
and ``meta["solver"]``: docs/solvers.md, "ilp and ilp_weighted".
"""

from __future__ import annotations

import time
from typing import Literal

import numpy as np

from eplb.errors import InfeasibleError, InputError
from eplb.moves import gpu_moves
from eplb.placement import Placement
from eplb.solvers.analysis.bounds import lower_bound
from eplb.solvers.primitives.group_placement import contract_fallback
from eplb.solvers.primitives.ilp_layers import solve_layers, summary
from eplb.solvers.primitives.ilp_model import (
    CPSAT_MAX_SEED,
    DEFAULT_DETERMINISTIC,
    LayerProblem,
)
from eplb.solvers.primitives.relabel import relabel
from eplb.solvers.primitives.validation import (
    NonNegFloat,
    NonNegInt,
    PositiveFloat,
    PositiveInt,
    Threads,
    check_groups,
    check_seed,
)
from eplb.solvers.primitives.warm_start import warm_start
from eplb.solvers.registry import register
from eplb.topology import Topology


@register(
    "ilp",
    guarantees=lambda o, topology, groups: (
        ({"group_contract"} if o["hierarchical"] else set())
        | (set() if o["duplicates"] else {"no_duplicates"})
    ),
    needs_groups=lambda o: o["hierarchical"],
)
def ilp(
    load: np.ndarray,
    topology: Topology,
    *,
    num_groups: int | None = None,
    previous: Placement | None = None,
    seed: int = 0,
    time_limit: float | None = None,
    hierarchical: bool = False,
    rdma_weight: NonNegFloat = 0.0,
    duplicates: bool = True,
    counts: Literal["auto", "free", "fixed"] = "auto",
    max_vars: PositiveInt = 40_000,
    migration_weight: NonNegFloat = 0.0,
    migration_budget: NonNegInt | None = None,
    deterministic_time: PositiveFloat | None = None,
    workers: PositiveInt | None = None,
    threads: Threads = 1,
    progress: bool | None = None,
) -> Placement:
    """Exact even-split model per layer of ``load: float64[L, E]`` (module docstring).

    ``time_limit``: wall seconds for the whole solve. ``deterministic_time``: CP-SAT
    deterministic seconds per layer (reproducible; default 10 without ``time_limit``).
    ``hierarchical``: keep every group of ``num_groups`` on one node. ``rdma_weight``: add
    the traffic term (`traffic_cost`). ``duplicates``: allow two replicas of an expert on a
    GPU (the exact problem; ``False`` restricts to distinct replicas). ``counts``: ``"auto"``,
    ``"free"`` (always the full count model) or ``"fixed"`` (the start's counts).
    ``migration_weight`` (tokens per moved replica) / ``migration_budget`` (moved replicas
    per layer): price or cap moves against ``previous`` (then the result is placed against
    it, not relabeled). ``workers``: processes; ``threads``: CP-SAT workers per layer.
    """
    start = time.time()
    L, E = load.shape
    S, N = topology.slots_per_gpu, topology.num_nodes
    seed = check_seed(seed, hi=CPSAT_MAX_SEED)
    migration = bool(migration_weight or migration_budget is not None)
    if migration and previous is None:
        raise InputError("migration_weight / migration_budget need previous= (the live placement)")
    groups = check_groups(num_groups, E, N) if hierarchical else None
    why = contract_fallback(E, topology, groups) if hierarchical else None
    if why is not None:  # DeepSeek's rule: the global model, said so
        hierarchical, groups = False, None
    det = deterministic_time
    if det is None and time_limit is None:
        det = DEFAULT_DETERMINISTIC
    warm, warm_name = warm_start(load, topology, groups, rdma_weight, weighted=False)
    if migration:  # the model prices moves: start from the warm start closest to previous
        warm = relabel(warm, previous)
    # without migration terms previous is not used here: solve() relabels the result, so
    # previous changes nothing but labels
    duplicates = bool(duplicates) or E < S  # fewer experts than slots: duplicates are forced
    pairing_ok = S == 2 and duplicates and not (hierarchical or rdma_weight or migration)
    # the pairing method certifies with its own LP; the analytic bound needs no LP then. A
    # live placement with empty slots is a candidate too: only the closed-form bounds, which
    # hold for any number of used slots, certify then
    partial = migration and bool((previous.phy2log < 0).any())
    lb = lower_bound(
        load,
        topology,
        num_groups=groups,
        hierarchical=hierarchical,
        lp=False if pairing_ok or partial else "auto",
    )
    problems = [
        LayerProblem(
            load[layer],
            topology,
            warm.phy2log[layer],
            bound=float(lb[layer]),
            hierarchical=hierarchical,
            num_groups=groups,
            rdma_weight=rdma_weight,
            duplicates=duplicates,
            counts=counts,
            max_vars=max_vars,
            migration_weight=migration_weight,
            migration_budget=migration_budget,
            previous=previous.phy2log[layer] if migration else None,
            pairing=pairing_ok,
            deterministic_time=det,
            seed=seed,
            threads=threads,
        )
        for layer in range(L)
    ]
    results = solve_layers(
        problems, start=start, time_limit=time_limit, workers=workers, progress=progress, desc="ilp"
    )
    if migration_budget is not None:
        _check_budget(results, previous, migration_budget, hierarchical)
    info = summary(results, hierarchical, warm_name, time_limit, det)
    if why is not None:
        info.update(fallback=why, fallback_to="ilp")
    if rdma_weight:
        info["rdma_weight"] = rdma_weight
    if migration:
        info["relabeled"] = True  # placed against previous: solve() must not relabel
    phy2log = np.stack([r.slots for r in results])
    return Placement(phy2log, E, topology, meta={"solver": info})


def _check_budget(results, previous: Placement, budget: int, hierarchical: bool) -> None:
    """Every layer within ``budget`` moved replicas of ``previous`` (`eplb.moves`), or an
    `InfeasibleError` naming the first that is not: the live placement, which moves nothing,
    is outside the model's class there (it breaks the group contract)."""
    G = previous.topology.num_gpus
    for layer, r in enumerate(results):
        moved = int(gpu_moves(previous.phy2log[layer][None], r.slots[None], G).sum())
        if moved > budget:
            why = " (the live placement breaks the group contract)" if hierarchical else ""
            raise InfeasibleError(
                f"layer {layer}: no placement within migration_budget={budget} moved replicas "
                f"was found{why}; the best found moves {moved}: raise migration_budget"
                + (" or drop hierarchical" if hierarchical else "")
            )

