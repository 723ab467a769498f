"""Generators: determinism, sums, and the statistics each one promises (seeded, with tolerances)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy.stats import spearmanr

from eplb.errors import TraceError
from eplb.traces import Trace, calibration, summary, synth

COUNT_GENERATORS = {
    "zipf": synth.zipf,
    "lognormal": synth.lognormal,
    "uniform": synth.uniform,
    "drift": synth.drift,
    "bursty": synth.bursty,
}


# ------------------------------------------------------------------ common contract
@pytest.mark.parametrize("name", sorted(COUNT_GENERATORS))
def test_seeded_deterministic_and_rows_sum_to_picks(name):
    gen = COUNT_GENERATORS[name]
    a = gen(5, 32, windows=3, tokens=1000, top_k=4, seed=7)
    b = gen(5, 32, windows=3, tokens=1000, top_k=4, seed=7)
    c = gen(5, 32, windows=3, tokens=1000, top_k=4, seed=8)
    assert a.equals(b) and not np.array_equal(a.counts, c.counts)
    assert a.counts.shape == (3, 5, 32)
    assert np.all(a.counts.sum(axis=2) == 4000)
    assert a.meta["top_k"] == 4 and a.meta["provenance"]["generator"] == name


def test_layer_ids_and_meta_pass_through():
    t = synth.zipf(3, 8, layer_ids=[5, 6, 7], meta={"num_groups": 2, "num_model_layers": 8})
    assert t.layer_ids.tolist() == [5, 6, 7]
    assert t.meta["num_groups"] == 2 and t.meta["num_model_layers"] == 8


@pytest.mark.parametrize("kwargs, match", [
    ({"num_layers": 0}, "num_layers must be a positive integer"),
    ({"windows": 1.5}, "windows must be a positive integer"),
    ({"skew": (1.0, 0.5)}, "skew must be"),
    ({"top_k": 40}, "top_k 40 exceeds the 32 experts"),
])
def test_bad_generator_arguments(kwargs, match):
    args = {"num_layers": 2, "num_experts": 32, **kwargs}
    with pytest.raises(TraceError, match=match):
        synth.zipf(**args)


@given(hnp.arrays(np.float64, st.tuples(st.integers(1, 3), st.integers(8, 40)),
                  elements=st.floats(0.0, 1e3)), st.integers(1, 8))
def test_cap_shares_properties(w, top_k):
    w = w + 1e-3
    p = w / w.sum(-1, keepdims=True)
    q = synth.cap_shares(p, top_k)
    assert np.allclose(q.sum(-1), 1.0)
    assert np.all(q <= 1.0 / top_k + 1e-9)
    # order preserved, and experts below the cap keep their relative shares
    for prow, qrow in zip(p, q, strict=True):
        assert np.all(np.diff(qrow[np.argsort(prow, kind="stable")]) >= -1e-12)
        free = qrow < 1.0 / top_k - 1e-9
        if free.sum() >= 2:
            ratio = qrow[free] / prow[free]
            assert np.allclose(ratio, ratio[0])
    if np.all(p <= 1.0 / top_k):
        assert np.allclose(p, q)


# ------------------------------------------------------------------ shapes of popularity
def _loglog_slope(counts_row, upto):
    c = np.sort(counts_row)[::-1][:upto]
    r = np.arange(1, upto + 1)
    return -np.polyfit(np.log(r), np.log(c), 1)[0]


def test_zipf_exponents_lie_in_the_skew_range():
    lo, hi = 0.5, 0.9  # top share 1/H(256, 0.9) < 1/8: no capping
    t = synth.zipf(40, 256, tokens=2**20, skew=(lo, hi), seed=3)
    slopes = np.array([_loglog_slope(row, 64) for row in t.counts[0]])
    assert slopes.min() > lo - 0.05 and slopes.max() < hi + 0.05
    assert slopes.min() < lo + 0.1 and slopes.max() > hi - 0.1  # the range is used


def test_lognormal_sigma():
    t = synth.lognormal(30, 256, tokens=2**20, sigma=(0.7, 0.7), seed=4)
    sd = np.log(t.counts[0]).std(axis=1)
    assert np.all(np.abs(sd - 0.7) < 0.12)
    assert abs(np.mean(sd) - 0.7) < 0.03


def test_uniform_is_only_sampling_noise():
    tokens, K, E = 4096, 8, 256
    t = synth.uniform(40, E, tokens=tokens, top_k=K, seed=5)
    expected = np.sqrt((1 - 1 / E) / (tokens * K / E))  # binomial CV
    assert np.mean(summary.cv(t.counts[0])) == pytest.approx(expected, rel=0.1)


def _hot_turnover(counts, h):
    """Share of each window's top-h experts not in the next window's top-h: [T-1, L]."""
    top = np.argsort(-counts, axis=2)[..., :h]
    T, L, _ = counts.shape
    out = np.empty((T - 1, L))
    for t in range(T - 1):
        for lyr in range(L):
            out[t, lyr] = 1 - len(np.intersect1d(top[t, lyr], top[t + 1, lyr])) / h
    return out


@pytest.mark.parametrize("rate", [0.0, 0.1, 0.3])
def test_drift_moves_the_hot_set_at_the_given_rate(rate):
    E, h = 256, 26
    t = synth.drift(30, E, windows=8, tokens=2**20, rate=rate, skew=(0.9, 1.0), seed=6)
    turnover = _hot_turnover(t.counts, h)
    expected = rate * (1 - h / E)
    assert turnover.mean() == pytest.approx(expected, abs=0.03)
    if rate == 0:
        assert turnover.max() == 0.0


def test_bursty_spike_frequency_and_size():
    t = synth.bursty(20, 128, windows=40, tokens=2**17, top_k=8, burst_prob=0.1,
                     burst_experts=2, burst_factor=20.0, skew=(0.0, 0.0), seed=9)
    mom = summary.max_over_mean(t.counts)  # [T, L]; the base is uniform
    spikes = mom > 5
    assert spikes.sum() == t.meta["provenance"]["num_bursts"]  # every burst, nothing else
    assert spikes.mean() == pytest.approx(0.1, abs=0.04)
    factor = 20.0 / (1 + 2 * 19 / 128)  # boosted share / mean share
    assert np.median(mom[spikes]) == pytest.approx(factor, rel=0.05)
    assert mom[~spikes].max() < 1.5


# ------------------------------------------------------------------ calibrated
@pytest.fixture(scope="module")
def table():
    return calibration.load_table("deepseek-v3")


def _stats(load):
    return calibration.target_stats(load, 8)


def test_calibrated_shape_and_meta():
    t = synth.calibrated("deepseek-v3", windows=4, tokens=2048, seed=1)
    assert t.counts.shape == (4, 58, 256)
    assert t.layer_ids.tolist() == list(range(3, 61))
    assert t.meta["num_model_layers"] == 61 and t.meta["num_groups"] == 8
    assert t.meta["top_k"] == 8 and t.meta["topk_groups"] == 4
    assert t.equals(synth.calibrated("deepseek-v3", windows=4, tokens=2048, seed=1))
    with pytest.raises(TraceError, match="no calibration for model 'llama'"):
        synth.calibrated("llama")
    with pytest.raises(TraceError, match="unknown phase 'train'"):
        synth.calibrated(phase="train")


@pytest.mark.parametrize("phase", ["all", "prefill", "decode"])
def test_calibrated_statistics_match_the_measured_targets(table, phase):
    """Per-layer median of each statistic within 10% of the measured (pooled over 3 seeds),
    and the per-layer profile follows the measured one (rank correlation)."""
    targets = table["phases"][phase]["targets"]
    gens = [_stats(synth.calibrated(windows=2, tokens=2**18, phase=phase, seed=s).load())
            for s in range(3)]
    for k, target in targets.items():
        got = np.concatenate([g[k] for g in gens])
        assert np.median(got) == pytest.approx(np.median(target), rel=0.10), k
    for k in ("cv", "group_cv"):
        rho = np.mean([spearmanr(g[k], targets[k]).statistic for g in gens])
        assert rho > 0.5, (k, rho)


def test_calibration_phases_differ_as_measured(table):
    dec, pre = (np.median(table["phases"][p]["targets"]["group_cv"]) for p in ("decode",
                                                                             "prefill"))
    g = {p: np.median(summary.group_cv(synth.calibrated(phase=p, tokens=2**18, windows=1,
                                                        seed=2).load(), 8))
         for p in ("decode", "prefill")}
    assert (g["decode"] > g["prefill"]) == (dec > pre)


def test_calibration_table_reproduces_real_statistics(table, deepseek_jsons):
    """The committed targets are the statistics of the real files (checked by hash and value)."""
    from eplb import traces
    recorded = {f["name"]: f["sha256"] for f in table["source"]["files"]}
    assert sorted(recorded) == sorted(p.name for p in deepseek_jsons)
    for p in deepseek_jsons:
        assert hashlib.sha256(p.read_bytes()).hexdigest() == recorded[p.name]
    load = np.stack([traces.read(p).load() for p in deepseek_jsons])
    stats = _stats(load)
    for k, target in table["phases"]["all"]["targets"].items():
        assert np.allclose(np.median(stats[k], axis=0), target, atol=1e-5), k


def test_calibration_table_holds_fitted_numbers_not_data(table):
    assert len(json.dumps(table)) < 40_000

    def longest(x):
        if isinstance(x, dict):
            return max((longest(v) for v in x.values()), default=0)
        if isinstance(x, list):
            return max([len(x), *(longest(v) for v in x)])
        return 0

    assert longest(table) < 256  # no list as long as one layer's expert counts


# ------------------------------------------------------------------ token level
@pytest.fixture(scope="module")
def routed():
    target = synth.calibrated(windows=1, tokens=2**16, seed=3).select(layers=range(3, 9))
    return target, synth.token_level(target, num_tokens=2048, num_groups=8, topk_groups=4,
                                     top_k=8, num_ranks=16, seed=4)


def test_token_level_router_contract(routed):
    _, t = routed
    N, L, K = t.topk_ids.shape
    assert (N, L, K) == (2048, 6, 8) and t.topk_ids.dtype == np.int16
    assert t.token_rank.dtype == np.int32 and t.token_rank.shape == (N,)
    picks = np.sort(t.topk_ids, axis=2)
    assert np.all(np.diff(picks, axis=2) > 0)  # distinct experts within a token's top-k
    groups = t.topk_ids // 32
    for n in range(0, N, 97):
        for lyr in range(L):
            assert len(np.unique(groups[n, lyr])) <= 4  # at most topk_groups groups
    assert np.array_equal(t.token_counts(), t.load())
    assert t.num_windows == 1
    assert np.all(t.counts.sum(axis=2) == N * K)


def test_token_level_sources(routed):
    _, t = routed
    assert t.token_rank.min() == 0 and t.token_rank.max() == 15
    assert np.all(np.diff(t.token_rank) >= 0)  # contiguous blocks
    assert np.all(np.bincount(t.token_rank) == 2048 // 16)
    for r in (0, 9):
        mine = t.topk_ids[t.token_rank == r]
        for lyr in range(t.num_layers):
            assert np.array_equal(t.source_counts[0, lyr, r],
                                  np.bincount(mine[:, lyr].ravel(), minlength=256))


def test_token_level_marginals_within_stated_tolerance(routed):
    target, t = routed
    p = target.load() / target.load().sum(1, keepdims=True)
    assert (8 * p).max() <= 0.5  # the documented range of the bound
    achieved = t.load() / t.load().sum(1, keepdims=True)
    tv = 0.5 * np.abs(achieved - p).sum(axis=1)
    bound = 256 / (2048 * 8)
    assert np.all(tv <= bound), (tv, bound)
    assert t.meta["provenance"]["max_total_variation"] == pytest.approx(tv.max(), abs=1e-6)
    # and far closer than plain multinomial sampling of the same number of picks
    rng = np.random.default_rng(0)
    multi = 0.5 * np.abs(rng.multinomial(2048 * 8, p) / (2048 * 8) - p).sum(axis=1)
    assert tv.mean() < 0.5 * multi.mean()


def test_token_level_near_the_cap_reports_its_distance():
    """A target outside the tested range (an expert wanted by ~every token, hot experts spread
    over more groups than a token may use) still gets valid routing and an honest distance."""
    target = synth.zipf(3, 64, tokens=4096, top_k=4, skew=(1.2, 1.2), seed=1)
    t = synth.token_level(target, num_tokens=1024, num_groups=4, topk_groups=2, top_k=4,
                          num_ranks=4, seed=2)
    p = synth.cap_shares(target.load() / target.load().sum(1, keepdims=True), 4)
    tv = 0.5 * np.abs(t.load() / (1024 * 4) - p).sum(axis=1)
    assert t.meta["provenance"]["max_total_variation"] == pytest.approx(tv.max(), abs=1e-6)
    assert t.load().max() <= 1024  # an expert is picked at most once per token
    assert np.all(np.diff(np.sort(t.topk_ids, axis=2), axis=2) > 0)


def test_token_level_keeps_layer_ids_and_meta(routed):
    target, t = routed
    assert t.layer_ids.tolist() == target.layer_ids.tolist()
    assert t.meta["num_model_layers"] == 61
    assert t.meta["num_groups"] == 8 and t.meta["topk_groups"] == 4 and t.meta["top_k"] == 8


def test_token_level_deterministic_and_array_target():
    load = np.random.default_rng(0).integers(1, 100, size=(2, 16)).astype(float)
    a = synth.token_level(load, num_tokens=64, num_groups=4, topk_groups=2, top_k=2,
                          num_ranks=2, seed=5)
    b = synth.token_level(load, num_tokens=64, num_groups=4, topk_groups=2, top_k=2,
                          num_ranks=2, seed=5)
    assert a.equals(b) and isinstance(a, Trace)


@pytest.mark.parametrize("kwargs, match", [
    ({"num_groups": 3}, "must divide"),
    ({"topk_groups": 9}, "exceeds num_groups"),
    ({"top_k": 70, "topk_groups": 2}, "top_k 70 exceeds the 64 experts"),
])
def test_token_level_bad_arguments(kwargs, match):
    load = np.ones((1, 256))
    with pytest.raises(TraceError, match=match):
        synth.token_level(load, num_tokens=8, **kwargs)


def test_token_level_takes_routing_from_the_target_meta():
    """`token_level` without top_k / groups follows the target trace's meta (a top-6 target
    gives top-6 tokens); given values still win; a bare array keeps DeepSeek-V3's defaults."""
    from eplb.traces import Trace
    from eplb.traces.synth import token_level

    rng = np.random.default_rng(0)
    load = rng.random((1, 2, 48)) * 100 + 1
    target = Trace(load, meta={"top_k": 6, "num_groups": 4, "topk_groups": 2})
    tok = token_level(target, num_tokens=64, num_ranks=4)
    assert tok.topk_ids.shape[2] == 6 and tok.meta["top_k"] == 6
    assert (tok.meta["num_groups"], tok.meta["topk_groups"]) == (4, 2)
    assert token_level(target, num_tokens=64, num_ranks=4, top_k=3).topk_ids.shape[2] == 3
    bare = token_level(load[0], num_tokens=64, num_ranks=4)
    assert bare.topk_ids.shape[2] == 8 and bare.meta["num_groups"] == 8


@pytest.mark.parametrize("p", [[3.4e38, 9.4e-271], [0.5, 0.2], [[0.5, 0.5], [2.0, 0.0]]])
def test_cap_shares_refuses_rows_that_are_not_shares(p):
    """Rows that do not sum to 1 (once an overflow warning and an infinite scale) are refused
    with the fix."""
    with pytest.raises(TraceError, match="rows must sum to 1.*divide each row by its sum"):
        synth.cap_shares(np.array(p), 1)
