"""Issue 33, part 3: metadata that tells the truth. Each minimal input of the issue, and the
oracle `eplb.testing.meta.assert_meta_truthful` (what `check_solver`'s ``meta`` property runs)
on every policy, relabeled against live placements with empty slots."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eplb import Placement, Topology, solvers
from eplb.errors import InfeasibleError
from eplb.testing.meta import assert_meta_truthful
from eplb.testing.strategies import placements, problems

QUICK = settings(max_examples=10, deadline=None, derandomize=True, database=None)


def test_hierarchical_group_to_node_follows_the_relabel():
    """Issue 33: the placement was relabeled to ``[1, 0]`` (group 0 on node 1) while
    ``group_to_node`` stayed ``[[0, 1]]``."""
    topo = Topology(2, 1, 1)
    p = solvers.solve("hierarchical", [[1.0, 2.0]], topo, num_groups=2,
                      previous=Placement([[1, 0]], 2, topo))
    assert p.phy2log.tolist() == [[1, 0]]
    assert p.meta["solver"]["group_to_node"] == [[1, 0]]
    assert_meta_truthful(p, [[1.0, 2.0]])


def test_group_to_node_names_real_nodes_after_a_whole_node_failed():
    """With node 0 failed the survivors' node 0 is real node 1: ``group_to_node`` said 0."""
    load = np.array([[1.0, 2.0, 3.0, 4.0]])
    p = solvers.solve("hierarchical", load, Topology(3, 1, 2, failed_gpus=[0]), num_groups=2)
    nodes = p.meta["solver"]["group_to_node"][0]
    assert 0 not in nodes
    assert_meta_truthful(p, load)


def test_biased_counts_experts_on_every_gpu():
    """Issue 33: every expert on both GPUs, ``fully_replicated`` was 0."""
    p = solvers.solve("biased", [[2.0, 1.0]], Topology(1, 2, 3))
    assert p.meta["solver"]["fully_replicated"] == 2
    assert_meta_truthful(p, [[2.0, 1.0]])


@QUICK
@given(data=st.data(), relax=st.sampled_from([0.0, 0.3, 1.0]))
def test_relaxed_foreign_replicas_within_budget_after_relabel(data, relax):
    """Issue 33: at ``relax=0`` a relabel left ``foreign_replicas`` [2] against a budget of 0
    (home nodes not relabeled); and filling a node's free slots could add off-node replicas
    beyond the budget (``[[0, 0, 0, 0, 0, 0, 1, 2]]`` on 2 x 2 x 3 with 4 groups, relax 0.3:
    2 against 1). Every count is read off the placement."""
    load, topo, groups = data.draw(problems(max_layers=2, max_gpus_per_node=3))
    live = data.draw(placements(load, topo, empty_slots=None))
    for prev in (None, live):
        try:
            p = solvers.solve("relaxed", load, topo, num_groups=groups, relax=relax,
                              previous=prev)
        except InfeasibleError:
            continue
        assert_meta_truthful(p, load, previous=prev)
        info = p.meta["solver"]
        assert max(info.get("foreign_replicas", [0])) <= info.get("foreign_budget", 0)


def test_relaxed_fill_keeps_the_foreign_budget():
    load = np.array([[0.0, 0, 0, 0, 0, 0, 1, 2]])
    p = solvers.solve("relaxed", load, Topology(2, 2, 3), num_groups=4, relax=0.3)
    assert p.meta["solver"]["foreign_replicas"] == [1] and p.meta["solver"]["foreign_budget"] == 1
    assert_meta_truthful(p, load)


@pytest.mark.parametrize(
    ("info", "field"),
    [
        ({"duplicates": 0}, "duplicates"),
        ({"fully_replicated": 1}, "fully_replicated"),
        ({"group_to_node": [[1, 1]]}, "group_to_node"),
        ({"used_slots": [4]}, "used_slots"),
        ({"expert_slots_per_gpu": 1}, "expert_slots_per_gpu"),
        ({"objective_sum": 1.0}, "objective_sum"),
        ({"objective": [9.0]}, "objective"),
        ({"objective": [2.0], "bound": [2.0], "status": ["optimal"], "gap": [0.5]}, "gap"),
        ({"objective": [2.0], "bound": [1.0], "status": ["optimal"]}, "optimal"),
        ({"replicas_moved": [0], "replicas_moved_total": 0}, "replicas_moved"),
    ],
)
def test_the_oracle_names_each_false_field(info, field):
    """`assert_meta_truthful` on a placement whose meta lies about one field."""
    topo = Topology(2, 1, 2)
    p = Placement([[0, 0, 1, -1]], 2, topo, meta={"solver": info})  # GPU loads 2 and 1
    previous = Placement([[1, -1, 0, -1]], 2, topo)
    with pytest.raises(AssertionError, match=field):
        assert_meta_truthful(p, [[2.0, 1.0]], previous=previous)
    truth = {"duplicates": 1, "fully_replicated": 0, "group_to_node": [[0, 1]],
             "used_slots": [3], "expert_slots_per_gpu": 2, "objective_sum": 2.0,
             "objective": [2.0], "bound": [2.0], "gap": [0.0], "status": ["optimal"],
             "replicas_moved": [3], "replicas_moved_total": 3}
    assert_meta_truthful(Placement(p.phy2log, 2, topo, meta={"solver": truth}), [[2.0, 1.0]],
                         previous=previous)
