"""Broken policies `check_solver` must catch: each a correct base (``greedy``) with one of the
mistakes users make. ``BROKEN``: name -> `Broken` (the function, what it declares, what is
wrong). tests/test_check_solver_catches.py and scripts/check_solver_catches.py use them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from eplb import solvers
from eplb.errors import InfeasibleError
from eplb.placement import Placement

__all__ = ["BROKEN", "Broken"]


@dataclass(frozen=True)
class Broken:
    """A broken policy: ``fn(load, topology, ...)``, the ``check_solver`` keywords it runs
    with (its declared ``guarantees``...) and what is wrong with it."""

    fn: Callable[..., Any]
    wrong: str
    caught_by: str  # the property that must catch it
    kwargs: dict[str, Any] = field(default_factory=dict)


def _greedy(load, topology, num_groups=None):
    return solvers.get("greedy")(load, topology, num_groups=num_groups).phy2log.copy()


def always_infeasible(load, topology):
    raise InfeasibleError("cannot place this load")


def infeasible_on_ties(load, topology):
    rows = np.sort(load, 1)
    if (rows[:, 1:] == rows[:, :-1]).any():
        raise InfeasibleError("tied loads")
    return _greedy(load, topology)


def drops_from_layer_2(load, topology):
    out = _greedy(load, topology)
    E = load.shape[1]
    if E > 1:
        out[2:][out[2:] == E - 1] = 0  # expert E - 1 lost from the third layer on
    return out


def relabeled_junk(load, topology, *, previous=None):
    """Fine alone; with previous= claims to have placed against it and returns junk: the
    hottest experts packed onto the first GPUs, every spare slot to the coldest."""
    if previous is None:
        return _greedy(load, topology)
    L, E = load.shape
    order = np.argsort(-load, axis=1, kind="stable")
    P = topology.num_slots
    out = np.concatenate([order, np.repeat(order[:, -1:], P - E, axis=1)], axis=1)
    return Placement(out, E, topology, meta={"solver": {"relabeled": True}})


def duplicates(load, topology):
    """Declares no_duplicates; stacks every spare slot on expert 0 (duplicates on a GPU)."""
    L, E = load.shape
    P = topology.num_slots
    return np.broadcast_to(np.r_[np.zeros(P - E, np.int64), np.arange(E)], (L, P)).copy()


def breaks_contract(load, topology, *, num_groups=None):
    """Declares group_contract; places like greedy, ignoring the groups."""
    return _greedy(load, topology)


def scale_dependent(load, topology):
    """Treats loads under 1e-6 tokens as noise: a round robin then (valid, unbalanced)."""
    if load.max() < 1e-6:
        L, E = load.shape
        return np.broadcast_to(np.arange(topology.num_slots) % E, (L, topology.num_slots)).copy()
    return _greedy(load, topology)


def drops_an_expert(load, topology):
    out = _greedy(load, topology)
    E = load.shape[1]
    if E > 3:
        out[out == E - 1] = 0
    return out


def falls_back_anyway(load, topology, num_groups=None):
    """Declares the group contract, places globally and says it fell back, wherever."""
    out = _greedy(load, topology, num_groups)
    meta = {"solver": {"policy": "global", "fallback": "the contract cannot hold"}}
    return Placement(out, load.shape[1], topology, meta=meta)


def wrong_without_groups(load, topology, *, num_groups=None):
    """Right with ``num_groups``; without it (a default it never tested) drops an expert."""
    out = _greedy(load, topology, num_groups)
    E = load.shape[1]
    if num_groups is None and E > 1:
        out[out == E - 1] = 0
    return out


def wrong_on_survivors(load, topology):
    """Right on the clusters it was tried on; on one node of 4 or more GPUs (the flat node
    the survivors of a partly failed 2 x 3 or 2 x 2 cluster form) drops an expert."""
    out = _greedy(load, topology)
    E = load.shape[1]
    if topology.num_nodes == 1 and topology.gpus_per_node >= 4 and E > 1:
        out[out == E - 1] = 0
    return out


def absolute_threshold(load, topology):
    """Treats layers above 1e6 tokens as a measurement glitch: a round robin there."""
    out = _greedy(load, topology)
    L, E = load.shape
    big = load.sum(1) > 1e6
    out[big] = np.arange(topology.num_slots) % E
    return out


def stale_group_to_node(load, topology, *, num_groups=None):
    """Declares the group contract; places as ``hierarchical`` and then swaps the first two
    nodes' GPUs, leaving ``meta["solver"]["group_to_node"]`` as it was before the swap."""
    if num_groups is None:
        return _greedy(load, topology)
    p = solvers.get("hierarchical")(load, topology, num_groups=num_groups)
    out = p.phy2log.copy()
    if topology.num_nodes > 1:
        n = topology.gpus_per_node * topology.slots_per_gpu
        out[:, : 2 * n] = np.concatenate([out[:, n : 2 * n], out[:, :n]], axis=1)
    return Placement(out, load.shape[1], topology, meta=p.meta)


