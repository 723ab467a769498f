"""The greedy pipeline's fast paths give the same results as the plain computations they skip
(issue 22, part 3): the swap search's lazy duplicate check, LPT's first round, incremental
water-filling, and the bound that skips DeepSeek's hierarchical candidate."""

from __future__ import annotations

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from eplb import Topology
from eplb.solvers.primitives import even_split, packing
from eplb.solvers.primitives.deepseek_kernels import placement_table
from eplb.solvers.primitives.layout import max_load
from eplb.solvers.primitives.replication import waterfill
from eplb.tolerance import REL_TOL, better


def _load(rng, X: int, E: int, kind: str) -> np.ndarray:
    if kind == "int":  # many ties
        return rng.integers(0, 6, size=(X, E)).astype(float)
    if kind == "zipf":
        return rng.zipf(1.3, size=(X, E)).astype(float)
    return rng.random((X, E)) * 100


_kinds = st.sampled_from(["int", "zipf", "uniform"])


@settings(max_examples=60, deadline=None)
@given(E=st.integers(2, 12), G=st.integers(2, 9), S=st.integers(2, 5), X=st.integers(1, 4),
       kind=_kinds, seed=st.integers(0, 10_000))
def test_best_swap_equals_masking_every_duplicate(E, G, S, X, kind, seed):
    """`_best_swap` (duplicates checked at the argmin only, full mask after 4 rounds) picks the
    swap the full criterion picks: the first smallest entry among improving, duplicate-free
    swaps (``d > 0``, below the heavy GPU's load), and finds one exactly when it exists.
    Few experts on many slots make most minima duplicates."""
    rng = np.random.default_rng(seed)
    assume(G * S >= E)
    load = _load(rng, X, E, kind)
    counts = np.stack([1 + rng.multinomial(G * S - E, np.ones(E) / E) for _ in range(X)])
    if (counts > G).any():
        counts = np.minimum(counts, G)
        counts[:, 0] += G * S - counts.sum(1)  # may exceed G: duplicates then
    p = packing.lpt(load, counts, G, S)
    active = np.arange(X)
    order = np.argsort(p.gpu, axis=1, kind="stable")
    r = np.arange(X)
    h = order[:, -1]
    lh = p.gpu[r, h]
    k = G - 1
    cand = order[:, :k]
    a_s, a_e = p.slot_s[active, h], p.slot_e[active, h]
    b_s = p.slot_s[active[:, None], cand].reshape(X, k * S)
    b_e = p.slot_e[active[:, None], cand].reshape(X, k * S)
    gl = np.take_along_axis(p.gpu, np.repeat(cand, S, axis=1), 1)
    d = a_s[:, :, None] - b_s[:, None, :]
    pair = np.maximum(lh[:, None, None] - d, gl[:, None, :] + d)
    ok = (d > 0) & (pair < lh[:, None, None] * (1 - REL_TOL))
    ok &= packing._no_duplicate(p, active, a_e, b_e, h, cand).reshape(ok.shape)
    ref = np.where(ok, pair, np.inf).reshape(X, -1)
    want = ref.argmin(1)
    found = np.isfinite(ref[r, want])
    score = packing._pair_loads(a_s, b_s, lh, gl).reshape(X, -1)
    got = packing._best_swap(p, score, lh, (active, a_e, b_e, h, cand), False)
    assert np.array_equal(better(score[r, got], lh), found)
    assert np.array_equal(got[found], want[found])


@settings(max_examples=60, deadline=None)
@given(E=st.integers(1, 12), G=st.integers(1, 9), S=st.integers(1, 5), X=st.integers(1, 4),
       kind=_kinds, zeros=st.booleans(), seed=st.integers(0, 10_000))
