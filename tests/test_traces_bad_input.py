"""Bad-input corpus: every malformed trace is a `TraceError` naming the file, field and fix."""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest

from eplb import traces
from eplb.errors import TraceError
from eplb.traces import Trace


def _bad(path, *fragments, format=None):
    """Reading ``path`` raises TraceError whose message names the file and every fragment."""
    with pytest.raises(TraceError) as info:
        traces.read(path, format=format)
    msg = str(info.value)
    assert str(path) in msg, msg
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg!r}"
    assert "\n" not in msg
    return msg


def _json(tmp_path, doc, name="t.json"):
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


# ------------------------------------------------------------------ values
@pytest.mark.parametrize("value, what", [("NaN", "nan"), ("Infinity", "inf"), ("-3", "-3"),
                                         ("null", "nan")])
def test_non_finite_or_negative_counts_in_json(tmp_path, value, what):
    path = _json(tmp_path, '{"logical_count": [[1, 2], [3, ' + value + "]]}")
    msg = _bad(path, "logical_count[1][1]", what)
    assert "finite" in msg or ">= 0" in msg


def test_nan_and_negative_counts_in_npz(tmp_path):
    for bad, frag in ((np.nan, "finite"), (-1.0, ">= 0")):
        counts = np.ones((2, 3, 4))
        counts[1, 2, 3] = bad
        np.savez(tmp_path / "t.npz", counts=counts)
        _bad(tmp_path / "t.npz", "counts[1][2][3]", frag)


def test_negative_counts_in_constructor():
    with pytest.raises(TraceError, match=r"counts\[0, 1, 0\] is -2.0; counts must be >= 0"):
        Trace(np.array([[[1.0], [-2.0]]]))


# ------------------------------------------------------------------ JSON structure
def test_ragged_json(tmp_path):
    path = _json(tmp_path, {"logical_count": [[1, 2, 3], [4, 5]]})
    _bad(path, "logical_count[1]", "has 2 experts", "ragged")


def test_mismatched_layer_counts_between_windows_json(tmp_path):
    path = _json(tmp_path, {"logical_count": [[[1, 2], [3, 4]], [[5, 6]]]})
    _bad(path, "logical_count[1]", "has 1 layers", "earlier entries have 2", "window")


@pytest.mark.parametrize("doc, depth", [([1, 2, 3], "1"), ([[[[1]]]], "4")])
def test_wrong_nesting_depth(tmp_path, doc, depth):
    path = _json(tmp_path, {"logical_count": doc})
    _bad(path, "logical_count", f"nesting depth {depth}", "[layers][experts]")


def test_mixed_nesting_depth(tmp_path):
    path = _json(tmp_path, {"logical_count": [[1, 2], 3]})
    _bad(path, "logical_count[1]", "expected a list")


def test_json_without_logical_count_and_invalid_json(tmp_path):
    _bad(_json(tmp_path, {"counts": [[1]]}), "'logical_count'", "found ['counts']")
    _bad(_json(tmp_path, '{"logical_count": [[1, 2]', "cut.json"), "not valid JSON",
         "truncated")
    _bad(_json(tmp_path, {"logical_count": [[1, "x"]]}, "str.json"), "logical_count[0][1]",
         "expected a number")


# ------------------------------------------------------------------ empty / truncated / pickle
@pytest.mark.parametrize("name", ["t.json", "t.npz", "t.csv", "t.parquet", "t.pt", "t"])
def test_empty_file(tmp_path, name):
    (tmp_path / name).write_bytes(b"")
    _bad(tmp_path / name, "file is empty")


