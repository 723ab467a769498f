"""Workload: validation, summary, readers/writers (real files, round trips, bad-input corpus),
generators and rescale."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from eplb.errors import InputError
from eplb.evaluation.serving import workload as W
from eplb.evaluation.serving.workload import Workload


def frame(**cols):
    base = {
        "arrival_s": [0.0, 1.0, 2.0],
        "input_tokens": [10, 600, 1100],
        "output_tokens": [1, 2, 3],
    }
    base.update(cols)
    return pd.DataFrame(base)


# ------------------------------------------------------------------ model
def test_columns_dtypes_ids_and_stable_sort():
    w = Workload(frame(arrival_s=[2.0, 1.0, 1.0], request_id=[7, 8, 9]))
    df = w.requests
    assert list(df.columns) == ["request_id", "arrival_s", "input_tokens", "output_tokens"]
    assert df["request_id"].tolist() == [8, 9, 7]  # sorted by arrival, ties in file order
    assert df["arrival_s"].dtype == np.float64 and df["input_tokens"].dtype == np.int64
    assert any("not in arrival order" in n for n in w.meta["notes"])
    w2 = Workload(frame(input_tokens=[10.0, 600.0, 1100.0]))  # integral floats are fine
    assert w2.requests["request_id"].tolist() == [0, 1, 2] and "notes" not in w2.meta
    assert len(w2) == 3 and len(w2.head(2)) == 2 and w2.head(2).requests["arrival_s"].max() == 1


@pytest.mark.parametrize(
    "cols, frags",
    [
        ({"input_tokens": [10, -5, 3]}, ["'input_tokens'", "row 1", ">= 1"]),
        ({"output_tokens": [1, 0, 3]}, ["'output_tokens'", "row 1", ">= 1"]),
        ({"input_tokens": [10, np.nan, 3]}, ["'input_tokens'", "row 1", "missing or not finite"]),
        ({"input_tokens": [10, 1e20, 3]}, ["'input_tokens'", "unit"]),
        ({"input_tokens": [10, 2.5, 3]}, ["'input_tokens'", "whole number"]),
        ({"input_tokens": ["10", "abc", "3"]}, ["'input_tokens'", "'abc'", "not a number"]),
        ({"input_tokens": [True, False, True]}, ["'input_tokens'", "booleans"]),
        ({"arrival_s": [0.0, np.inf, 1.0]}, ["'arrival_s'", "finite"]),
        ({"arrival_s": [0.0, -1.0, 1.0]}, ["'arrival_s'", ">= 0"]),
        ({"request_id": [1, 1, 2]}, ["'request_id'", "unique"]),
        ({"request_id": [1, 2.5, 3]}, ["'request_id'", "integer"]),
        ({"session": [1, None, 2]}, ["'session'", "missing"]),
        ({"block_hashes": [[1], "1 2", [3]]}, ["'block_hashes'", "row 1", "list of integer"]),
        ({"block_hashes": [[1], [1.5, 2.0], [3]]}, ["'block_hashes'", "row 1", "float"]),
        ({"block_hashes": [[1], [[1, 2]], [3]]}, ["'block_hashes'", "row 1", "list"]),
        ({"block_hashes": [[1], [True], [3]]}, ["'block_hashes'", "row 1", "bool"]),
        ({"block_hashes": [[1], [2**64], [3]]}, ["'block_hashes'", "64-bit"]),
        (
            {"block_hashes": [[1, 2], [1], [3]]},
            ["'block_hashes'", "row 0", "2 blocks", "block_size"],
        ),
    ],
)
def test_constructor_names_the_column_and_fix(cols, frags):
    with pytest.raises(InputError) as info:
        Workload(frame(**cols))
    msg = str(info.value)
    for f in frags:
        assert f in msg, msg
    assert "\n" not in msg


def test_missing_columns_and_bad_arguments():
    with pytest.raises(InputError, match="lacks column.*'output_tokens'"):
        Workload(pd.DataFrame({"arrival_s": [0.0], "input_tokens": [1]}))
    with pytest.raises(InputError, match="DataFrame"):
        Workload({"arrival_s": [0.0]})
    with pytest.raises(InputError, match="block_size"):
        Workload(frame(), block_size=0)


def test_hashes_stored_as_int64_arrays_none_means_no_blocks():
    w = Workload(frame(block_hashes=[[1], None, np.array([5, 6, 7], dtype=np.uint32)]))
    col = w.requests["block_hashes"]
    assert [h.tolist() for h in col] == [[1], [], [5, 6, 7]]
    assert all(h.dtype == np.int64 for h in col)


def test_summary_by_hand():
    # blocks of 512: r0 [1,2] (input 1000); r1 shares block 1 only; r2 repeats r0 exactly;
    # r3 shares nothing (hashes are prefix-chained: an id never reappears under another parent)
    w = Workload(
        pd.DataFrame(
            {
                "arrival_s": [0.0, 1.0, 3.0, 4.0],
                "input_tokens": [1000, 700, 1000, 600],
                "output_tokens": [5, 10, 15, 20],
                "block_hashes": [[1, 2], [1, 3], [1, 2], [5, 6]],
            }
        )
    )
    s = w.summary()
    assert s["count"] == 4 and s["span_s"] == 4.0 and s["rate_rps"] == 0.75
    assert w.cached_tokens().tolist() == [0, 512, 1000, 0]
    assert s["prefix_hit_rate"] == pytest.approx(1512 / 3300)
    assert s["input_p50"] == 850.0 and s["output_max"] == 20 and s["output_mean"] == 12.5
    # a one-block cache keeps only block 1 (a path longer than the capacity keeps its prefix)
    assert w.cached_tokens(capacity_blocks=1).tolist() == [0, 512, 512, 0]
    assert w.cached_tokens(capacity_blocks=0).tolist() == [0, 0, 0, 0]
    assert Workload(frame()).summary()["prefix_hit_rate"] == 0.0


# ------------------------------------------------------------------ real files
def test_mooncake_real(mooncake_jsonl):
    w = W.read(mooncake_jsonl)
    s = w.summary()
    assert s["count"] == 12031  # the README's figures
    assert round(s["input_mean"]) == 12035 and round(s["output_mean"]) == 343
    assert w.requests["arrival_s"].iloc[0] == 0.0 and "notes" not in w.meta
    assert s["span_s"] == pytest.approx(3536.999)
    assert 0.3 < s["prefix_hit_rate"] < 0.45  # measured 0.3736 (unbounded cache)


def test_mooncake_hit_rate_equals_an_independent_prefix_count(mooncake_jsonl):
    hit = total = 0
    seen: set = set()
    with open(mooncake_jsonl) as fh:
        for line in fh:
            r = json.loads(line)
            k = 0
            while k < len(r["hash_ids"]) and r["hash_ids"][k] in seen:
                k += 1
            hit += min(512 * k, r["input_length"])
            total += r["input_length"]
            seen.update(r["hash_ids"])
    w = W.read(mooncake_jsonl)
    assert int(w.cached_tokens().sum()) == hit
    assert w.summary()["prefix_hit_rate"] == hit / total


def test_azure_real(azure_csv):
    w = W.read(azure_csv)
    a = w.requests["arrival_s"].to_numpy()
    assert len(w) == 8819 and a[0] == 0.0 and not w.has_hashes
    # 18:17:03.9799600 -> 18:17:04.0319600: 0.052 s; 7 fractional digits kept
    assert a[1] == pytest.approx(0.052, abs=1e-9) and a[2] == pytest.approx(0.098189, abs=1e-9)
    assert w.requests["input_tokens"].iloc[0] == 4808 and w.meta["provenance"]["format"] == "azure"


# ------------------------------------------------------------------ round trips
@st.composite
def workloads(draw):
    n = draw(st.integers(1, 12))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    inp = rng.integers(1, 3000, size=n)
    gaps = rng.exponential(1.0, size=n) if draw(st.booleans()) else np.zeros(n)
    cols = {
        "request_id": rng.permutation(1000)[:n],
        "arrival_s": np.cumsum(gaps),
        "input_tokens": inp,
        "output_tokens": rng.integers(1, 500, size=n),
    }
    if draw(st.booleans()):
        cols["block_hashes"] = [
            rng.integers(-(2**62), 2**62, size=rng.integers(0, -(-x // 512) + 1)) for x in inp
        ]
    if draw(st.booleans()):
        cols["session"] = rng.integers(0, 3, size=n)
    return Workload(pd.DataFrame(cols), meta={"k": "v"})


@given(w=workloads(), fmt=st.sampled_from(["csv", "parquet"]))
def test_csv_parquet_round_trip(tmp_path_factory, w, fmt):
    path = tmp_path_factory.mktemp("rt") / f"w.{fmt}"
    W.write(w, path)
    back = W.read(path)
    assert back.equals(w)
    assert W.sniff(path) == fmt
    if fmt == "parquet":
        assert back.meta["k"] == "v"


def test_mooncake_round_trip_and_block_size(tmp_path):
    w = W.synthesize(50, rate=3, hit_rate=0.3, seed=2)
    W.write(w, tmp_path / "w.jsonl")
    back = W.read(tmp_path / "w.jsonl")
    df, bf = w.requests, back.requests
    for c in ("input_tokens", "output_tokens"):
        assert bf[c].tolist() == df[c].tolist()
    np.testing.assert_allclose(bf["arrival_s"], df["arrival_s"], rtol=0, atol=1e-9)
    assert all(
        np.array_equal(a, b) for a, b in zip(bf["block_hashes"], df["block_hashes"], strict=True)
    )
    assert back.summary()["prefix_hit_rate"] == pytest.approx(w.summary()["prefix_hit_rate"])
    assert "session" in W.dropped(w, "mooncake") and "request_id" not in W.dropped(w, "mooncake")
    w64 = W.synthesize(20, seed=1, block_size=64)
    W.write(w64, tmp_path / "b.parquet")
    assert W.read(tmp_path / "b.parquet").block_size == 64  # recorded in the file
    with pytest.raises(InputError, match="block_size"):  # more hashes than 4096-token blocks
        W.read(tmp_path / "w.jsonl", block_size=4096)


def test_csv_accepts_space_separated_hashes(tmp_path):
    p = tmp_path / "w.csv"
    p.write_text("arrival_s,input_tokens,output_tokens,block_hashes\n0,1000,5,1 2\n1,10,5,\n")
    w = W.read(p)
    assert [h.tolist() for h in w.requests["block_hashes"]] == [[1, 2], []]


# ------------------------------------------------------------------ bad-input corpus
def _bad(path, *frags, **kw):
    with pytest.raises(InputError) as info:
        W.read(path, **kw)
    msg = str(info.value)
    assert str(path) in msg, msg
    for f in frags:
        assert f in msg, msg
    assert "\n" not in msg
    return msg


def _jsonl(tmp_path, lines, name="w.jsonl"):
    p = tmp_path / name
    p.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return p


REC = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}


def test_truncated_jsonl(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps(REC) + "\n" + json.dumps(REC)[:25])
    _bad(p, "line 2", "truncated")
    q = _jsonl(tmp_path, [REC, "{oops", REC], name="mid.jsonl")
    _bad(q, "line 2", "not valid JSON")


def test_non_monotone_timestamps_are_sorted_with_a_note(tmp_path):
    recs = [dict(REC, timestamp=t, input_length=600 + i) for i, t in enumerate([0, 500, 200])]
    w = W.read(_jsonl(tmp_path, recs))
    assert w.requests["input_tokens"].tolist() == [600, 602, 601]
    assert w.requests["arrival_s"].tolist() == [0.0, 0.2, 0.5]
    assert any("sorted by arrival_s" in n for n in w.meta["notes"])


@pytest.mark.parametrize(
    "rec, frags",
    [
        ({"input_length": -3}, ["input_length", "-3", ">= 1"]),
        ({"output_length": 0}, ["output_length", ">= 1"]),
        ({"input_length": 1e15}, ["input_length", "unit"]),
        ({"input_length": "600"}, ["input_length", "expected a number"]),
        ({"timestamp": -5}, ["timestamp", ">= 0"]),
        ({"hash_ids": "1 2"}, ["hash_ids", "list of integers"]),
        ({"hash_ids": [1, "2"]}, ["hash_ids", "integers"]),
        ({"hash_ids": [1, 2.5]}, ["hash_ids", "integers"]),
        ({"hash_ids": [1, 2, 3]}, ["3 blocks", "block_size"]),
        ({"hash_ids": [1, 2**70]}, ["64-bit"]),
    ],
)
def test_bad_mooncake_values(tmp_path, rec, frags):
    _bad(_jsonl(tmp_path, [REC, dict(REC, **rec)]), *frags)


def test_bad_mooncake_structure(tmp_path):
    _bad(_jsonl(tmp_path, [REC, [1, 2]]), "line 2", "expected an object")
    _bad(_jsonl(tmp_path, [{"timestamp": 0, "input_length": 5}]), "line 1", "'output_length'")
    _bad(
        _jsonl(tmp_path, [REC, {k: v for k, v in REC.items() if k != "hash_ids"}]),
        "line 2",
        "hash_ids",
    )
    _bad(_jsonl(tmp_path, ["", "  "]), "whitespace")


def test_nan_in_csv_and_mooncake(tmp_path):
    p = tmp_path / "n.csv"
    p.write_text("arrival_s,input_tokens,output_tokens\n0,10,5\n1,nan,5\n")
    _bad(p, "'input_tokens'", "row 1")
    q = tmp_path / "n.jsonl"
    q.write_text('{"timestamp": NaN, "input_length": 5, "output_length": 1}\n')
    _bad(q, "timestamp")


def test_empty_files(tmp_path):
    for name in ("e.jsonl", "e.csv", "e.parquet", "e"):
        (tmp_path / name).write_bytes(b"")
        _bad(tmp_path / name, "empty")
    (tmp_path / "h.csv").write_text("arrival_s,input_tokens,output_tokens\n")
    _bad(tmp_path / "h.csv", "no requests")


def test_fifo_directory_and_missing(tmp_path):
    _bad(tmp_path, "is a directory")
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    _bad(fifo, "FIFO")  # refused before open(): would block forever otherwise
    with pytest.raises(InputError, match="does not exist"):
        W.read(tmp_path / "nope.jsonl")


def test_azure_bad_rows(tmp_path):
    p = tmp_path / "a.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,5,-1\n")
    _bad(p, "GeneratedTokens", ">= 1")
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,5,1\n")
    _bad(p, "row 1", "TIMESTAMP", "YYYY-MM-DD")
    p.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:05.5,5,1\n2023-11-16 18:17:03.25,7,1\n"
    )
    w = W.read(p)  # out of order: sorted, relative to the earliest
    assert w.requests["arrival_s"].tolist() == [0.0, 2.25] and w.meta["notes"]


def test_unknown_and_mislabelled_formats(tmp_path):
    p = tmp_path / "x.txt"
    p.write_text("hello,world\n1,2\n")
    _bad(p, "unknown workload format", "format=")
    q = tmp_path / "x.parquet"
    q.write_text("arrivals?\n")
    _bad(q, "PAR1")
    w = W.synthesize(5, seed=0)
    W.write(w, tmp_path / "ok.parquet")
    data = (tmp_path / "ok.parquet").read_bytes()
    (tmp_path / "cut.parquet").write_bytes(data[: len(data) // 2])
    _bad(tmp_path / "cut.parquet", "truncated")
    with pytest.raises(InputError, match="unknown workload format 'xml'"):
        W.read(tmp_path / "ok.parquet", format="xml")
    with pytest.raises(InputError, match="suffix"):
        W.write(w, tmp_path / "w.txt")


# ------------------------------------------------------------------ generators
def test_poisson_and_gamma_arrivals():
    n = 20000
    a = W.poisson_arrivals(n, 4.0, seed=1)
    assert a[0] == 0 and np.all(np.diff(a) >= 0)
    assert (n - 1) / a[-1] == pytest.approx(4.0, rel=0.03)  # 1/sqrt(n) = 0.7%
    gaps = np.diff(W.gamma_arrivals(n, 4.0, 2.5, seed=1))
    assert 1 / gaps.mean() == pytest.approx(4.0, rel=0.06)
    assert gaps.std() / gaps.mean() == pytest.approx(2.5, rel=0.1)
    g1 = np.diff(W.gamma_arrivals(n, 4.0, 1.0, seed=1))
    assert g1.std() / g1.mean() == pytest.approx(1.0, rel=0.05)  # cv 1 is exponential
    assert np.array_equal(a, W.poisson_arrivals(n, 4.0, seed=1))
    assert not np.array_equal(a, W.poisson_arrivals(n, 4.0, seed=2))
    x = W.lognormal_lengths(n, 2000, 1.0, seed=3)
    assert x.min() >= 1 and x.mean() == pytest.approx(2000, rel=0.05)


@pytest.mark.parametrize("target, sys", [(0.2, 0), (0.563, 4), (0.8, 0)])
def test_hit_rate_target_is_realised(target, sys):
    """The unbounded-cache hit rate (an independent KVStore replay) lands within 0.01 of the
    target on 3,000 requests (the bisection stops within 0.002 on the drawn requests)."""
    w = W.synthesize(
        3000,
        rate=5,
        hit_rate=target,
        system_prompts=sys,
        system_prompt_tokens=1024 if sys else 0,
        seed=7,
    )
    realised = w.summary()["prefix_hit_rate"]
    assert abs(realised - target) <= 0.01
    assert realised == pytest.approx(w.meta["generator"]["hit_rate_realised"], abs=1e-12)


def test_sessions_grow_their_context_and_keep_order():
    w = W.synthesize(800, rate=2, session_prob=0.7, seed=4)
    df = w.requests
    grew = 0
    for _, g in df.groupby("session"):
        assert g["arrival_s"].is_monotonic_increasing
        inp = g["input_tokens"].to_numpy()
        grew += int((np.diff(inp) > 0).sum())
        h = list(g["block_hashes"])
        for a, b, n in zip(h, h[1:], inp[:-1], strict=False):
            full = n // 512
            assert b[:full].tolist() == a[:full].tolist()  # next turn extends the last prompt
    assert grew > 100
    assert w.summary()["prefix_hit_rate"] > 0.3
    again = W.synthesize(800, rate=2, session_prob=0.7, seed=4)
    assert again.equals(w)


def test_system_prompts_alone_and_unreachable_targets():
    w = W.synthesize(400, system_prompts=2, system_prompt_tokens=2048, input_mean=500, seed=0)
    hs = w.requests["block_hashes"]
    firsts = {tuple(h[:4].tolist()) for h in hs}
    assert len(firsts) == 2 and w.summary()["prefix_hit_rate"] > 0.5
    with pytest.raises(InputError, match="below"):
        W.synthesize(
            400, system_prompts=2, system_prompt_tokens=2048, input_mean=500, hit_rate=0.1, seed=0
        )
    with pytest.raises(InputError, match="out of reach"):
        W.synthesize(400, hit_rate=0.95, max_input_tokens=4096, seed=0)
    with pytest.raises(InputError, match="not both"):
        W.synthesize(10, hit_rate=0.3, session_prob=0.3)
    with pytest.raises(InputError, match="arrival process"):
        W.synthesize(10, arrival="weibull")
    with pytest.raises(InputError, match="rate"):
        W.synthesize(10, rate=0)


def test_empirical_lengths_and_rate_change_keeps_other_draws():
    src = W.synthesize(300, input_mean=900, seed=5)
    w = W.synthesize(500, lengths_from=src, seed=6)
    pairs = set(zip(src.requests["input_tokens"], src.requests["output_tokens"], strict=True))
    assert set(zip(w.requests["input_tokens"], w.requests["output_tokens"], strict=True)) <= pairs
    fast = W.synthesize(500, lengths_from=src, rate=9.0, seed=6)
    assert fast.requests["input_tokens"].tolist() == w.requests["input_tokens"].tolist()


def test_rescale():
    w = W.synthesize(1000, rate=2, arrival="gamma", cv=3, session_prob=0.5, seed=3)
    fast = W.rescale(w, rate=8.0)
    s = fast.summary()
    assert s["rate_rps"] == pytest.approx(8.0, rel=1e-9)
    assert fast.requests["request_id"].tolist() == w.requests["request_id"].tolist()
    assert W.rescale(w, speedup=3).summary()["rate_rps"] == pytest.approx(
        3 * w.summary()["rate_rps"], rel=1e-9
    )
    p = W.rescale(w, rate=5.0, how="poisson", seed=1)
    assert p.requests["request_id"].tolist() == w.requests["request_id"].tolist()
    assert p.summary()["rate_rps"] == pytest.approx(5.0, rel=0.1)
    assert any("Poisson" in n for n in p.meta["notes"])
    same = Workload(frame(arrival_s=[0.0, 0.0, 0.0]))
    with pytest.raises(InputError, match="poisson"):
        W.rescale(same, speedup=2)
    assert W.rescale(same, rate=1.0, how="poisson").summary()["span_s"] > 0
    with pytest.raises(InputError, match="exactly one"):
        W.rescale(w, rate=1, speedup=2)
    with pytest.raises(InputError, match="speedup"):
        W.rescale(w, speedup=-1)
