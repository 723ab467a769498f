"""A summary that never contradicts itself (issue 34 part 1): the overload verdict comes from
the window in which requests arrive and names the bottleneck tier; requests cut off by the
end are censored, never counted as misses; the drain after arrivals; rate-sweep columns;
fractions' intervals within [0, 1]; byte counts with units."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eplb.errors import InputError
from eplb.evaluation import serving
from eplb.evaluation.serving import sweep
from eplb.evaluation.serving import workload as W
from eplb.evaluation.serving.config import KVConfig, UnitConfig
from eplb.evaluation.serving.intervals import ci_table, fraction_ci, mean_ci, proportion_ci
from eplb.evaluation.serving.results import verdict
from eplb.format import data_size
from tests.test_serving_capacity import tiny

# ~2,000-token prompts with short outputs: one tiny() prefill unit serves about 20 req/s
PROMPTS = dict(input_mean=2000, output_mean=16, input_sigma=0.2, output_sigma=0.2,
               hit_rate=0.0, open_sessions=64, seed=1)


def run(cfg, wl, **kw):
    return serving.simulate(cfg, wl, seed=0, progress=False, **kw)


@pytest.fixture(scope="module")
def burst():
    """300 requests offered at 60 req/s (3x what prefill serves), then nothing: the queue
    drains after arrivals stop (the README's Day-6 example at --rate 40, small)."""
    return run(tiny(), W.synthesize(300, rate=60.0, **PROMPTS), duration_s=60.0)


# ------------------------------------------------------------------ the overload verdict
def test_overloaded_run_says_so_from_the_arrival_window(burst):
    s = burst.summary()
    assert s["overloaded"] and s["bottleneck"] == "prefill"
    # the window is the 5 s in which requests arrived, not the drained run (60 s of duration)
    last = burst.requests["arrival_s"].max()
    assert s["arrival_window_s"] == pytest.approx(last, rel=1e-9)
    assert s["duration_s"] == pytest.approx(last, rel=1e-9)
    assert s["arrivals_per_s"] > 2 * s["prefills_per_s"]
    assert s["waiting_at_end"] > 0.3 * s["requests"]
    assert s["backlog_growth_per_s"] > 0.5 * s["arrivals_per_s"]
    assert s["prefill_busy"] > verdict.BUSY
    # everything admitted was drained (a benchmark client waits): no censoring, no lower bound
    assert s["requests_finished"] == s["requests"] == 300 and s["censored"] == 0
    assert s["lower_bounds"] == "" and s["drain_s"] > 0
    # the figures beside the verdict agree with it: TTFT far above the SLO, goodput low
    assert s["ttft_p50_s"] > s["slo_ttft_s"] and s["goodput"] < 0.5
    text = burst.summary_table()
    line = text.splitlines()[-1]
    assert line.startswith("verdict: OVERLOADED, bottleneck prefill")
    assert f"{s['arrivals_per_s']:.3g} req/s arrived" in line


def test_the_drained_tail_does_not_hide_the_overload(burst):
    """The old rule compared the queue at the start and the end of the whole run: it said
    "not overloaded" once the burst had drained. Over the whole run the queue is empty at
    both ends; over the arrival window it grew."""
    req = burst.requests
    end = burst.meta["end_s"]
    assert int((req["first_token_s"] > end).sum()) == 0  # empty at the run's end
    s = burst.summary(window=(0.0, end))  # even asked for the whole run
    assert s["overloaded"] and s["duration_s"] == pytest.approx(end)
    assert s["arrival_window_s"] == pytest.approx(req["arrival_s"].max(), rel=1e-9)


def test_light_load_is_not_overloaded_even_with_a_late_burst():
    """5 req/s for 40 s, then 30 requests in the last half second (the Azure trace at
    --rate 5 ends so): the backlog at the end of arrivals is large, but its trend over the
    window is not, and the burst clears in a few seconds."""
    calm = W.synthesize(200, rate=5.0, **PROMPTS).requests
    t_end = calm["arrival_s"].max()
    late = calm.head(30).copy()
    late["arrival_s"] = t_end + np.linspace(0.01, 0.5, 30)
    late["request_id"] = late["request_id"] + 10_000
    late["session"] = late["session"].astype(str) + "late"
    wl = W.Workload(pd.concat([calm, late], ignore_index=True))
    res = run(tiny(), wl)
    s = res.summary()
    assert s["waiting_at_end"] - s["waiting_at_start"] > verdict.GROWTH_SHARE * s["requests"]
    assert not s["overloaded"] and s["bottleneck"] == ""
    assert s["goodput"] == pytest.approx(1.0)
    assert res.summary_table().splitlines()[-1].startswith("verdict: not overloaded")


def test_the_bottleneck_tier_decode_and_kv_transfer():
    wl = W.synthesize(200, rate=12.0, **{**PROMPTS, "output_mean": 300})
    base = tiny()
    few = base.replace(decode=UnitConfig(**{**base.decode.__dict__, "max_running_requests": 2}))
    s = run(few, wl, duration_s=10.0, drain_s=0.0).summary()
    assert s["overloaded"] and s["bottleneck"] == "decode", s
    assert s["decode_full"] >= verdict.FULL
    slow = base.replace(kv=KVConfig(**{**base.kv.__dict__, "transfer_gbps": 0.05}))
    s = run(slow, W.synthesize(200, rate=12.0, **PROMPTS), duration_s=10.0,
            drain_s=0.0).summary()
    assert s["overloaded"] and s["bottleneck"] == "kv_transfer", s
    assert s["kv_transfers_per_s"] < 0.5 * s["prefills_per_s"]


# ------------------------------------------------------------------ cut-off is not a miss
def test_requests_cut_off_are_censored_never_misses():
    """30-token outputs at light load, arrivals for 8 s: cut at 8 s (``drain_s=0``) the late
    requests are still decoding within both SLOs; they are censored, not misses, so goodput
    is what the drained run (the default) measures."""
    wl = W.synthesize(80, rate=10.0, **{**PROMPTS, "output_mean": 30})
    cut = run(tiny(), wl, duration_s=8.0, drain_s=0.0)
    full = run(tiny(), wl, duration_s=8.0)
    c, f = cut.summary(), full.summary()
    assert c["censored"] > 0 and c["requests_finished"] < c["requests"]
    assert c["requests_decided"] == c["requests"] - c["censored"]
    assert f["censored"] == 0 and f["requests_finished"] == f["requests"] == c["requests"]
    assert f["goodput"] == pytest.approx(1.0) and c["goodput"] == pytest.approx(1.0)
    assert "censored, reported apart" in cut.summary_table()
    # the drain: the run went on after arrivals stopped, within its cap
    assert 0 < f["drain_s"] <= f["drain_cap_s"] == 600.0 and c["drain_cap_s"] == 0.0
    assert cut.meta["end_s"] == 8.0 and full.meta["end_s"] > 8.0
    # nothing happens differently before 8 s: the same steps start there
    a = cut.steps[cut.steps["start_s"] < 8.0]
    b = full.steps[full.steps["start_s"] < 8.0]
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))