def test_lpt_first_round_and_incremental_waterfill_change_nothing(E, G, S, X, kind, zeros, seed):
    """LPT's first round (the G heaviest items to GPUs 0..G-1) equals the item-by-item loop (a
    zero node penalty takes the loop), and water-filling updated in place equals the
    recomputing loop (a zero bonus takes it), zero loads and caps included."""
    rng = np.random.default_rng(seed)
    assume(G * S >= E)
    load = _load(rng, X, E, kind)
    if zeros:
        load[rng.random((X, E)) < 0.4] = 0.0
    cap = even_split.row_caps(np.ones((X, E), dtype=bool), G, S)
    counts = waterfill(load, G * S, cap)
    assert np.array_equal(counts, waterfill(load, G * S, cap, bonus=np.zeros((X, E, 1))))
    fast = packing.lpt(load, counts, G, S)
    loop = packing.lpt(load, counts, G, S, node_penalty=np.zeros((X, E)), gpus_per_node=G)
    for name in ("slot_e", "slot_s", "gpu", "holds"):
        assert np.array_equal(getattr(fast, name), getattr(loop, name))


@settings(max_examples=40, deadline=None)
@given(N=st.sampled_from([1, 2, 4]), gpn=st.integers(1, 4), S=st.integers(2, 5),
       groups=st.sampled_from([4, 8]), kind=_kinds, seed=st.integers(0, 10_000))
def test_skipped_hierarchical_candidate_could_not_win(N, gpn, S, groups, kind, seed):
    """The layers `hierarchical_rows` leaves out (DeepSeek's hierarchical placement skipped by
    its node and replica bound) are layers where that placement is not better than ``best``."""
    rng = np.random.default_rng(seed)
    E = 16
    topo = Topology(N, gpn, S)
    assume(topo.num_slots >= E and groups % N == 0)
    load = _load(rng, 6, E, kind) + rng.random((6, E)) * 0.01
    best = max_load(load, even_split.pack_even(load, topo.num_gpus, S).phy2log(), S)
    best *= rng.choice([0.9, 1.0, 1.1, 1.5], size=best.shape)  # bounds to beat, both ways
    hier = max_load(load, placement_table(load, topo, groups)[0], S)
    kept = even_split.hierarchical_rows(load, topo, groups, best)
    skipped = np.setdiff1d(np.arange(6), kept)
    assert not better(hier[skipped], best[skipped]).any()


@settings(max_examples=60, deadline=None)
@given(N=st.sampled_from([1, 2]), gpn=st.integers(1, 4), S=st.integers(1, 4),
       kind=_kinds, edge=st.sampled_from([0.9, 1.0, 1.0 + 1e-13, 1.0 + 2e-12, 1.1]),
       seed=st.integers(0, 10_000))
def test_skipped_global_candidate_could_not_win(N, gpn, S, kind, edge, seed):
    """The layers `deepseek_candidates` leaves out (DeepSeek's global placement skipped by its
    replica-count bound) are layers where that placement is not better than ``best``, also when
    ``best`` sits within float noise of that placement's own max load (``edge``)."""
    rng = np.random.default_rng(seed)
    E = 12
    topo = Topology(N, gpn, S)
    assume(topo.num_slots >= E)
    load = _load(rng, 6, E, kind) + rng.random((6, E)) * 0.01
    glob = max_load(load, placement_table(load, topo, None)[0], S)
    best = glob * edge  # bounds to beat at and around the candidate's own value
    kept = np.concatenate([r for r, _ in even_split.deepseek_candidates(load, topo, None, best)]
                          or [np.zeros(0, dtype=np.int64)])
    skipped = np.setdiff1d(np.arange(6), kept)
    assert not better(glob[skipped], best[skipped]).any()


def test_global_candidate_bound_has_float_slack():
    """Three equal loads of 0.1 on three GPUs: the mean bound sums to 0.30000000000000004, so
    it exceeds the candidate's own max load (0.1) by float noise; a ``best`` just above the
    candidate must not be skipped on that bound."""
    topo = Topology(1, 3, 1)
    load = np.full((1, 3), 0.1)
    val = max_load(load, placement_table(load, topo, None)[0], 1)[0]
    raw = max(load.max(), load.sum() / 3)
    assert raw > val  # the float noise this test is about
    best = val / (1 - REL_TOL)
    while not (better(val, best) and not better(raw, best)):
        best = np.nextafter(best, np.inf)
    kept = [r for r, _ in even_split.deepseek_candidates(load, topo, None, np.array([best]))]
    assert kept and 0 in np.concatenate(kept)
