"""The `solvers.solve` entry point: traces and model layer ids, option checking, bad input
(every error an `EplbError` naming the argument), the options listing."""

from __future__ import annotations

import math

import numpy as np
import pytest

from eplb import EplbError, InputError, Placement, Topology, solvers, traces

TOPO = Topology(2, 2, 3)


def _trace(ids=(3, 4, 7)) -> traces.Trace:
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 100, size=(2, len(ids), 8)).astype(float)
    return traces.Trace(counts, np.array(ids))


FAST = [n for n in solvers.available() if not n.startswith("eval_")]


@pytest.mark.parametrize("name", FAST)
def test_trace_input_carries_model_layer_ids(name):
    tr = _trace()
    kw = {"num_groups": 4}
    if name.startswith("ilp"):
        kw["workers"] = 1
    if name == "ilp":
        kw["deterministic_time"] = 0.05
    if name == "repair":
        kw["previous"] = solvers.solve("greedy", tr.load() * 0.5, TOPO)
    topo = Topology(2, 2, 4) if name == "lplb" else TOPO  # a replica graph needs even spares
    p = solvers.solve(name, tr, topo, **kw)
    assert p.layer_ids.tolist() == [3, 4, 7]
    arr = tr.counts if solvers.takes_windows(name) else tr.load()  # what a trace gives
    q = solvers.solve(name, arr, topo, **kw)
    assert q.layer_ids.tolist() == [0, 1, 2]
    assert np.array_equal(p.phy2log, q.phy2log)  # the same problem
    if name == "repair":  # the ids follow previous when not given: give them explicitly
        kw["previous"] = solvers.solve("greedy", tr.load() * 0.5, TOPO, layer_ids=[0, 1, 2])
    r = solvers.solve(name, arr, topo, layer_ids=[3, 4, 7], **kw)
    assert r.layer_ids.tolist() == [3, 4, 7] and np.array_equal(r.phy2log, q.phy2log)


def test_layer_ids_follow_previous_when_not_given():
    tr = _trace()
    live = solvers.solve("greedy", tr, TOPO)
    p = solvers.solve("greedy", tr.load() * 1.1, TOPO, previous=live)
    assert p.layer_ids.tolist() == [3, 4, 7]


@pytest.mark.parametrize(
    ("ids", "match"),
    [
        ([3, 4], "3 integers"),
        ([3, 3, 4], "distinct"),
        ([1.5, 2, 3], "integers"),
        ([-1, 2, 3], ">= 0"),
        ("abc", "integers"),
    ],
)
def test_bad_layer_ids(ids, match):
    with pytest.raises(InputError, match=match):
        solvers.solve("greedy", _trace().load(), TOPO, layer_ids=ids)


def test_trace_with_other_layer_ids_is_refused():
    with pytest.raises(InputError, match="differ from the trace"):
        solvers.solve("greedy", _trace(), TOPO, layer_ids=[0, 1, 2])


def test_options_listing():
    assert solvers.options("deepseek") == {}
    assert solvers.options("hierarchical") == {"budget": 10_000}
    assert "budget" in solvers.options("greedy")
    assert {"workers", "threads", "progress"} <= set(solvers.options("ilp"))
    with pytest.raises(InputError, match="unknown solver"):
        solvers.options("nope")