def test_slo_outcomes_by_hand():
    """Each case once: met; TTFT missed; TPOT missed; no first token after more than the TTFT
    SLO (a certain miss); no first token yet within it (censored); decoding within both
    (censored); decoding already past the TPOT SLO per token to come (a certain miss)."""
    nan = math.nan
    sel = pd.DataFrame({
        "arrival_s": [0.0, 0.0, 0.0, 0.0, 9.5, 5.0, 0.0],
        "first_token_s": [1.0, 3.0, 1.0, nan, nan, 6.0, 1.0],
        "finish_s": [2.0, 4.0, 30.0, nan, nan, nan, nan],
        "output_tokens": [11, 11, 11, 11, 11, 101, 5],
    })
    out = verdict.slo_outcomes(sel, end=10.0, slo_ttft=2.0, slo_tpot=1.0)
    assert out["met"].tolist() == [True, False, False, False, False, False, False]
    assert out["miss_ttft"].tolist() == [False, True, False, True, False, False, False]
    assert out["miss_tpot"].tolist() == [False, False, True, False, False, False, True]
    assert out["censored"].tolist() == [False, False, False, False, True, True, False]
    assert (out["decided"] == ~out["censored"]).all()


def test_drain_is_checked_and_bounded():
    wl = W.synthesize(20, rate=10.0, **PROMPTS)
    for bad in (-1.0, math.inf, math.nan, True, "1"):
        with pytest.raises(InputError, match="drain_s"):
            serving.simulate(tiny(), wl, duration_s=1.0, drain_s=bad, progress=False)
    res = run(tiny(), wl, duration_s=1.0, drain_s=0.5)
    assert res.meta["end_s"] <= 1.5 and res.meta["drain_cap_s"] == 0.5


