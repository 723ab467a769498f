"""DP balancers: conservation, capacity, dead ranks, determinism (hypothesis), policy semantics
(round-robin cursor, SGLang cache-aware thresholds) and balance quality on skewed inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eplb.errors import InputError
from eplb.evaluation.serving import balancers as B
from eplb.evaluation.serving.balancers import RankState, RequestBatch
from eplb.evaluation.serving.kvcache import RankCaches

POLICIES = B.available()


def test_registry():
    assert POLICIES == [
        "cache_aware",
        "deepseek_decode",
        "deepseek_prefill",
        "least_requests",
        "least_tokens",
        "power_of_two",
        "random",
        "round_robin",
    ]
    assert "balance_abs_threshold" in B.options("cache_aware")
    with pytest.raises(InputError, match="unknown balancer 'nope'; available: cache_aware"):
        B.get("nope")
    st_ = RankState(2)
    with pytest.raises(InputError, match="does not take bogus; its options are none"):
        B.assign("round_robin", RequestBatch([5]), st_, bogus=1)
    with pytest.raises(InputError, match="caches"):
        B.assign("cache_aware", RequestBatch([5]), st_)
    with pytest.raises(InputError, match="balancer .random. is already registered"):
        B.register("random")(lambda *a, **k: None)


# ------------------------------------------------------------------ properties
@st.composite
def scenario(draw):
    R = draw(st.integers(1, 6))
    n = draw(st.integers(0, 25))
    phase = draw(st.sampled_from(["prefill", "decode"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    inp = rng.integers(1, 5000, size=n)
    cached = (inp * rng.random(n) * draw(st.sampled_from([0, 1]))).astype(np.int64)
    hashes = [list(range(1000 * (i % 3), 1000 * (i % 3) + rng.integers(0, 4))) for i in range(n)]
    batch = RequestBatch(inp, cached, rng.integers(1, 300, size=n), block_hashes=hashes)
    alive = rng.random(R) < draw(st.sampled_from([1.0, 0.7, 0.0]))

    def cap(scale):
        return draw(st.sampled_from([math.inf, None])) or rng.integers(0, 4, size=R) * scale

    state = RankState(
        R,
        phase,
        token_budget=cap(2000),
        kv_blocks_capacity=cap(8),
        max_requests=cap(2),
        alive=alive,
        queued_tokens=rng.integers(0, 2, size=R) * 1000,
        num_requests=rng.integers(0, 2, size=R),
        kv_blocks_used=rng.integers(0, 3, size=R),
        block_size=512,
        caches=RankCaches(R, draw(st.sampled_from([None, 4]))),
        cursor=int(rng.integers(0, R)),
    )
    return batch, state, draw(st.sampled_from(POLICIES)), int(rng.integers(0, 100))


@given(scenario())
def test_no_loss_no_duplicate_capacity_and_dead_ranks(sc):
    batch, state, name, seed = sc
    before = state.copy()
    ranks = B.assign(name, batch, state, seed=seed)
    n, R = len(batch), state.num_ranks
    assert ranks.shape == (n,) and ranks.dtype == np.int64  # one answer per request
    assert ((ranks == -1) | ((ranks >= 0) & (ranks < R))).all()
    got = ranks >= 0
    assert before.alive[ranks[got]].all()  # never a dead rank
    counts = np.bincount(ranks[got], minlength=R)
    assert np.array_equal(state.num_requests, before.num_requests + counts)
    # capacities
    assert (state.num_requests <= np.maximum(state.max_requests, before.num_requests)).all()
    assert (
        state.kv_blocks_used <= np.maximum(state.kv_blocks_capacity, before.kv_blocks_used)
    ).all()
    if state.phase == "prefill":
        dq = batch.uncached_tokens
        for r in np.flatnonzero(state.queued_tokens > state.token_budget):
            # only an empty queue may take one prompt larger than its budget (chunked prefill)
            if before.queued_tokens[r] > state.token_budget[r]:
                assert counts[r] == 0
                continue
            assert before.queued_tokens[r] == 0
            assert ((ranks == r) & (dq > 0)).sum() == 1
    # a waiting request fits no rank even now (loads only grew since it was refused)
    waiting = np.flatnonzero(~got)
    if waiting.size:
        assert not state.fits(batch.take(waiting)).any()


@given(scenario())
def test_deterministic_for_a_seed(sc):
    batch, state, name, seed = sc

    def fresh():
        s = state.copy()
        s.caches = RankCaches(state.num_ranks, 4)
        return s

    a = B.assign(name, batch, fresh(), seed=seed)
    b = B.assign(name, batch, fresh(), seed=seed)
    assert np.array_equal(a, b)


@pytest.mark.parametrize("name", POLICIES)
def test_waiting_requests_are_served_exactly_once_when_offered_again(name):
    """Offer, serve (release), re-offer what waited: every request is placed exactly once."""
    rng = np.random.default_rng(1)
    n, R = 60, 4
    batch = RequestBatch(
        rng.integers(100, 3000, size=n),
        output_tokens=rng.integers(1, 50, n),
        block_hashes=[[i % 5, 100 + i] for i in range(n)],
    )
    state = RankState(
        R,
        "prefill" if "decode" not in name else "decode",
        token_budget=4000,
        kv_blocks_capacity=12,
        max_requests=3,
        caches=RankCaches(R, 50),
    )
    placed = np.full(n, -1)
    pending = np.arange(n)
    for step in range(n + 1):
        if not pending.size:
            break
        sub = batch.take(pending)
        ranks = B.assign(name, sub, state, seed=[7, step])
        assert (ranks >= 0).any()  # an emptied cluster always takes something
        assert (placed[pending[ranks >= 0]] == -1).all()
        placed[pending[ranks >= 0]] = ranks[ranks >= 0]
        state.release(sub.take(ranks >= 0), ranks[ranks >= 0])  # they finished
        pending = pending[ranks < 0]
    assert (placed >= 0).all()
    for arr in (
        state.queued_tokens,
        state.running_tokens,
        state.kv_blocks_used,
        state.num_requests,
        state.attention_cost,
    ):
        assert np.allclose(arr, 0)


# ------------------------------------------------------------------ policy semantics
def test_round_robin_cursor_persists_and_skips_full_and_dead_ranks():
    st_ = RankState(4, "decode", max_requests=[5, 5, 5, 1], alive=[True, True, False, True])
    a = B.assign("round_robin", RequestBatch([1, 1, 1]), st_)
    b = B.assign("round_robin", RequestBatch([1, 1, 1]), st_)
    assert a.tolist() == [0, 1, 3] and b.tolist() == [0, 1, 0]  # rank 3 full, rank 2 dead
    assert st_.cursor == 1


def test_least_and_power_of_two():
    st_ = RankState(3, "prefill", queued_tokens=[500, 0, 100], num_requests=[0, 5, 1])
    assert B.assign("least_tokens", RequestBatch([50]), st_.copy()).tolist() == [1]
    assert B.assign("least_requests", RequestBatch([50]), st_.copy()).tolist() == [0]
    r = [B.assign("power_of_two", RequestBatch([50]), st_.copy(), seed=s)[0] for s in range(40)]
    assert 1 not in r  # rank 1 has the most requests: it loses every pair it is in
    t = [
        B.assign("power_of_two", RequestBatch([50]), st_.copy(), seed=s, metric="tokens")[0]
        for s in range(40)
    ]
    assert 0 not in t
    with pytest.raises(InputError, match="metric"):
        B.assign("power_of_two", RequestBatch([50]), st_.copy(), metric="kv")


def _cache_state(R=4, **kw):
    caches = RankCaches(R, 100, block_size=512)
    return RankState(R, "prefill", caches=caches, **kw), caches


def test_cache_aware_prefers_the_rank_holding_the_prefix():
    st_, caches = _cache_state()
    caches.insert(2, [10, 11, 12])
    r = B.assign("cache_aware", RequestBatch([2000], block_hashes=[[10, 11, 12, 13]]), st_)
    assert r.tolist() == [2]  # 3 of 4 blocks (1536 / 2000 > 0.3)
    assert caches.match([10, 11, 12, 13]).tolist() == [0, 0, 4, 0]  # inserted on routing


def test_cache_aware_below_threshold_goes_to_the_smallest_tree():
    st_, caches = _cache_state()
    caches.insert(0, [10])
    caches.insert(1, [20, 21])
    caches.insert(3, [30])
    # 512 of 4000 tokens match on rank 0 (0.128 <= 0.3): smallest tree is rank 2 (empty)
    r = B.assign("cache_aware", RequestBatch([4000], block_hashes=[[10, 99]]), st_)
    assert r.tolist() == [2]


def test_cache_aware_imbalance_needs_both_thresholds():
    hashes = [[10, 11]]
    # abs gap 70 > 64 and 80 > 1.5 * 10: imbalanced -> shortest queue (rank 1), not affinity
    st_, caches = _cache_state(num_requests=[80, 10, 50, 40])
    caches.insert(0, [10, 11])
    assert B.assign("cache_aware", RequestBatch([1000], block_hashes=hashes), st_).tolist() == [1]
    # abs gap 70 > 64 but 250 < 1.5 * 180: balanced -> affinity to rank 0
    st_, caches = _cache_state(num_requests=[250, 180, 200, 190])
    caches.insert(0, [10, 11])
    assert B.assign("cache_aware", RequestBatch([1000], block_hashes=hashes), st_).tolist() == [0]
    # rel 1.2: 250 > 216 -> imbalanced -> rank 1
    st_, caches = _cache_state(num_requests=[250, 180, 200, 190])
    caches.insert(0, [10, 11])
    r = B.assign(
        "cache_aware", RequestBatch([1000], block_hashes=hashes), st_, balance_rel_threshold=1.2
    )
    assert r.tolist() == [1]
    # rel met (80 > 1.5 * 40) but gap 40 <= 64: balanced -> affinity
    st_, caches = _cache_state(num_requests=[80, 40, 50, 60])
    caches.insert(0, [10, 11])
    assert B.assign("cache_aware", RequestBatch([1000], block_hashes=hashes), st_).tolist() == [0]


def test_cache_aware_skips_a_full_affinity_rank():
    st_, caches = _cache_state(max_requests=[1, 9, 9, 9], num_requests=[1, 0, 0, 0])
    caches.insert(0, [10, 11])
    r = B.assign("cache_aware", RequestBatch([1000], block_hashes=[[10, 11]]), st_)
    assert r[0] in (1, 2, 3)


# ------------------------------------------------------------------ balance quality
def _over_bound(load, sizes, R):
    """Max rank load over the lower bound ``max(largest request, total / R)``."""
    return float(load.max() / max(sizes.max(), sizes.sum() / R))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_deepseek_prefill_balances_attention_and_tokens_better_than_round_robin(seed):
    rng = np.random.default_rng(seed)
    n, R = 512, 16
    inp = np.clip(np.rint(rng.lognormal(7.5, 1.2, size=n)), 1, 100_000).astype(np.int64)
    cached = (inp * rng.random(n) * (rng.random(n) < 0.5)).astype(np.int64)
    batch = RequestBatch(inp, cached)
    res = {}
    for name in ("round_robin", "least_tokens", "deepseek_prefill"):
        st_ = RankState(R, "prefill")
        B.assign(name, batch, st_)
        res[name] = (
            _over_bound(st_.attention_cost, batch.attention_cost, R),
            _over_bound(st_.queued_tokens, batch.uncached_tokens, R),
        )
    rr, ds = res["round_robin"], res["deepseek_prefill"]
    assert ds[0] < rr[0] and ds[1] < rr[1], res
    assert ds[0] <= 1.02 and ds[1] <= 1.12, res  # both objectives near their bounds at once


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_deepseek_decode_balances_kv_and_requests_better_than_round_robin(seed):
    rng = np.random.default_rng(seed)
    n, R = 600, 24
    kv = np.clip(np.rint(rng.lognormal(8.0, 1.0, size=n)), 1, 200_000).astype(np.int64)
    batch = RequestBatch(kv, kv_tokens=kv)
    blocks = -(-kv // 64)
    out = {}
    for name in ("round_robin", "least_requests", "deepseek_decode"):
        st_ = RankState(R, "decode", block_size=64)
        B.assign(name, batch, st_, seed=3)
        out[name] = (
            _over_bound(st_.kv_blocks_used, blocks, R),
            float(st_.num_requests.max() / (n / R)),
        )
    rr, ds = out["round_robin"], out["deepseek_decode"]
    assert ds[0] < rr[0] and ds[0] < out["least_requests"][0], out
    assert ds[0] <= 1.06 and ds[1] <= 1.10, out


# ------------------------------------------------------------------ DeepSeek greedy vs reference
def _reference_greedy(led, a, da, A, b, db, B_, w, cursor):
    """The DeepSeek balancers' greedy written plainly: every rank scored per request; ties to
    the first tied rank at or after the cursor (cyclic), which moves past each placement."""
    out = np.full(da.size, -1, dtype=np.int64)
    wb = w / B_
    R = a.size
    for i in np.argsort(-np.maximum(da / A, wb * db), kind="stable"):
        ok = led.fits(i)
        if ok.any():
            x, y = (a + da[i]) / A, wb * (b + db[i])
            score = np.where(ok, np.maximum(x, y) + 1e-9 * (x + y), np.inf)
            order = [(cursor + j) % R for j in range(R)]
            r = min(order, key=lambda q: score[q])  # first minimum in cyclic order
            out[i] = r
            led.place(i, r)
            cursor = (r + 1) % R
    return out


def _reference(name, batch, state, w):
    from eplb.evaluation.serving.balancers.deepseek import _mean_after
    from eplb.evaluation.serving.balancers.state import Ledger

    led = Ledger(state, batch)
    if name == "deepseek_prefill":
        A = _mean_after(led.att, led.datt, state.alive)
        T = _mean_after(led.tokens, led.dtok, state.alive)
        return _reference_greedy(
            led, led.att, led.datt, A, led.tokens, led.dtok, T, w, state.cursor
        )
    ones = np.ones(len(batch))
    K = _mean_after(led.kv, led.dkv, state.alive)
    N = _mean_after(led.n, ones, state.alive)
    return _reference_greedy(led, led.kv, led.dkv, K, led.n, ones, N, w, state.cursor)


@st.composite
def crowded(draw):
    """Many requests on few ranks, loads on coarse grids (ties) or continuous, tight limits."""
    R = draw(st.integers(1, 10))
    n = draw(st.integers(0, 40))
    phase = draw(st.sampled_from(["prefill", "decode"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    coarse = draw(st.booleans())
    inp = rng.integers(1, 4, size=n) * 512 if coarse else rng.integers(1, 9000, size=n)
    cached = (inp * rng.random(n) * draw(st.sampled_from([0, 1]))).astype(np.int64)
    batch = RequestBatch(inp, cached, rng.integers(0, 300, size=n))

    def load(scale):
        if coarse:
            return rng.integers(0, 3, size=R) * scale
        return rng.random(R) * scale * draw(st.sampled_from([0, 1]))

    def cap(scale):
        kind = draw(st.sampled_from(["inf", "scalar", "per_rank"]))
        if kind == "inf":
            return math.inf
        if kind == "scalar":
            return float(rng.integers(1, 12) * scale)
        return rng.integers(0, 12, size=R) * scale

    state = RankState(
        R,
        phase,
        token_budget=cap(draw(st.sampled_from([300, 1000]))),
        kv_blocks_capacity=cap(draw(st.sampled_from([2, 6]))),
        max_requests=cap(1),
        alive=rng.random(R) < draw(st.sampled_from([1.0, 0.7])),
        queued_tokens=load(3000) if coarse else np.floor(load(3000)),
        running_tokens=load(2000),
        num_requests=rng.integers(0, 3, size=R),
        kv_blocks_used=rng.integers(0, 4, size=R),
        attention_cost=load(1e6),
        block_size=512,
        cursor=int(rng.integers(0, R)),
    )
    return batch, state, draw(st.sampled_from([0.0, 0.5, 1.0, 3.0]))


@settings(max_examples=150)
@given(crowded())
def test_deepseek_balancers_equal_the_plain_greedy(sc):
    """The fast greedy (per-rank bookkeeping, skipped capacity tests) makes the reference's
    decisions exactly, ties included."""
    batch, state, w = sc
    name = "deepseek_prefill" if state.phase == "prefill" else "deepseek_decode"
    opt = "token_weight" if state.phase == "prefill" else "request_weight"
    got = B.get(name)(batch, state.copy(), **{opt: w})
    assert np.array_equal(got, _reference(name, batch, state.copy(), w))


# ------------------------------------------------------------------ state and batch
def test_state_add_release_fail_and_increments():
    batch = RequestBatch([1000, 600], cached_tokens=[400, 0], output_tokens=[10, 20])
    st_ = RankState(2, "prefill", caches=RankCaches(2))
    st_.add(batch, [1, -1])
    assert st_.queued_tokens.tolist() == [0, 600] and st_.num_requests.tolist() == [0, 1]
    assert st_.attention_cost[1] == 600 * (400 + 300) and st_.kv_blocks_used[1] == 2
    assert st_.cursor == 0
    st_.caches.insert(1, [1, 2])
    st_.fail(1)
    assert not st_.alive[1] and st_.queued_tokens[1] == 0 and st_.caches.sizes()[1] == 0
    d = RankState(1, "decode", block_size=64)
    d.add(batch, [0, 0])
    assert d.running_tokens[0] == 1010 + 620 and d.kv_blocks_used[0] == 16 + 10
    d.release(batch.take([0]), [0])
    assert d.running_tokens[0] == 620
    with pytest.raises(InputError, match="negative"):
        d.release(batch.take([0]), [0])


@pytest.mark.parametrize(
    "kw, frag",
    [
        ({"input_tokens": [0]}, "input_tokens"),
        ({"input_tokens": [5], "cached_tokens": [6]}, "cached_tokens"),
        ({"input_tokens": [5, 6], "output_tokens": [1]}, "output_tokens has 1"),
        ({"input_tokens": [5.5]}, "whole numbers"),
        ({"input_tokens": [5], "block_hashes": [[1], [2]]}, "block_hashes"),
    ],
)
def test_request_batch_validation(kw, frag):
    with pytest.raises(InputError, match=frag):
        RequestBatch(**kw)


@pytest.mark.parametrize(
    "kw, frag",
    [
        ({"num_ranks": 0}, "num_ranks"),
        ({"num_ranks": 2, "phase": "both"}, "phase"),
        ({"num_ranks": 2, "token_budget": [1, 2, 3]}, "token_budget"),
        ({"num_ranks": 2, "max_requests": -1}, "max_requests"),
        ({"num_ranks": 2, "caches": RankCaches(3)}, "caches cover 3"),
    ],
)
def test_rank_state_validation(kw, frag):
    with pytest.raises(InputError, match=frag):
        RankState(**kw)


def test_from_workload_frame():
    from eplb.evaluation.serving.workload import synthesize

    w = synthesize(30, hit_rate=0.4, seed=0)
    batch = RequestBatch.from_frame(w)
    assert len(batch) == 30 and batch.block_hashes is not None
    st_ = RankState(3, caches=RankCaches(3))
    assert (B.assign("cache_aware", w, st_) >= 0).all()