def test_truncated_npz(tmp_path):
    t = traces.synth.zipf(4, 16, windows=3, seed=0)
    traces.write(t, tmp_path / "full.npz")
    data = (tmp_path / "full.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[: len(data) // 2])
    _bad(tmp_path / "cut.npz", "truncated")


def test_pickle_inside_npz_is_refused(tmp_path):
    buf = io.BytesIO()
    np.savez(buf, counts=np.array([{"evil": 1}], dtype=object))
    (tmp_path / "p.npz").write_bytes(buf.getvalue())
    _bad(tmp_path / "p.npz", "pickled", "refused")
    np.savez(tmp_path / "m.npz", counts=np.ones((1, 1, 2)), meta=np.array([{"a": 1}], object))
    _bad(tmp_path / "m.npz", "pickled", "refused")


def test_npz_that_is_not_a_trace(tmp_path):
    np.savez(tmp_path / "x.npz", a=np.ones(3), b=np.ones(2))
    _bad(tmp_path / "x.npz", "no 'counts' array", "write_npz")
    np.savez(tmp_path / "m.npz", counts=np.ones((1, 1, 2)), meta=np.array("{not json"))
    _bad(tmp_path / "m.npz", "meta is not valid JSON")
    np.savez(tmp_path / "s.npz", counts=np.array([["a"]]))
    _bad(tmp_path / "s.npz", "counts holds")


def test_zip_that_is_not_an_npz(tmp_path):
    with zipfile.ZipFile(tmp_path / "z.npz", "w") as zf:
        zf.writestr("readme.txt", "hello")
    _bad(tmp_path / "z.npz", "no 'counts' array", "not an eplb trace")


# ------------------------------------------------------------------ unknown format
def test_unknown_format(tmp_path):
    path = tmp_path / "t.xyz"
    path.write_bytes(b"\x00\x01binary")
    _bad(path, "unknown trace format", "format=")
    with pytest.raises(TraceError, match="unknown trace format 'yaml'"):
        traces.read(path, format="yaml")
    with pytest.raises(TraceError, match="does not exist"):
        traces.read(tmp_path / "missing.npz")


def test_suffix_says_binary_but_content_is_not(tmp_path):
    (tmp_path / "t.parquet").write_text("hello world")
    _bad(tmp_path / "t.parquet", "suffix .parquet", "truncated or mislabelled")


def test_truncated_parquet(tmp_path):
    traces.write(Trace(np.ones((1, 2, 3))), tmp_path / "a.parquet")
    data = (tmp_path / "a.parquet").read_bytes()
    (tmp_path / "b.parquet").write_bytes(data[:40])
    _bad(tmp_path / "b.parquet", "truncated or not a Parquet file")


# ------------------------------------------------------------------ CSV
def _csv(tmp_path, text, name="t.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_csv_missing_columns(tmp_path):
    path = _csv(tmp_path, "window,layer,count\n0,0,1\n")
    _bad(path, "missing column(s) 'expert'", "window, layer, expert, count")


@pytest.mark.parametrize("value", ["2.5", "x", ""])
def test_csv_non_integer_experts(tmp_path, value):
    path = _csv(tmp_path, f"window,layer,expert,count\n0,0,0,1\n0,0,{value},2\n")
    _bad(path, "expert on row 2", "integer")


def test_csv_bad_counts_and_ids(tmp_path):
    _bad(_csv(tmp_path, "window,layer,expert,count\n0,0,0,-1\n", "neg.csv"),
         "count on row 1", ">= 0")
    _bad(_csv(tmp_path, "window,layer,expert,count\n0,0,0,nan\n", "nan.csv"),
         "count on row 1", "finite")
    _bad(_csv(tmp_path, "window,layer,expert,count\n0,0,-1,1\n", "negid.csv"),
         "expert on row 1 is -1")
    _bad(_csv(tmp_path, "window,layer,expert,count\n", "hdr.csv"), "no rows")


def test_csv_duplicate_rows(tmp_path):
    path = _csv(tmp_path, "window,layer,expert,count\n0,0,0,1\n0,0,1,1\n0,0,0,5\n")
    _bad(path, "row 3 repeats", "window=0, layer=0, expert=0")


def test_csv_mismatched_layer_counts_between_windows(tmp_path):
    path = _csv(tmp_path, "window,layer,expert,count\n"
                          "0,3,0,1\n0,4,0,1\n1,3,0,1\n")
    _bad(path, "window 1 has rows for 1 layers", "layer 4 is missing",
         "Mismatched layer counts between windows")


def test_csv_garbage(tmp_path):
    path = _csv(tmp_path, 'window,layer,expert,count\n0,0,0,"1\n')
    with pytest.raises(TraceError, match=str(path)):
        traces.read(path)


# ------------------------------------------------------------------ per-rank directories
def _rankdir(root, ranks=(0, 1, 2), layers=(0, 1), rows=2, E=4):
    for r in ranks:
        (root / str(r)).mkdir(parents=True)
        for lyr in layers:
            lines = ["iteration,latency (ms),expert distribution"]
            for it in range(rows):
                dist = [r + lyr + it + e for e in range(E)]
                lines.append(f'{it},1.5,"{dist}"')
            (root / str(r) / f"moe_layer-{lyr}.csv").write_text("\n".join(lines) + "\n")
    return root


def test_rankdir_reads(tmp_path):
    t = traces.read(_rankdir(tmp_path / "run"))
    assert t.source_counts.shape == (2, 2, 3, 4)
    assert t.source_counts[1, 1, 2].tolist() == [4, 5, 6, 7]  # rank 2, layer 1, iteration 1
    assert np.array_equal(t.counts, t.source_counts.sum(2))


def test_rankdir_missing_rank(tmp_path):
    root = _rankdir(tmp_path / "run", ranks=(0, 1, 3))
    msg = _bad(root, "missing rank folder(s) 2", "expected 0..3")
    assert "copy the missing ranks" in msg


def test_rankdir_missing_rank_by_world_size(tmp_path):
    root = _rankdir(tmp_path / "run", ranks=(0, 1))
    (root / "data.json").write_text(json.dumps({"world_size": 4, "model_name": "m"}))
    _bad(root, "missing rank folder(s) 2, 3", "world_size=4")


def test_rankdir_mismatched_layers_between_ranks(tmp_path):
    root = _rankdir(tmp_path / "run")
    (root / "1" / "moe_layer-1.csv").unlink()
    with pytest.raises(TraceError, match=r"moe_layer-1\.csv.*mismatched layer counts"):
        traces.read(root)


def test_rankdir_bad_rows(tmp_path):
    root = _rankdir(tmp_path / "run")
    f = root / "2" / "moe_layer-0.csv"
    f.write_text('iteration,latency (ms),expert distribution\n0,1.0,"[1, 2, oops]"\n'
                 '1,1.0,"[1,2,3,4]"\n')
    with pytest.raises(TraceError, match=r"moe_layer-0\.csv: line 2.*list of per-expert counts"):
        traces.read(root)
    f.write_text('iteration,latency (ms),expert distribution\n0,1.0,"[1,2,3,4]"\n')
    with pytest.raises(TraceError, match="has 1 iteration rows but"):
        traces.read(root)
    f.write_text('iteration,latency (ms),expert distribution\n0,1.0,"[1,2,3,-4]"\n'
                 '1,1.0,"[1,2,3,4]"\n')
    with pytest.raises(TraceError, match=r">= 0"):
        traces.read(root)


def test_directory_without_ranks(tmp_path):
    (tmp_path / "empty").mkdir()
    _bad(tmp_path / "empty", "no rank folders")


# ------------------------------------------------------------------ .pt (torch present)
def test_pt_mismatched_record_shapes(tmp_path):
    torch = pytest.importorskip("torch", reason="torch not installed")
    p2l = torch.arange(6).reshape(2, 3) % 3
    recs = [{"forward_pass_id": 0, "rank": 0, "global_physical_count": torch.ones((2, 3))},
            {"forward_pass_id": 1, "rank": 0, "global_physical_count": torch.ones((3, 3))}]
    torch.save({"records": recs, "last_physical_to_logical_map": p2l}, tmp_path / "r.pt")
    _bad(tmp_path / "r.pt", "records[1].global_physical_count", "mismatched layer")
    torch.save({"records": recs[:1]}, tmp_path / "nomap.pt")
    _bad(tmp_path / "nomap.pt", "last_physical_to_logical_map")
    torch.save({"something": 1}, tmp_path / "other.pt")
    _bad(tmp_path / "other.pt", "'logical_count'", "'records'")
    data = (tmp_path / "r.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 3])
    _bad(tmp_path / "cut.pt", "truncated")