def keeps_live_layout(load, topology, *, num_groups=None, previous=None):
    """Declares the group contract; places as ``hierarchical``, but given a live placement
    keeps it (no moves), whether or not the live placement keeps the contract."""
    if previous is not None:
        return Placement(previous.phy2log.copy(), load.shape[1], topology,
                         meta={"solver": {"relabeled": True}})
    if num_groups is None:
        return _greedy(load, topology)
    return solvers.get("hierarchical")(load, topology, num_groups=num_groups)


def zero_duplicates_reported(load, topology):
    """Places as ``greedy`` (two replicas of an expert on a GPU where it must) and reports
    ``meta["solver"]["duplicates"] = 0`` all the same."""
    p = solvers.get("greedy")(load, topology)
    return Placement(p.phy2log, load.shape[1], topology, meta={"solver": {"duplicates": 0}})


def crashes_on_empty_slots(load, topology, *, previous=None):
    """Reads the live placement's replica counts with ``np.bincount`` per layer: a live
    placement with an empty slot (-1, as ``craft`` leaves or a failed GPU has) crashes it."""
    if previous is not None:
        for row in previous.phy2log:
            np.bincount(row, minlength=load.shape[1])
    return _greedy(load, topology)


def wrong_shape(load, topology):
    return _greedy(load, topology)[:, :-1]


def nondeterministic(load, topology):
    rng = np.random.default_rng()
    return np.stack([rng.permutation(r) for r in _greedy(load, topology)])


def half_integer(load, topology):
    return _greedy(load, topology) + 0.5


def mutates_load(load, topology):
    load[:] = 0  # writes into the caller's array
    return _greedy(load, topology)


BROKEN: dict[str, Broken] = {
    "always_infeasible": Broken(always_infeasible, "always raises InfeasibleError", "places"),
    "infeasible_on_ties": Broken(
        infeasible_on_ties, "raises InfeasibleError on tied loads", "places"
    ),
    "drops_from_layer_2": Broken(
        drops_from_layer_2, "drops an expert from the third layer on", "valid"
    ),
    "relabeled_junk": Broken(
        relabeled_junk, "sets meta relabeled and returns junk", "previous_relabels"
    ),
    "duplicates": Broken(
        duplicates,
        "duplicates on a GPU while declaring no_duplicates",
        "no_duplicates",
        {"guarantees": {"no_duplicates"}},
    ),
    "breaks_contract": Broken(
        breaks_contract,
        "ignores the groups while declaring group_contract",
        "group_contract",
        {"guarantees": {"group_contract"}},
    ),
    "falls_back_anyway": Broken(
        falls_back_anyway,
        "declares a fallback to the global policy where the group contract can hold",
        "group_contract",
        {"guarantees": {"group_contract"}},
    ),
    "scale_dependent": Broken(
        scale_dependent, "round robin for loads under 1e-6", "scale_invariant"
    ),
    "drops_an_expert": Broken(drops_an_expert, "drops an expert (more than 3 experts)", "valid"),
    "wrong_shape": Broken(wrong_shape, "returns one slot too few", "valid"),
    "wrong_without_groups": Broken(
        wrong_without_groups, "drops an expert when num_groups is None", "valid"
    ),
    "wrong_on_survivors": Broken(
        wrong_on_survivors,
        "drops an expert on one node of >= 4 GPUs (survivors of a partial failure)",
        "failed_gpus",
    ),
    "absolute_threshold": Broken(
        absolute_threshold, "round robin on layers above 1e6 tokens", "scale_invariant"
    ),
    "stale_group_to_node": Broken(
        stale_group_to_node,
        "swaps two nodes after reporting group_to_node",
        "meta",
        {"guarantees": {"group_contract"}},
    ),
    "keeps_live_layout": Broken(
        keeps_live_layout,
        "keeps a live placement that breaks the group contract it declares",
        "group_contract",
        {"guarantees": {"group_contract"}},
    ),
    "zero_duplicates_reported": Broken(
        zero_duplicates_reported, "reports duplicates 0 where it placed some", "meta"
    ),
    "crashes_on_empty_slots": Broken(
        crashes_on_empty_slots,
        "np.bincount on a live placement with empty slots (-1)",
        "previous_relabels",
    ),
    "nondeterministic": Broken(nondeterministic, "shuffles each call", "deterministic"),
    "half_integer": Broken(half_integer, "returns expert ids + 0.5", "valid"),
    "mutates_load": Broken(mutates_load, "writes into the load", "valid"),
}
