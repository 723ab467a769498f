"""`eplb.testing` itself: the assertions, the strategies, and `check_solver` catching broken
policies with shrunk counterexamples; the docs' five-line example runs."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings

from eplb import Placement, Topology, solvers
from eplb.errors import InfeasibleError
from eplb.testing import assert_valid_placement, check_solver
from eplb.testing import strategies as est

DOCS = Path(__file__).resolve().parents[1] / "docs" / "solvers.md"


def _round_robin(load, topology):
    L, E = load.shape
    return np.broadcast_to(np.arange(topology.num_slots) % E, (L, topology.num_slots)).copy()


def test_assert_valid_placement_names_the_problem():
    topo = Topology(2, 1, 2)
    p = Placement([[0, 0, 1, 2]], 3, topo)
    assert_valid_placement(p, [[1.0, 2.0, 3.0]])
    with pytest.raises(AssertionError, match="layer 0: GPU 0 holds 2 replicas of expert 0"):
        assert_valid_placement(p, no_duplicates=True)
    with pytest.raises(AssertionError, match="group 0 .* on nodes \\[0, 1\\]"):
        assert_valid_placement(Placement([[0, 2, 1, 3]], 4, topo), group_contract=2)
    assert_valid_placement(Placement([[0, 1, 2, 3]], 4, topo), group_contract=2)
    with pytest.raises(AssertionError, match="load has shape"):
        assert_valid_placement(p, np.ones((1, 4)))
    with pytest.raises(AssertionError, match="expected a Placement"):
        assert_valid_placement(p.phy2log)


@settings(max_examples=30, deadline=None)
@given(est.problems(), est.token_routing(layers=2, experts=8, top_k=3, num_groups=4, topk_groups=2))
def test_strategies_make_valid_problems(problem, routing):
    load, topo, groups = problem
    L, E = load.shape
    assert topo.num_slots >= E and E % groups == 0 and groups % topo.num_nodes == 0
    assert np.isfinite(load).all() and (load >= 0).all()
    ids, rank = routing
    assert ids.shape[1:] == (2, 3) and rank.shape == (ids.shape[0],)
    srt = np.sort(ids, axis=2)
    assert not (srt[..., 1:] == srt[..., :-1]).any()  # distinct experts per token
    assert np.unique(ids // 2, axis=None).size <= 4
    assert all(
        len(set((ids[n, layer] // 2).tolist())) <= 2
        for n in range(ids.shape[0])
        for layer in range(2)
    )  # at most topk_groups groups per token


@settings(max_examples=10, deadline=None)
@given(est.problems().flatmap(lambda pr: est.placements(pr[0], pr[1])))
def test_random_placements_are_valid(p):
    assert_valid_placement(p)


def test_a_correct_plain_function_passes():
    report = check_solver(_round_robin, max_examples=10)
    assert report.ok
    assert set(report.passed) == {
        "places",
        "valid",
        "deterministic",
        "lower_bound",
        "scale_invariant",
        "previous_relabels",
        "meta",
        "failed_gpus",
        "bad_input",
    }
    assert set(report.skipped) == {"no_duplicates", "group_contract"}  # not declared
    assert report.refusals == {"examples": report.refusals["examples"], "refused": 0,
                               "declared": 0}
    assert not any(n.startswith("_check_") for n in solvers.available())  # cleaned up


def test_round_robin_declaring_no_duplicates_passes():
    """Issue 37: round robin keeps ``no_duplicates`` wherever a placement can (a GPU's slots
    at most the experts); the checker does not ask it where no slot-filling placement can
    (1 expert, 2 slots on 1 GPU), and a policy may refuse there."""
    from eplb.testing.check import duplicates_avoidable

    report = check_solver(_round_robin, guarantees={"no_duplicates"}, max_examples=10)
    assert report.ok and "no_duplicates" in report.passed
    assert not duplicates_avoidable(Topology(1, 1, 2), 1)
    assert duplicates_avoidable(Topology(1, 1, 2), 2)

    def refuses_where_duplicates_are_forced(load, topology):
        if not duplicates_avoidable(topology, load.shape[1]):
            raise InfeasibleError("every GPU would hold two replicas of an expert")
        return _round_robin(load, topology)

    report = check_solver(refuses_where_duplicates_are_forced, guarantees={"no_duplicates"},
                          max_examples=10)
    assert report.ok and report.refusals["refused"] == report.refusals["declared"] >= 1


def test_broken_policies_are_caught_with_shrunk_counterexamples():
    def crashes_on_many_experts(load, topology):
        if load.shape[1] > 3:
            raise IndexError("boom")
        return _round_robin(load, topology)

    report = check_solver(crashes_on_many_experts, max_examples=30, raise_on_failure=False)
    fail = {f.prop: f for f in report.failures}
    assert "IndexError: boom" in fail["valid"].error
    # the shrunk counterexample is as small as the failure allows: one layer, four experts
    rows = re.findall(r"load=\[\[(.*?)\]\]", fail["valid"].example)[0].split("],")
    assert len(rows) == 1 and len(rows[0].split(",")) == 4

    def random_each_call(load, topology):
        rng = np.random.default_rng()
        return np.stack([rng.permutation(r) for r in _round_robin(load, topology)])

    report = check_solver(random_each_call, max_examples=20, raise_on_failure=False)
    assert "deterministic" in {f.prop for f in report.failures}

    def worse_with_previous(load, topology, *, previous=None):
        out = _round_robin(load, topology)
        if previous is not None:  # piles every spare slot onto expert 0
            out[:, load.shape[1] :] = 0
        return out

    report = check_solver(worse_with_previous, max_examples=30, raise_on_failure=False)
    assert [f.prop for f in report.failures] == ["previous_relabels"]

    def invalid(load, topology):
        return np.zeros((load.shape[0], topology.num_slots), dtype=np.int64)

    with pytest.raises(AssertionError, match="valid: PlacementError"):
        check_solver(invalid, max_examples=5)


def test_problems_have_one_to_five_layers_and_failed_gpus():
    seen_layers, failed = set(), 0

    @settings(max_examples=80, deadline=None, derandomize=True, database=None)
    @given(est.problems(max_layers=5, failures=True))
    def collect(problem):
        nonlocal failed
        load, topo, groups = problem
        seen_layers.add(load.shape[0])
        failed += bool(topo.failed_gpus)

    collect()
    assert seen_layers == {1, 2, 3, 4, 5} and failed


def test_unknown_guarantees_are_refused_at_registration():
    from eplb import InputError

    with pytest.raises(InputError, match="unknown guarantees"):
        solvers.register("test_bad_guarantee", guarantees={"fast"})(_round_robin)


def test_docs_example_runs():
    """The five-line example of docs/solvers.md, executed as written."""
    text = DOCS.read_text()
    block = re.search(r"<!-- check-solver-example -->\n```python\n(.*?)```", text, re.S)
    assert block, "the check_solver example block is missing from docs/solvers.md"
    code = block.group(1)
    namespace: dict = {}
    try:
        exec(compile(code, str(DOCS), "exec"), namespace)
        report = namespace.get("report")
        assert report is not None and report.ok
    finally:
        for name in list(solvers.available()):
            if name == "mine":
                solvers.unregister(name)
