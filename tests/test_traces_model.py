"""The Trace model: construction checks, load/EMA, select, to_frame, summary, equality."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from eplb.errors import TraceError
from eplb.traces import Trace, summary


def _trace(T=3, L=4, E=6, R=None, seed=0, tokens=False):
    rng = np.random.default_rng(seed)
    src = None
    if R:
        src = rng.integers(0, 20, size=(T, L, R, E)).astype(float)
        counts = src.sum(axis=2)
    else:
        counts = rng.integers(0, 50, size=(T, L, E)).astype(float)
    topk = rank = None
    if tokens:
        topk = rng.integers(0, E, size=(7, L, 2))
        rank = rng.integers(0, 3, size=7)
    return Trace(counts, np.arange(10, 10 + L), src, topk, rank,
                 meta={"model": "t", "num_groups": 2, "top_k": 2})


# ------------------------------------------------------------------ load / ema
def test_load_sums_windows_and_accepts_index_slice_list_mask():
    t = _trace()
    assert np.array_equal(t.load(), t.counts.sum(0))
    assert np.array_equal(t.load(1), t.counts[1])
    assert np.array_equal(t.load(slice(0, 2)), t.counts[:2].sum(0))
    assert np.array_equal(t.load([0, 2]), t.counts[[0, 2]].sum(0))
    assert np.array_equal(t.load(np.array([True, False, True])), t.counts[[0, 2]].sum(0))


def test_load_ema_weights_latest_window_most_and_keeps_scale():
    counts = np.zeros((3, 1, 2))
    counts[:, 0, 0] = [1.0, 0.0, 0.0]
    counts[:, 0, 1] = [0.0, 0.0, 1.0]
    t = Trace(counts)
    alpha = 0.5
    w = np.array([alpha * (1 - alpha) ** 2, alpha * (1 - alpha), alpha])
    w *= 3 / w.sum()
    got = t.load(ema=alpha)
    assert got[0, 0] == pytest.approx(w[0]) and got[0, 1] == pytest.approx(w[2])
    assert t.load(ema=alpha).sum() == pytest.approx(t.load().sum() * w[[0, 2]].sum() / 2)
    assert np.allclose(Trace(np.ones((4, 2, 3))).load(ema=0.3), 4.0)  # constant trace: = sum
    with pytest.raises(TraceError, match="ema must be in"):
        t.load(ema=1.5)


def test_load_bad_windows_is_a_trace_error():
    t = _trace()
    with pytest.raises(TraceError, match="not a valid selection"):
        t.load(7)
    with pytest.raises(TraceError, match="selects no window"):
        t.load([])


# ------------------------------------------------------------------ select
def test_select_slices_counts_source_counts_and_layer_ids():
    t = _trace(R=3)
    s = t.select(windows=[2, 0], layers=[13, 11])
    assert np.array_equal(s.counts, t.counts[[2, 0]][:, [3, 1]])
    assert np.array_equal(s.source_counts, t.source_counts[[2, 0]][:, [3, 1]])
    assert s.layer_ids.tolist() == [13, 11]
    assert s.meta == t.meta
    assert np.array_equal(s.source_counts.sum(2), s.counts)


def test_select_keeps_tokens_only_when_all_windows_kept():
    t = _trace(tokens=True)
    by_layer = t.select(layers=[12])
    assert np.array_equal(by_layer.topk_ids, t.topk_ids[:, [2]])
    assert np.array_equal(by_layer.token_rank, t.token_rank)
    assert t.select(windows=slice(None)).topk_ids is not None
    assert t.select(windows=[0, 1]).topk_ids is None  # tokens carry no window


def test_select_unknown_layer_names_the_valid_ids():
    with pytest.raises(TraceError, match=r"layers \[3\] are not in this trace.*10\.\.13"):
        _trace().select(layers=[3])


# ------------------------------------------------------------------ frames
def test_to_frame_long_rows_match_counts():
    t = _trace()
    df = t.to_frame()
    assert list(df.columns) == ["window", "layer", "expert", "count"]
    assert len(df) == t.counts.size
    row = df[(df.window == 2) & (df.layer == 12) & (df.expert == 5)]
    assert row["count"].item() == t.counts[2, 2, 5]
    nz = t.to_frame(nonzero=True)
    assert len(nz) == np.count_nonzero(t.counts) and (nz["count"] > 0).all()
    piv = df.groupby(["layer", "expert"])["count"].sum().unstack().to_numpy()
    assert np.array_equal(piv, t.load())


def test_to_frame_by_rank():
    t = _trace(R=2)
    df = t.to_frame(by_rank=True)
    assert list(df.columns) == ["window", "layer", "expert", "rank", "count"]
    assert df["count"].sum() == t.counts.sum()
    with pytest.raises(TraceError, match="needs source_counts"):
        _trace().to_frame(by_rank=True)


# ------------------------------------------------------------------ summary statistics
def _gini_bruteforce(x):
    x = np.asarray(x, float)
    return np.abs(x[:, None] - x[None, :]).sum() / (2 * len(x) ** 2 * x.mean())


@given(hnp.arrays(np.float64, st.tuples(st.integers(1, 4), st.integers(1, 40)),
                  elements=st.floats(0, 1e6)))
def test_skew_statistics_match_definitions(load):
    load = load.copy()
    load[:, 0] += 1.0  # every row has tokens
    g = summary.gini(load)
    for row, gv in zip(load, g, strict=True):
        assert gv == pytest.approx(_gini_bruteforce(row), abs=1e-9)
        assert summary.max_over_mean(row[None])[0] == pytest.approx(row.max() / row.mean())
        assert summary.cv(row[None])[0] == pytest.approx(row.std() / row.mean())
        k = summary.top_count(len(row), 0.10)
        assert summary.top_share(row[None], 0.10)[0] == pytest.approx(
            np.sort(row)[::-1][:k].sum() / row.sum())


def test_skew_statistics_extremes():
    E = 256
    even = np.ones((1, E))
    hot = np.zeros((1, E))
    hot[0, 7] = 5.0
    assert summary.gini(even)[0] == pytest.approx(0.0, abs=1e-12)
    assert summary.gini(hot)[0] == pytest.approx((E - 1) / E)
    assert summary.max_over_mean(hot)[0] == pytest.approx(E)
    assert summary.top_count(E, 0.01) == 3 and summary.top_count(E, 0.10) == 26
    assert summary.top_share(hot, 0.01)[0] == 1.0
    assert np.isnan(summary.cv(np.zeros((1, 4))))[0]  # no tokens: undefined, not 0


def test_summary_has_one_row_per_layer():
    t = _trace()
    df = t.summary()
    assert isinstance(df, pd.DataFrame) and len(df) == t.num_layers
    assert df["layer"].tolist() == t.layer_ids.tolist()
    assert set(summary.STAT_COLUMNS) <= set(df.columns)
    assert np.allclose(df["tokens"], t.load().sum(1))
    assert np.allclose(t.summary(windows=0)["gini"], summary.gini(t.counts[0]))


# ------------------------------------------------------------------ invariants
def test_source_counts_must_sum_to_counts():
    src = np.ones((1, 2, 3, 4))
    with pytest.raises(TraceError, match="source_counts summed over ranks"):
        Trace(np.ones((1, 2, 4)), source_counts=src)


def test_token_counts_is_the_bincount_of_picks():
    t = _trace(tokens=True)
    tc = t.token_counts()
    for lyr in range(t.num_layers):
        assert np.array_equal(tc[lyr], np.bincount(t.topk_ids[:, lyr].ravel(),
                                                   minlength=t.num_experts))


def test_equals_compares_every_array_and_meta():
    t = _trace(R=2, tokens=True)
    same = Trace(t.counts, t.layer_ids, t.source_counts, t.topk_ids, t.token_rank, dict(t.meta))
    assert t.equals(same)
    other = Trace(t.counts, t.layer_ids, t.source_counts, t.topk_ids, t.token_rank, {"x": 1})
    assert not t.equals(other) and t.equals(other, meta=False)
    assert not t.equals(t.select(windows=[0]))


def test_arrays_are_read_only():
    t = _trace()
    with pytest.raises(ValueError):
        t.counts[0, 0, 0] = 1