@pytest.mark.parametrize(
    ("name", "kw", "match"),
    [
        ("deepseek", {"bogus": 1}, "solver 'deepseek' has no option 'bogus'; its options: none"),
        ("greedy", {"bogus": 1}, "has no option 'bogus'; its options: .*budget"),
        ("greedy", {"budget": "x"}, "option budget must be an integer"),
        ("greedy", {"budget": -1}, "option budget must be an integer >= 0"),
        ("greedy", {"budget": 2.0}, "option budget must be an integer"),
        ("greedy", {"budget": True}, "option budget must be an integer"),
        ("greedy", {"weighted": "yes"}, "option weighted must be true or false"),
        ("greedy", {"rdma_weight": -1}, "option rdma_weight must be a number >= 0"),
        ("ilp", {"weighted": 1}, "option weighted must be true or false"),
        ("hierarchical", {"budget": None, "num_groups": 4}, "budget must be an integer, got None"),
        ("ilp", {"counts": "some"}, "counts must be one of 'auto', 'free', 'fixed'"),
        ("ilp", {"workers": 0}, "workers must be an integer >= 1"),
        ("ilp", {"threads": 1.5}, "threads must be an integer"),
        ("ilp", {"progress": "yes"}, "progress must be true or false"),
    ],
)
def test_bad_options_name_the_solver_and_option(name, kw, match):
    with pytest.raises(InputError, match=match):
        solvers.solve(name, np.ones((1, 8)), TOPO, **kw)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"time_limit": "5"}, "time_limit must be a number"),
        ({"time_limit": float("inf")}, "finite"),
        ({"time_limit": 0}, "time_limit must be a finite number of seconds > 0"),
        ({"time_limit": float("nan")}, "time_limit"),
        ({"seed": "abc"}, "seed must be a non-negative integer"),
        ({"seed": -1}, "seed must be a non-negative integer"),
        ({"seed": 1.0}, "seed"),
        ({"num_groups": 3}, "num_groups 3 does not divide 8 experts"),
        ({"num_groups": "4"}, "num_groups must be an integer"),
        ({"num_groups": True}, "num_groups must be an integer"),
        ({"previous": "x"}, "previous must be a Placement"),
    ],
)
def test_bad_common_arguments(kw, match):
    with pytest.raises(InputError, match=match):
        solvers.solve("greedy", np.ones((1, 8)), TOPO, **kw)


@pytest.mark.parametrize(
    ("load", "match"),
    [
        (np.full((1, 8), 1e308), "2\\*\\*53"),
        (np.ones((1, 8)) * (1 + 1j), "complex"),
        (np.ones((1, 8), dtype=bool), "booleans"),
        ([["1"] * 8], "strings"),
        ([[1, 2], [3]], "numeric array"),
        (np.array([[1, 2, None, 4, 5, 6, 7, 8]], dtype=object), "Python objects"),
        (None, "Python objects|2-D"),
        (np.ones((1, 100)), "cannot hold 100 experts"),
    ],
)
@pytest.mark.parametrize("name", ["deepseek", "greedy", "hierarchical", "ilp"])
def test_bad_loads_raise_eplb_errors(name, load, match):
    with pytest.raises(EplbError, match=match):
        solvers.solve(name, load, TOPO, num_groups=4)


def test_absurd_sizes_are_refused_before_allocating():
    topo = Topology(256, 256, 16)  # within Topology's own caps, but 58 x 256 x 65,536 entries
    with pytest.raises(InputError, match="problem too large"):
        solvers.solve("greedy", np.ones((58, 256)), topo)


def test_plain_function_solvers():
    """A registered function declares only the arguments it uses; it may return phy2log."""

    @solvers.register("test_round_robin")
    def round_robin(load, topology):
        L, E = load.shape
        return np.broadcast_to(np.arange(topology.num_slots) % E, (L, topology.num_slots)).copy()

    try:
        p = solvers.solve(
            "test_round_robin", np.ones((2, 8)), TOPO, seed=3, time_limit=1, num_groups=4
        )
        assert isinstance(p, Placement) and p.meta["solver"]["name"] == "test_round_robin"
        assert solvers.options("test_round_robin") == {}
        with pytest.raises(InputError, match="has no option 'x'"):
            solvers.solve("test_round_robin", np.ones((2, 8)), TOPO, x=1)
    finally:
        solvers.unregister("test_round_robin")


def test_register_twice_is_refused():
    with pytest.raises(InputError, match="already registered"):
        solvers.register("greedy")(lambda load, topology: None)


# ------------------------------------------------------------------ junk at the public API
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from eplb.solvers.analysis.bounds import lower_bound  # noqa: E402
from eplb.solvers.analysis.migration import replicas_moved  # noqa: E402
from eplb.solvers.primitives.relabel import relabel  # noqa: E402
from eplb.solvers.primitives.traffic_cost import expected_rdma  # noqa: E402

JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**30), 10**30),
    st.floats(allow_nan=True),
    st.complex_numbers(),
    st.text(max_size=5),
    st.binary(max_size=5),
    st.lists(st.integers(-5, 5), max_size=4),
    st.dictionaries(st.text(max_size=2), st.integers()),
    st.just(object()),
    st.just(np.ones((2, 2, 2))),
    st.just(np.array([["a", "b"]])),
    st.just(np.full((1, 8), 1e308)),
    st.just(-np.ones((1, 8))),
    st.just(np.ones((0, 8))),
)
GOOD = {"load": np.ones((1, 8)), "topology": TOPO}


def _int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _real(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


# which junk is in fact a valid value of each argument of solve("greedy", ones((1, 8)), TOPO)
VALID = {
    "load": lambda v: False,
    "topology": lambda v: False,
    "num_groups": lambda v: v is None or (_int(v) and v in (1, 2, 4, 8)),  # divisors of 8
    "previous": lambda v: v is None,
    "seed": lambda v: _int(v) and v >= 0,
    "time_limit": lambda v: v is None or (_real(v) and math.isfinite(v) and v > 0),
    "layer_ids": lambda v: v is None or (isinstance(v, list) and len(v) == 1 and v[0] >= 0),
    "budget": lambda v: _int(v) and v >= 0,
    "name": lambda v: isinstance(v, str) and v in solvers.available(),
}


def _refused_iff_junk(valid: bool, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` raises an `EplbError` exactly when the value under test is not
    valid: junk accepted fails, a valid value refused fails, any other exception fails."""
    try:
        fn(*args, **kwargs)
    except EplbError as exc:
        assert not valid, f"a valid value was refused: {exc}"
    else:
        assert valid, "junk was accepted"


@settings(max_examples=60, deadline=None)
@given(
    junk=JUNK,
    where=st.sampled_from(
        [
            "load",
            "topology",
            "num_groups",
            "previous",
            "seed",
            "time_limit",
            "layer_ids",
            "budget",
            "name",
        ]
    ),
)
def test_solve_refuses_junk_with_eplb_errors(junk, where):
    """Issue 13: no TypeError, IndexError, OverflowError... from solve, whatever the input;
    junk is refused with an `EplbError` (issue 19: accepted junk fails this test)."""
    kw = {"num_groups": None, "seed": 0}
    args = dict(GOOD)
    name = "greedy"
    if where in args:
        args[where] = junk
    elif where == "name":
        name = junk
    else:
        kw[where] = junk
    valid = VALID[where](junk)
    _refused_iff_junk(valid, solvers.solve, name, args["load"], args["topology"], **kw)


# which junk is a valid value of lower_bound's arguments (load, topology, num_groups,
# hierarchical, weighted, lp) with the others as in the baseline
BOUND_VALID = [
    lambda v: False,
    lambda v: False,
    lambda v: v is None or (_int(v) and v >= 1),  # not hierarchical: need not divide
    lambda v: v is False,  # hierarchical=True needs num_groups
    lambda v: isinstance(v, bool),
    lambda v: isinstance(v, bool) or (isinstance(v, str) and v == "auto"),
]


@settings(max_examples=40, deadline=None)
@given(junk=JUNK, where=st.integers(0, 5))
def test_bounds_and_helpers_refuse_junk(junk, where):
    args = [np.ones((1, 8)), TOPO, None, False, False, "auto"]
    args[where] = junk
    load, topo, groups, hier, weighted, lp = args
    _refused_iff_junk(
        BOUND_VALID[where](junk),
        lower_bound,
        load,
        topo,
        num_groups=groups,
        hierarchical=hier,
        weighted=weighted,
        lp=lp,
    )
    p = solvers.solve("greedy", np.ones((1, 8)), TOPO)
    _refused_iff_junk(False, replicas_moved, p, junk)
    _refused_iff_junk(False, relabel, junk, p)
    _refused_iff_junk(False, expected_rdma, junk, np.ones((1, 8)), TOPO)
    _refused_iff_junk(False, expected_rdma, p, junk)
    _refused_iff_junk(VALID["name"](junk), solvers.options, junk)
    _refused_iff_junk(VALID["budget"](junk), solvers.check_options, "greedy", {"budget": junk})
