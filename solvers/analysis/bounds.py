"""Lower bounds on the largest GPU load per layer (`lower_bound`): what every solver is
measured against. The analytic bounds, the ballot LP (two slots per GPU), the group contract
and free shares; docs/solvers.md, "Lower bounds".
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np

from eplb.errors import InfeasibleError, InputError
from eplb.solvers.analysis.failures import surviving
from eplb.solvers.primitives import pairing, pairing_exact
from eplb.solvers.primitives.analytic_bounds import (
    EXACT_GROUPS,
    average_bound,
    flat_bound,
    subset_bounds,
)
from eplb.solvers.primitives.even_split import pack_even
from eplb.solvers.primitives.partitions import best_partitions
from eplb.solvers.primitives.replication import waterfill
from eplb.solvers.primitives.validation import (
    check_groups,
    check_num_groups,
    check_solver_load,
)
from eplb.topology import Topology

_CACHE: OrderedDict = OrderedDict()
_CACHE_SIZE = 16


def lp_bound(
    load: np.ndarray, num_gpus: int, slots_per_gpu: int, start: np.ndarray, *, rel_tol: float = 1e-4
) -> np.ndarray:
    """``float64[X]`` ballot-LP bound per row of ``load: float[X, E]``, bisecting above
    ``start: float[X]`` to a
    relative ``rel_tol`` (the result stays a valid bound: it is the largest target proven
    unreachable).

    The upper end of the search is a reachable value: the greedy's sorted pairing for
    ``S = 2``, else the even-split greedy's max load.
    """
    X, E = load.shape
    G, S = num_gpus, slots_per_gpu
    P = G * S
    if S == 2:
        counts = pairing.improve_counts(load, waterfill(load, P, G), G, distinct=False)
        upper = pairing.pair_objective(load, counts)
    else:
        upper = pack_even(load, G, S).gpu.max(1)
    cap = max(P - E + 1, 1)
    out = start.astype(np.float64).copy()
    for x in range(X):
        if upper[x] > out[x] * (1 + pairing_exact.CERT_TOL):
            out[x] = max(
                out[x],
                pairing_exact.lp_bound(
                    load[x], P, cap, out[x], upper[x], companions=S - 1, rel_tol=rel_tol
                ),
            )
    return out


def lower_bound(
    load,
    topology: Topology,
    *,
    num_groups: int | None = None,
    hierarchical: bool = False,
    weighted: bool = False,
    lp: bool | str = "auto",
) -> np.ndarray:
    """``float64[L]`` lower bound on the max GPU load of any placement of ``load: float[L, E]``.

    Even split by default; ``weighted=True`` allows free ``replica_share``. With
    ``hierarchical=True`` (needs ``num_groups``) the bound holds for placements that keep each
    group of ``E / num_groups`` consecutive experts on one node; otherwise ``num_groups`` is
    ignored and the bound holds for every placement. ``lp``: ``True``, ``False`` or ``"auto"``
    (the LP relaxation for two slots per GPU, where it is much tighter).
    """
    load = check_solver_load(load)
    if not isinstance(topology, Topology):
        raise InputError(f"topology must be a Topology, got {type(topology).__name__}")
    if not (isinstance(lp, (bool, np.bool_)) or (isinstance(lp, str) and lp == "auto")):
        raise InputError(f"lp must be True, False or 'auto', got {lp!r}")
    for name, flag in (("hierarchical", hierarchical), ("weighted", weighted)):
        if not isinstance(flag, (bool, np.bool_)):
            raise InputError(f"{name} must be True or False, got {flag!r}")
    # a grouping that cannot exist is refused even where the bound ignores it
    check_num_groups(num_groups, load.shape[1])
    if topology.failed_gpus:  # placements there are placements on the survivors: bound those
        topology = surviving(topology)[0]
    L, E = load.shape
    G, S, N, P = topology.num_gpus, topology.slots_per_gpu, topology.num_nodes, topology.num_slots
    if P < E:
        raise InfeasibleError(f"{P} slots cannot hold {E} experts")
    use_lp = (lp is True or (lp == "auto" and S == 2)) and not weighted
    key = (
        hashlib.sha1(load.tobytes()).hexdigest(),
        load.shape,
        topology,
        num_groups,
        bool(hierarchical),
        bool(weighted),
        use_lp,
    )
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key].copy()
    if hierarchical:
        groups = check_groups(num_groups, E, N)
        out = group_bound(load, topology, groups, weighted=weighted)
    elif weighted:
        out = average_bound(load, G)
    else:
        out = flat_bound(load, G, S)
        if use_lp:
            out = lp_bound(load, G, S, out)
    out.flags.writeable = False
    _CACHE[key] = out
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return out.copy()


def group_bound(load: np.ndarray, topology: Topology, num_groups: int, *, weighted=False):
    """``float64[L]`` bound for placements of ``load: float[L, E]`` keeping every group on one
    node."""
    N = topology.num_nodes
    L, E = load.shape
    M = E // num_groups
    if M > topology.gpus_per_node * topology.slots_per_gpu:
        raise InfeasibleError(
            f"a group of {M} experts does not fit in a node's "
            f"{topology.gpus_per_node * topology.slots_per_gpu} slots"
        )
    base = (
        average_bound(load, topology.num_gpus)
        if weighted
        else flat_bound(load, topology.num_gpus, topology.slots_per_gpu)
    )
    if num_groups <= EXACT_GROUPS:
        f = subset_bounds(load, topology, num_groups, weighted=weighted)
        part, _ = best_partitions(f, N)
        if not np.all(np.isfinite(part)):
            raise InfeasibleError(
                f"{num_groups} groups of {M} experts cannot be split over {N} nodes of "
                f"{topology.gpus_per_node * topology.slots_per_gpu} slots"
            )
        return np.maximum(base, part)
    # relaxation: every group alone on a node, and N + 1 heaviest groups -> two share a node
    gpn = topology.gpus_per_node
    gl = load.reshape(L, num_groups, M)
    single = (
        (
            average_bound(gl.reshape(-1, M), gpn)
            if weighted
            else flat_bound(gl.reshape(-1, M), gpn, topology.slots_per_gpu)
        )
        .reshape(L, num_groups)
        .max(1)
    )
    tot = -np.sort(-gl.sum(2), axis=1)
    n = np.arange(1, num_groups + 1)
    q = -(-n // N)
    cs = np.concatenate([np.zeros((L, 1)), np.cumsum(tot, axis=1)], axis=1)
    pig = (cs[:, n] - cs[:, n - q]).max(1) / gpn
    return np.maximum.reduce([base, single, pig])
