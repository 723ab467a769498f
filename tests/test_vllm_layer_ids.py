"""vLLM's mapping file is keyed by MoE-layer index, not model layer id: reading one back maps
index i to the trace's i-th MoE layer (`evaluation.align.moe_rows`, which `align` calls), and an
export from a trace that lost a MoE layer in the middle is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from eplb import EplbError
from eplb.evaluation.align import align, moe_rows
from eplb.evaluation.execute import execute_trace
from eplb.io import read_placement, write_placement
from eplb.topology import Topology
from eplb.traces import read as read_trace
from tests._cli import run_cli

TOPO = ("--topology", "4x8", "--slots", "288")


def _dump(path, zero_layers=(0, 1, 2)):
    """An SGLang-style dump ``{"logical_count": [61][256]}`` (DeepSeek-V3: rows 0-2 dense)."""
    counts = np.random.default_rng(0).integers(1, 1000, (61, 256))
    counts[list(zero_layers)] = 0
    path.write_text(json.dumps({"logical_count": counts.tolist()}))
    return path


@pytest.fixture
def solved(tmp_path):
    """(dump, vLLM file, native file) of one solve of a DeepSeek-V3-shaped dump."""
    dump = _dump(tmp_path / "d.json")
    vllm, native = tmp_path / "p.jsonl", tmp_path / "p.json"
    for out in (vllm, native):
        code, _, err = run_cli("solve", dump, *TOPO, "-o", out)
        assert code == 0, err
    return dump, vllm, native


def _figures(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if not line.startswith("placement ")]


def test_vllm_file_evaluates_as_the_native_export(solved):
    dump, vllm, native = solved
    code_v, out_v, err_v = run_cli("evaluate", vllm, dump, *TOPO)
    assert code_v == 0, err_v
    code_n, out_n, err_n = run_cli("evaluate", native, dump)
    assert code_n == 0, err_n
    assert _figures(out_v) == _figures(out_n)
    assert "max GPU load / lower bound" in out_v


def test_read_marks_moe_indices_and_align_maps_them(solved):
    dump, vllm, native = solved
    topo = Topology.parse("4x8", 288)
    p = read_placement(vllm, topology=topo)
    assert p.meta["source"]["layer_ids"] == "moe_index"
    assert np.array_equal(p.layer_ids, np.arange(58))
    trace = read_trace(dump)
    assert np.array_equal(trace.layer_ids, np.arange(3, 61))
    got, want = align(p, trace), align(read_placement(native), trace)
    assert np.array_equal(got.layer_ids, np.arange(3, 61))
    assert np.array_equal(got.phy2log, want.phy2log)
    # explicit layer_ids= (what solve --previous passes) carries no marker and is left alone
    labelled = read_placement(vllm, topology=topo, layer_ids=trace.layer_ids)
    assert "layer_ids" not in labelled.meta["source"]
    assert moe_rows(labelled, trace) is labelled


def test_moe_layer_count_mismatch_is_one_clear_error(solved, tmp_path):
    _, vllm, _ = solved
    gap = read_trace(_dump(tmp_path / "gap.json", zero_layers=(0, 1, 2, 30)))
    p = read_placement(vllm, topology=Topology.parse("4x8", 288))
    with pytest.raises(EplbError, match="58 MoE layers, but the trace has 57"):
        align(p, gap)
    code, _, err = run_cli("evaluate", vllm, tmp_path / "gap.json", *TOPO)
    assert code == 2 and "58 MoE layers, but the trace has 57" in err


def test_execute_picks_the_row_of_the_model_layer(solved):
    dump, vllm, native = solved
    trace = read_trace(dump)
    p_v = read_placement(vllm, topology=Topology.parse("4x8", 288))
    p_n = read_placement(native)
    want_row = int(np.flatnonzero(p_n.layer_ids == 40)[0])
    for layer in (None, 40):
        kw = dict(layer=layer, num_tokens=64, hidden=64, seed=0)
        got, want = execute_trace(p_v, trace, **kw), execute_trace(p_n, trace, **kw)
        assert got.layer_id == want.layer_id == (3 if layer is None else 40)
        assert np.array_equal(got.stats.gpu_tokens, want.stats.gpu_tokens)
    rep = execute_trace(p_v, trace, layer=40, num_tokens=64, hidden=64, seed=0)
    assert np.array_equal(moe_rows(p_v, trace).phy2log[rep.row], p_n.phy2log[want_row])
    code, out, err = run_cli("execute", vllm, *TOPO, "--trace", dump, "--layer", 40,
                             "--tokens", 64, "--hidden", 64)
    assert code == 0, err
    assert "model layer 40 (row 37)" in out


def test_vllm_export_with_a_layer_gap_is_refused(tmp_path):
    gap = _dump(tmp_path / "gap.json", zero_layers=(0, 1, 2, 30))
    out = tmp_path / "g.jsonl"
    code, _, err = run_cli("solve", gap, *TOPO, "--format", "vllm", "-o", out)
    assert code == 2
    assert "no rows for layers 30" in err and "every MoE layer" in err
    assert not out.exists()
    # the library export refuses the same; formats keyed by model layer id still write
    native = tmp_path / "g.json"
    assert run_cli("solve", gap, *TOPO, "-o", native)[0] == 0
    p = read_placement(native)
    with pytest.raises(EplbError, match="no rows for layers 30"):
        write_placement(p, tmp_path / "lib.jsonl")
    assert write_placement(p, tmp_path / "lib.yaml") == "trtllm"
