"""scripts/advise_published.py: its rows come from the code (one LPLB pair recomputed through
`advise`'s Python API agrees with the script's function and lies in the documented range), its
reshaping of a dump to another model keeps what it says it keeps, and ``--check`` fails on a
stale block."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from eplb.evaluation.serving.advise import advise

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.fixture
def script(monkeypatch, shared_traces):
    """The script as a module, reading the dumps under ``shared_traces``."""
    monkeypatch.setenv("EPLB_DATA", str(shared_traces))
    monkeypatch.syspath_prepend(str(SCRIPTS))
    sys.modules.pop("advise_published", None)
    mod = importlib.import_module("advise_published")
    yield mod
    sys.modules.pop("advise_published", None)


def test_an_lplb_row_is_advise_on_the_same_unit(script, monkeypatch, deepseek_jsons):
    serve, calib = "decode_in1000out1000.json", "prefill_in1024.json"
    monkeypatch.setattr(script, "DECODE", {serve: (1000, 1000)})
    monkeypatch.setattr(script, "_calibrations", lambda s, c: [calib])
    (row,) = script.sglang_lplb(32)
    # the same deployment through the public API: today = the placement with an even split
    topo = script.Topology(2, 8, 18)
    placed = script._placed(script.V3, script.dump_loads()[calib], topo)
    t = advise(script.DUMPS / serve, "2x8", 288, phase="decode", hardware="h20",
               tokens_per_rank=script.H20_REQUESTS, kv_tokens=script.H20_CONTEXT,
               previous=placed, levers=["today", "dispatch_lp"], lp_overhead_s=0.0,
               max_tokens=script.H20_REQUESTS).table
    lp = t[(t.lever == "dispatch_lp") & (t.option == "today")]
    assert len(lp) == 1
    assert float(lp.gain_pct.iloc[0]) / 100 == pytest.approx(row["gain0"], rel=1e-9)
    assert row["break_even_us"] > 0  # drift: the split pays up to some overhead
    # the break-even overhead assumes the step linear in it: one charge per MoE layer and
    # micro-batch on the critical path
    load = script.dump_loads()[serve]
    t0, t1 = (script._step_s("decode", script.V3, "h20", topo, placed, load,
                             script.H20_REQUESTS, script.H20_CONTEXT, dispatch="lp",
                             lp_overhead_s=ov) for ov in (0.0, 1e-4))
    assert t1 - t0 == pytest.approx(script.V3.moe_layers * 2 * 1e-4, rel=1e-9)
    # the documented drift range for 32 redundant holds this pair's gain
    doc = (script.ROOT / "docs" / "advise.md").read_text(encoding="utf-8")
    m = re.search(r"\| 32 \| each other dump \(drift\) \| ([+-][\d.]+)% to ([+-][\d.]+)%", doc)
    assert m is not None
    lo, hi = float(m.group(1)) / 100, float(m.group(2)) / 100
    assert lo - 5e-5 <= row["gain0"] <= hi + 5e-5


def test_nearest_load_keeps_each_layers_skew_and_the_picks(script, deepseek_jsons):
    load = script.dump_loads()["decode_in2000out100.json"]
    same = script.nearest_load(load, script.V3)
    assert same.shape == load.shape
    np.testing.assert_allclose(np.sort(same, 1), np.sort(load, 1), rtol=1e-9)  # a permutation
    v4 = script.nearest_load(load, script.V4)
    assert v4.shape == (script.V4.moe_layers, script.V4.num_experts)
    tokens = load[0].sum() / script.V3.top_k
    np.testing.assert_allclose(v4.sum(1), tokens * script.V4.top_k, rtol=1e-9)
    # the hottest expert's share scales with the expert count's ratio (the popularity curve)
    src, dst = load[0].max() / load[0].sum(), v4[0].max() / v4[0].sum()
    assert dst == pytest.approx(src * 256 / 384, rel=1e-9)
    assert (script.nearest_load(load, script.V4, seed=1) != v4).any()  # seeded permutation


def test_check_fails_on_a_stale_block(script, monkeypatch, tmp_path, capsys):
    real = (script.ROOT / "docs" / "advise.md").read_text(encoding="utf-8")
    for key in script.BLOCKS:  # every block the script writes has its markers in the doc
        assert f"<!-- {key}:begin -->" in real and f"<!-- {key}:end -->" in real
    doc = tmp_path / "advise.md"
    bodies = {key: f"| {key} | 1 |" for key in script.BLOCKS}
    doc.write_text("".join(f"<!-- {k}:begin -->\n{b}\n<!-- {k}:end -->\n"
                           for k, b in bodies.items()), encoding="utf-8")
    monkeypatch.setattr(script, "DOC", doc)
    monkeypatch.setattr(script, "BLOCKS", {k: (lambda b=b: b) for k, b in bodies.items()})
    assert script.main(["--check"]) == 0
    doc.write_text(doc.read_text(encoding="utf-8").replace("| 1 |", "| 2 |", 1),
                   encoding="utf-8")
    assert script.main(["--check"]) == 1
    assert "advise.md is stale" in capsys.readouterr().err
