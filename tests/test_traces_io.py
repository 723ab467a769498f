"""Readers and writers: every format, sniffing, round trips, SGLang dumps, real files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from eplb import traces
from eplb.traces import Trace

BUNDLED = Path(__file__).resolve().parents[1] / "traces" / "data"

# ------------------------------------------------------------------ round trips (property)


@st.composite
def trace_strategy(draw, *, sources=None, tokens=None, meta=True):
    T = draw(st.integers(1, 3))
    L = draw(st.integers(1, 4))
    E = draw(st.integers(1, 9))
    ids = draw(st.lists(st.integers(0, 200), min_size=L, max_size=L, unique=True))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    big = draw(st.sampled_from([10, 70000, 2**40]))  # uint16 / uint32 / float64 storage
    with_src = draw(st.booleans()) if sources is None else sources
    src = None
    if with_src:
        R = draw(st.integers(1, 3))
        src = rng.integers(0, big, size=(T, L, R, E)).astype(np.float64)
        counts = src.sum(axis=2)
    else:
        counts = rng.integers(0, big, size=(T, L, E)).astype(np.float64)
        if draw(st.booleans()):
            counts = counts + rng.random(counts.shape)  # non-integer counts
    topk = rank = None
    if (draw(st.booleans()) if tokens is None else tokens) and E >= 2:
        N, K = draw(st.integers(0, 5)), draw(st.integers(1, 2))
        topk = rng.integers(0, E, size=(N, L, K))
        rank = rng.integers(0, 4, size=N)
    m = {"model": "x", "num_groups": 1, "top_k": min(2, E), "nested": {"a": [1, 2.5]}}
    m = m if meta else {}
    return Trace(counts, ids, src, topk, rank, meta=m)


@given(trace_strategy())
def test_npz_round_trip_is_lossless(tmp_path_factory, trace):
    path = tmp_path_factory.mktemp("rt") / "t.npz"
    traces.write(trace, path)
    back = traces.read(path)
    assert back.equals(trace)
    assert back.counts.dtype == np.float64


@given(trace_strategy(tokens=False))
def test_parquet_round_trip_is_lossless_without_tokens(tmp_path_factory, trace):
    pytest.importorskip("pyarrow")
    path = tmp_path_factory.mktemp("rt") / "t.parquet"
    traces.write(trace, path)
    assert traces.read(path).equals(trace)


@given(trace_strategy(tokens=False, meta=False))
def test_csv_round_trip_keeps_counts_layers_and_sources(tmp_path_factory, trace):
    path = tmp_path_factory.mktemp("rt") / "t.csv"
    traces.write(trace, path)
    back = traces.read(path)
    assert back.equals(trace, meta=False)


def test_sglang_json_round_trip_and_dense_padding(tmp_path):
    rng = np.random.default_rng(1)
    t = Trace(rng.integers(1, 9, size=(2, 3, 5)).astype(float), [3, 4, 6],
              meta={"num_model_layers": 8})
    path = tmp_path / "t.json"
    traces.write(t, path)
    doc = json.loads(path.read_text())
    assert list(doc) == ["logical_count"]
    arr = np.array(doc["logical_count"])
    assert arr.shape == (2, 8, 5)
    assert not arr[:, [0, 1, 2, 5, 7]].any()
    back = traces.read(path)
    assert np.array_equal(back.counts, t.counts) and back.layer_ids.tolist() == [3, 4, 6]
    assert back.meta["num_model_layers"] == 8


def test_writers_are_atomic_and_leave_no_temp_files(tmp_path):
    t = Trace(np.ones((1, 2, 3)))
    for name in ("a.npz", "a.csv", "a.parquet", "a.json"):
        traces.write(t, tmp_path / name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.csv", "a.json", "a.npz",
                                                          "a.parquet"]


def test_dropped_names_what_a_format_cannot_hold():
    t = Trace(np.ones((1, 1, 3)), topk_ids=np.zeros((2, 1, 1), int), token_rank=[0, 0],
              meta={"a": 1})
    assert traces.dropped(t, "npz") == []
    assert "token-level topk_ids/token_rank" in traces.dropped(t, "parquet")
    assert "meta" in traces.dropped(t, "csv")


def test_compact_integer_storage_shrinks_npz(tmp_path):
    t = traces.synth.zipf(8, 64, windows=20, seed=1)
    traces.write(t, tmp_path / "a.npz")
    with np.load(tmp_path / "a.npz") as z:
        assert z["counts"].dtype == np.uint16
    assert traces.read(tmp_path / "a.npz").equals(t)


# ------------------------------------------------------------------ sniffing and SGLang JSON
def test_sniff_uses_content_when_suffix_is_wrong(tmp_path):
    t = Trace(np.arange(6.0).reshape(1, 2, 3) + 1)
    traces.write(t, tmp_path / "a.npz")
    traces.write(t, tmp_path / "b.parquet")
    traces.write(t, tmp_path / "c.json")
    for src, dst in (("a.npz", "a.dat"), ("b.parquet", "b.bin"), ("c.json", "c.txt")):
        shutil.copy(tmp_path / src, tmp_path / dst)
        assert np.array_equal(traces.read(tmp_path / dst).counts, t.counts)
    assert traces.sniff(tmp_path / "a.dat") == "npz"
    assert traces.sniff(tmp_path / "b.bin") == "parquet"
    assert traces.sniff(tmp_path / "c.txt") == "sglang"


def test_sglang_json_2d_3d_and_inline():
    two = {"logical_count": [[0, 0, 0], [1, 2, 3], [4, 5, 6]]}
    t = traces.read(json.dumps(two))  # inline JSON, as --init-expert-location accepts
    assert t.counts.shape == (1, 2, 3) and t.layer_ids.tolist() == [1, 2]
    assert t.meta["num_model_layers"] == 3
    three = {"logical_count": [[[1, 2], [3, 4]], [[5, 6], [7, 8]]]}
    t3 = traces.read(json.dumps(three))
    assert t3.counts.shape == (2, 2, 2) and t3.counts[1, 0, 1] == 6


def test_npy_reader(tmp_path):
    np.save(tmp_path / "a.npy", np.array([[0.0, 0.0], [1.0, 2.0]]))
    t = traces.read(tmp_path / "a.npy")
    assert t.layer_ids.tolist() == [1] and t.meta["num_model_layers"] == 2


def test_long_csv_with_rank_and_sparse_rows(tmp_path):
    path = tmp_path / "long.csv"
    path.write_text("window,layer,expert,rank,count\n"
                    "5,3,0,0,2\n5,3,2,1,4\n7,3,1,0,1\n5,4,1,1,3\n7,4,0,0,9\n")
    t = traces.read(path)
    assert t.counts.shape == (2, 2, 3) and t.layer_ids.tolist() == [3, 4]
    assert t.source_counts.shape == (2, 2, 2, 3)
    assert t.counts[0, 0].tolist() == [2, 0, 4] and t.source_counts[0, 0, 1, 2] == 4
    assert t.counts[1, 1].tolist() == [9, 0, 0]


def test_from_frame_accepts_user_frames():
    import pandas as pd

    df = pd.DataFrame({"Window": [0, 0, 1, 1], "layer": [2, 2, 2, 2], "expert": [0, 1, 0, 1],
                       "count": [1.5, 2, 3, 4]})
    t = traces.from_frame(df)
    assert t.counts.tolist() == [[[1.5, 2.0]], [[3.0, 4.0]]]


# ------------------------------------------------------------------ real files
def test_real_deepseek_sglang_dumps(deepseek_jsons):
    for f in deepseek_jsons:
        t = traces.read(f)
        assert t.counts.shape == (1, 58, 256)
        assert t.layer_ids.tolist() == list(range(3, 61))
        assert t.meta["num_model_layers"] == 61
        picks = t.load().sum(axis=1)
        assert np.all(picks % 8 == 0)  # tokens x top-8 per layer
        assert picks.max() / picks.min() < 1.01  # every MoE layer sees (about) the same tokens


def test_real_qwen_per_rank_directory(qwen_dir):
    d = qwen_dir
    t = traces.read(d)
    assert t.counts.shape == (2, 24, 60)
    assert t.source_counts.shape == (2, 24, 6, 60)
    assert t.layer_ids.tolist() == list(range(24))
    assert np.all(t.source_counts.sum(axis=3) == 8192)  # each rank row: one count per token
    assert t.meta["model"] == "Qwen/Qwen1.5-MoE-A2.7B-Chat"
    first = json.loads((d / "0" / "moe_layer-0.csv").read_text().splitlines()[1]
                       .split(",", 9)[-1].strip('"'))
    assert t.source_counts[0, 0, 0].tolist() == first


def test_real_files_convert_losslessly(qwen_dir, tmp_path):
    t = traces.read(qwen_dir)
    for name in ("q.npz", "q.parquet"):
        traces.write(t, tmp_path / name)
        assert traces.read(tmp_path / name).equals(t)
    traces.write(t, tmp_path / "q.csv")
    assert traces.read(tmp_path / "q.csv").equals(t, meta=False)


def test_bundled_traces_read():
    cal = traces.read(BUNDLED / "deepseek-v3-calibrated.npz")
    assert cal.layer_ids.tolist() == list(range(3, 61)) and cal.num_experts == 256
    assert cal.meta["num_model_layers"] == 61 and cal.meta["num_groups"] == 8
    assert cal.meta["top_k"] == 8 and cal.num_windows >= 4
    tok = traces.read(BUNDLED / "deepseek-v3-tokens.npz")
    assert tok.topk_ids.shape[1:] == (58, 8)
    assert np.array_equal(tok.token_counts(), tok.load())
    p = cal.load(0) / cal.load(0).sum(1, keepdims=True)  # the tokens follow window 0
    tv = 0.5 * np.abs(tok.load() / tok.load().sum(1, keepdims=True) - p).sum(1)
    assert np.all(tv <= 256 / (tok.topk_ids.shape[0] * 8))
    z = traces.read(BUNDLED / "zipf-58x256.npz")
    assert z.counts.shape == (1, 58, 256) and z.meta["num_model_layers"] == 61
    total = sum(p.stat().st_size for p in BUNDLED.iterdir())
    assert total < 3 * 2**20