# ------------------------------------------------------------------ sweeps
def test_rate_sweep_columns_and_throughput_over_the_arrival_window():
    """The table gains overloaded and served_fraction; tok/s per node is measured while
    requests arrive, so one long request no longer sets it at every rate."""
    base = W.synthesize(60, rate=4.0, **PROMPTS).requests
    base.loc[0, "output_tokens"] = 3000  # one long request, decoding long after the others
    wl = W.Workload(base)
    frame = sweep.rate_sweep([tiny()], wl, [2.0, 8.0, 80.0], progress=False)
    assert {"overloaded", "served_fraction", "bottleneck", "censored"} <= set(frame.columns)
    assert frame["overloaded"].tolist() == [0.0, 0.0, 1.0]
    assert frame["bottleneck"].tolist()[2] == "prefill"
    tok = frame["output_tok_s_per_node"].to_numpy()
    assert tok[1] > 1.5 * tok[0]  # 4x the rate, not both set by the long request
    text = sweep.sweep_table(frame)
    head = text.splitlines()[0]
    assert "overloaded (yes/no)" in head and "served_fraction (fraction)" in head
    rows = text.splitlines()[2:]
    assert " no " in rows[0] and "yes (prefill)" in rows[2]


# ------------------------------------------------------------------ intervals, bytes
def test_wilson_interval_known_value_and_bounds():
    p, lo, hi = proportion_ci([0.9], [10])
    assert (p, round(lo, 4), round(hi, 4)) == (0.9, 0.5958, 0.9821)  # Wilson, 9 of 10
    p, lo, hi = proportion_ci([1.0, 1.0, 1.0], [50, 50, 50])
    assert p == 1.0 and hi == 1.0 and 0.9 < lo < 1.0
    p, lo, hi = proportion_ci([0.0], [20])
    assert p == 0.0 == lo and 0 < hi < 0.2
    # seeds that disagree beyond binomial noise widen it
    same = proportion_ci([0.5, 0.5], [1000, 1000])
    apart = proportion_ci([0.3, 0.7], [1000, 1000])
    assert same[0] == apart[0] == 0.5 and apart[2] - apart[1] > 5 * (same[2] - same[1])
    assert math.isnan(proportion_ci([0.5], [0])[1])
    # without counts: the Student-t interval, kept within [0, 1]
    m, lo, hi = fraction_ci([0.99, 1.0, 0.95])
    assert lo >= 0 and hi == 1.0 and m == pytest.approx(0.98)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 200), st.integers(1, 200)), min_size=1, max_size=5))
def test_fraction_intervals_stay_within_0_and_1(pairs):
    k = np.array([min(a, n) for a, n in pairs], dtype=float)
    n = np.array([n for _, n in pairs], dtype=float)
    p, lo, hi = proportion_ci(k / n, n)
    assert 0.0 <= lo <= p <= hi <= 1.0


def test_comparison_table_fraction_interval_within_0_and_1():
    """Three seeds with goodput 1, 1, 0.99 of 100 requests: mean +- t s would reach 1.01."""
    frame = pd.DataFrame({"config": ["a"] * 3 + ["b"] * 3, "seed": [0, 1, 2] * 2,
                          "goodput": [1.0, 1.0, 0.99, 0.5, 0.6, 0.4],
                          "requests_decided": [100.0] * 6})
    table = ci_table(frame, ["goodput"])
    for name in ("a", "b"):
        r = table.loc[name, "goodput"]
        assert 0.0 <= r["lo"] <= r["mean"] <= r["hi"] <= 1.0
    assert mean_ci([1.0, 1.0, 0.99])[2] > 1.0  # what the table printed before
    assert table.loc["a", ("goodput", "mean")] == pytest.approx(299 / 300)
    assert -1.0 <= table.loc["b", ("goodput", "d_lo")] < table.loc["b", ("goodput", "d_hi")]


def test_byte_counts_print_with_units():
    assert data_size(825_181_077_504.0) == "825.2 GB"
    assert data_size(8.769e13) == "87.69 TB"
    assert data_size(44_040_192) == "44.04 MB" and data_size(512) == "512 B"
    assert data_size(2.5e18) == "2,500 PB" and data_size(math.nan) == "nan"
    for x in (1.0, 999.0, 1.5e3, 7e8, 9.99e9, 1.234e12, 6.5e14):
        text = data_size(x)
        assert "e+" not in text and text.split()[-1] in ("B", "kB", "MB", "GB", "TB", "PB")


def test_summary_table_prints_bytes_moved_in_gb(burst):
    res = serving.SimResult(burst.requests, burst.steps, burst.rebalances.copy(),
                            burst.faults, burst.utilisation, dict(burst.meta))
    res.rebalances = pd.DataFrame([{c: 0 for c in res.rebalances.columns}])
    res.rebalances["bytes_moved"] = 825_181_077_504.0
    res.rebalances["kind"] = "scheduled"
    line = next(r for r in res.summary_table().splitlines() if r.startswith("bytes_moved"))
    assert "825.2 GB" in line and "825,181" not in line
