"""``eplb trace info / synth / convert`` end to end, including bad input (exit 2, no file)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from eplb import traces
from tests._cli import run_cli

BUNDLED = Path(__file__).resolve().parents[1] / "traces" / "data"


def test_info_prints_shape_meta_and_skew_table():
    code, out, err = run_cli("trace", "info", str(BUNDLED / "deepseek-v3-calibrated.npz"))
    assert code == 0, err
    t = traces.read(BUNDLED / "deepseek-v3-calibrated.npz")
    assert f"{t.num_windows} windows x 58 layers x 256 experts (model layers 3..60 of 61)" in out
    assert "top_k 8, num_groups 8, topk_groups 4" in out
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("layer "))
    rows = lines[head + 2: head + 2 + 58]
    assert [int(r.split()[0]) for r in rows] == list(range(3, 61))
    df = t.summary()
    first = rows[0].split()
    assert float(first[2]) == pytest.approx(df["max_over_mean"][0], abs=0.006)
    assert float(first[4]) == pytest.approx(df["gini"][0], abs=6e-4)
    assert lines[head + 2 + 58].startswith("median")


def test_info_windows_and_plot(tmp_path):
    png = tmp_path / "heat.png"
    code, out, err = run_cli("trace", "info", str(BUNDLED / "deepseek-v3-calibrated.npz"),
                             "--windows", "0:4", "--ema", "0.5", "--plot", str(png))
    assert code == 0, err
    assert "EMA alpha=0.5 over 4 of 16 windows" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_info_token_level_and_sources():
    code, out, _ = run_cli("trace", "info", str(BUNDLED / "deepseek-v3-tokens.npz"))
    assert code == 0
    assert "1024 tokens x top-8 from 32 source ranks" in out
    assert re.search(r"^source ranks\s+32$", out, re.M)


def test_synth_every_kind(tmp_path):
    target = tmp_path / "target.npz"
    traces.write(traces.synth.calibrated(windows=1, tokens=4096, seed=0)
                 .select(layers=[3, 4]), target)
    cases = {
        "zipf": ["--layers", "3", "--experts", "16", "--param", "skew=[0.5,0.9]"],
        "lognormal": ["--layers", "2", "--experts", "8", "--param", "sigma=[0.3,0.6]"],
        "uniform": ["--layers", "2", "--experts", "8", "--windows", "3"],
        "drift": ["--layers", "2", "--experts", "32", "--windows", "4", "--param", "rate=0.25",
                  "--first-layer", "3"],
        "bursty": ["--layers", "2", "--experts", "16", "--param", "burst_prob=0.5"],
        "calibrated": ["--windows", "2", "--param", "phase=decode"],
        "tokens": ["--target", str(target), "--tokens", "128", "--param", "num_ranks=4"],
    }
    for kind, extra in cases.items():
        out_path = tmp_path / f"{kind}.npz"
        code, out, err = run_cli("trace", "synth", kind, *extra, "--seed", "3",
                                 "-o", str(out_path))
        assert code == 0, (kind, err)
        t = traces.read(out_path)
        assert t.meta["provenance"]["generator"] == ("token_level" if kind == "tokens" else kind)
        assert f"wrote {out_path}" in out
    assert traces.read(tmp_path / "drift.npz").layer_ids.tolist() == [3, 4]
    assert traces.read(tmp_path / "calibrated.npz").meta["provenance"]["phase"] == "decode"
    tok = traces.read(tmp_path / "tokens.npz")
    assert tok.topk_ids.shape == (128, 2, 8) and tok.token_rank.max() == 3
    assert "routing tokens" in err  # the tokens run was the last: its progress on stderr
    code, _, err = run_cli("trace", "synth", "tokens", *cases["tokens"], "--seed", "3",
                           "--quiet", "-o", str(tmp_path / "quiet.npz"))
    assert code == 0 and err == ""
    assert traces.read(tmp_path / "quiet.npz").equals(tok)
    # same seed, same file content
    run_cli("trace", "synth", "zipf", "--layers", "3", "--experts", "16", "--seed", "3",
            "--param", "skew=[0.5,0.9]", "-o", str(tmp_path / "again.npz"))
    assert traces.read(tmp_path / "again.npz").equals(traces.read(tmp_path / "zipf.npz"))


def test_convert_between_formats(tmp_path):
    src = BUNDLED / "deepseek-v3-tokens.npz"
    code, out, _ = run_cli("trace", "convert", str(src), str(tmp_path / "t.parquet"))
    assert code == 0 and "does not hold token-level topk_ids/token_rank" in out
    back = traces.read(tmp_path / "t.parquet")
    orig = traces.read(src)
    assert np.array_equal(back.source_counts, orig.source_counts)
    code, out, _ = run_cli("trace", "convert", str(tmp_path / "t.parquet"),
                           str(tmp_path / "t.json"))
    assert code == 0
    doc = json.loads((tmp_path / "t.json").read_text())
    assert np.array(doc["logical_count"]).shape == (61, 256)
    code, _, _ = run_cli("trace", "convert", str(tmp_path / "t.json"),
                         str(tmp_path / "t.out"), "--format", "npz")
    assert code == 0
    assert np.array_equal(traces.read(tmp_path / "t.out").counts, orig.counts)


@pytest.mark.parametrize("argv, fragment", [
    (["trace", "info", "{tmp}/missing.npz"], "does not exist"),
    (["trace", "info", "{tmp}/bad.json"], "ragged"),
    (["trace", "convert", "{tmp}/bad.json", "{tmp}/out.npz"], "ragged"),
    (["trace", "convert", "{tmp}/good.json", "{tmp}/out.xyz"], "cannot tell the trace format"),
    (["trace", "synth", "zipf", "--param", "nope=1", "-o", "{tmp}/out.npz"],
     "zipf does not take nope"),
    (["trace", "synth", "zipf", "--param", "skew=[2,1]", "-o", "{tmp}/out.npz"], "skew must be"),
    (["trace", "synth", "calibrated", "--layers", "3", "-o", "{tmp}/out.npz"],
     "calibrated does not take num_layers"),
    (["trace", "synth", "tokens", "-o", "{tmp}/out.npz"], "needs --target"),
    (["trace", "info", "{tmp}/good.json", "--windows", "a:b:c:d"], "--windows"),
    (["trace", "info", "{tmp}/good.json", "--windows", "5"], "not a valid selection"),
])
def test_bad_input_exits_2_with_one_line_and_no_output(tmp_path, argv, fragment):
    (tmp_path / "bad.json").write_text('{"logical_count": [[1, 2], [3]]}')
    (tmp_path / "good.json").write_text('{"logical_count": [[1, 2], [3, 4]]}')
    before = set(tmp_path.iterdir())
    code, out, err = run_cli(*[a.format(tmp=tmp_path) for a in argv])
    assert code == 2
    assert err.startswith("eplb: error: ") and fragment in err
    assert len(err.strip().splitlines()) == 1
    assert set(tmp_path.iterdir()) == before  # no output file, no temporary left over
