"""The compiled kernels (`solvers.primitives.jit`, the ``fast`` extra) give exactly what the
numpy code gives: the count search's counts (random layers of several sizes, caps, absent
experts, rows with and without the duplicate rule, rows sharing a load, ties in the loads,
budgets), LPT's packing (ties, zero loads, duplicates forced and repaired) and DeepSeek's
balanced packing (ties, zeros, both starts)."""

from __future__ import annotations

import numpy as np
import pytest

from eplb.solvers.primitives import deepseek_kernels, jit, packing, pairing
from eplb.solvers.primitives.even_split import row_caps
from eplb.solvers.primitives.replication import waterfill

pytestmark = pytest.mark.skipif(not jit.available(),
                                reason="numba not installed (the fast extra)")


def numpy_search(monkeypatch, *args, **kw):
    return without_jit(monkeypatch, pairing.improve_counts, *args, **kw)


def without_jit(monkeypatch, fn, *args, **kw):
    with monkeypatch.context() as m:
        m.setattr(jit, "_KERNELS", False)
        assert not jit.available()
        return fn(*args, **kw)


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


@pytest.mark.parametrize("seed", range(4))
def test_lpt_same_packing(monkeypatch, seed):
    rng = np.random.default_rng(100 + seed)
    for _ in range(12):
        X, E = int(rng.integers(1, 5)), int(rng.integers(3, 40))
        G, S = int(rng.integers(1, 9)), int(rng.integers(1, 6))
        load = rng.lognormal(0, 1.5, (X, E)) * 100
        if seed % 2:  # equal loads, zero loads
            load = np.round(load / 50) * 50
            load[:, : E // 3] = 0
        cap = G if E >= S else -(-G * S // E)
        counts = waterfill(load, G * S, cap)
        if (counts.sum(1) != G * S).any():
            continue
        got = packing.lpt(load, counts, G, S)
        want = without_jit(monkeypatch, packing.lpt, load, counts, G, S)
        for name in ("slot_e", "slot_s", "gpu", "holds"):
            assert np.array_equal(getattr(got, name), getattr(want, name)), name


@pytest.mark.parametrize("seed", range(4))
def test_deepseek_pack_same(monkeypatch, seed):
    rng = np.random.default_rng(200 + seed)
    for _ in range(20):
        X, m, per = int(rng.integers(1, 6)), int(rng.integers(1, 9)), int(rng.integers(2, 6))
        w = rng.lognormal(0, 1, (X, m * per)).astype(np.float32)
        if seed % 2:
            w = np.round(w * 2).astype(np.float32)  # ties and zeros
        got = deepseek_kernels.pack(w, m, compiled=True)
        want = without_jit(monkeypatch, deepseek_kernels.pack, w, m, compiled=True)
        assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
