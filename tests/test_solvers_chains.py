"""Chain repair at two slots per GPU (`solvers.primitives.chains`, ``repair`` with ``chains=True``):
every layer it repairs reaches the target, stays a valid placement, moves nothing when nothing
changed, and never moves more replicas than ``repair`` without chains (no budget). The real-data
target is measured by ``benchmarks/bench_incremental.py`` and the paper."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from eplb import Placement, Topology, solvers
from eplb.solvers.analysis.migration import replicas_moved
from eplb.solvers.primitives.chains import chain_repair, repair_pairs
from eplb.solvers.primitives.layout import moved, replica_counts
from eplb.testing import assert_valid_placement


@st.composite
def pair_cases(draw):
    """(old load, new load, topology with two slots per GPU, live greedy placement)."""
    N = draw(st.integers(1, 3))
    gpn = draw(st.integers(1, 4))
    G = N * gpn
    E = draw(st.integers(max(2, G), 2 * G))
    L = draw(st.integers(1, 3))
    topo = Topology(N, gpn, 2)
    rows = st.lists(st.integers(0, 1000), min_size=E, max_size=E)
    old = np.array(draw(st.lists(rows, min_size=L, max_size=L)), dtype=float)
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    new = old * rng.lognormal(0.0, draw(st.sampled_from([0.05, 0.3, 1.0])), old.shape)
    live = solvers.solve("greedy", old, topo)
    return old, new, topo, live


@settings(max_examples=60, deadline=None)
@given(pair_cases(), st.sampled_from([0.0, 0.005, 0.05]))
def test_chain_repair_reaches_the_target(case, tol):
    _, new, topo, live = case
    fresh = solvers.solve("greedy", new, topo)
    target = fresh.gpu_load(new).max(1) * (1 + tol)
    out, ok = chain_repair(new, live.phy2log, fresh.phy2log, target, topo.num_gpus)
    p = Placement(out, new.shape[1], topo)
    assert_valid_placement(p, new)
    got = p.gpu_load(new).max(1)
    assert (got[ok] <= target[ok] * (1 + 1e-9)).all()
    assert np.array_equal(out[~ok], live.phy2log[~ok])
    again, ok2 = chain_repair(new, live.phy2log, fresh.phy2log, target, topo.num_gpus)
    assert np.array_equal(out, again) and np.array_equal(ok, ok2)


@settings(max_examples=40, deadline=None)
@given(pair_cases())
def test_repair_pairs_keeps_a_balanced_placement(case):
    old, _, topo, live = case
    E = old.shape[1]
    counts = replica_counts(live.phy2log, E)
    target = live.gpu_load(old).max(1)
    for layer in range(old.shape[0]):
        got = repair_pairs(old[layer], live.phy2log[layer], counts[layer], float(target[layer]))
        assert got is not None
        assert moved(live.phy2log[layer : layer + 1], got[None], E, 2)[0] == 0


@settings(max_examples=40, deadline=None)
@given(pair_cases(), st.sampled_from([0.0, 0.005]))
def test_chains_never_move_more_than_single_moves(case, tol):
    _, new, topo, live = case
    a = solvers.solve("repair", new, topo, previous=live, tolerance=tol)
    b = solvers.solve("repair", new, topo, previous=live, tolerance=tol, chains=False)
    fresh = solvers.solve("greedy", new, topo).gpu_load(new).max(1)
    assert (a.gpu_load(new).max(1) <= fresh * (1 + tol) * (1 + 1e-9)).all()
    assert (replicas_moved(live, a) <= replicas_moved(live, b)).all()
    assert set(a.meta["solver"]["incremental"]["chain_layers"]).isdisjoint(
        a.meta["solver"]["incremental"]["fresh_layers"]
    )


@settings(max_examples=30, deadline=None)
@given(pair_cases(), st.integers(0, 8))
def test_chains_respect_the_migration_budget(case, budget):
    _, new, topo, live = case
    p = solvers.solve("repair", new, topo, previous=live, migration_budget=budget)
    assert ((p.phy2log != live.phy2log).sum(1) <= budget).all()
    assert (p.gpu_load(new).max(1) <= live.gpu_load(new).max(1) * (1 + 1e-9)).all()
