"""The compiled count search (`pairing_jit`, the ``fast`` extra) returns exactly the numpy
search's counts: random layers of several sizes, caps, absent experts, rows with and without
the duplicate rule, rows sharing a load (`load_id`), ties in the loads, budgets."""

from __future__ import annotations

import numpy as np
import pytest

from eplb.solvers.primitives import pairing, pairing_jit
from eplb.solvers.primitives.even_split import row_caps
from eplb.solvers.primitives.replication import waterfill

pytestmark = pytest.mark.skipif(not pairing_jit.available(),
                                reason="numba not installed (the fast extra)")


def numpy_search(monkeypatch, *args, **kw):
    with monkeypatch.context() as m:
        m.setattr(pairing_jit, "_KERNEL", False)
        assert not pairing_jit.available()
        return pairing.improve_counts(*args, **kw)


def case(rng, X, E, G, *, ties=False, absent=0.0):
    load = rng.lognormal(0.0, 1.2, size=(X, E)) * 1000
    if ties:  # equal loads: equal replica sizes, where the tie rules decide
        load = np.round(load / 500) * 500 + 1
    present = rng.random((X, E)) >= absent
    present[:, 0] = True
    load = np.where(present, load, 0.0)
    cap = row_caps(present, G, 2)
    counts = waterfill(load, 2 * G, cap, present=present)
    return load, counts, cap, present


@pytest.mark.parametrize("seed", range(6))
def test_same_counts_as_numpy(monkeypatch, seed):
    rng = np.random.default_rng(seed)
    X, E, G = [(6, 24, 16), (5, 40, 24), (4, 64, 40), (3, 17, 12), (6, 32, 32), (2, 128, 72)][seed]
    load, counts, cap, present = case(rng, X, E, G, ties=seed % 2 == 1, absent=0.2 * (seed % 3))
    distinct = rng.random(2 * X) < 0.5
    args = (np.concatenate([load, load]), np.concatenate([counts, counts]),
            np.concatenate([cap, cap]))
    kw = {"present": np.concatenate([present, present]), "distinct": distinct,
          "load_id": np.tile(np.arange(X), 2), "budget": 10_000}
    got = pairing.improve_counts(*args, **kw)
    want = numpy_search(monkeypatch, *args, **kw)
    assert np.array_equal(got, want)
    assert (got != np.concatenate([counts, counts])).any()  # the search moved something
    for budget in (0, 1, 3):  # cut short: the same first moves
        kw["budget"] = budget
        assert np.array_equal(pairing.improve_counts(*args, **kw),
                              numpy_search(monkeypatch, *args, **kw))


def test_scalar_cap_and_defaults(monkeypatch):
    rng = np.random.default_rng(7)
    load = rng.lognormal(0.0, 1.0, size=(4, 48)) * 100
    counts = waterfill(load, 64, 32)
    for distinct in (True, False):
        got = pairing.improve_counts(load, counts, 32, distinct=distinct)
        assert np.array_equal(got, numpy_search(monkeypatch, load, counts, 32,
                                                distinct=distinct))
