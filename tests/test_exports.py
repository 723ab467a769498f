"""Issue 13 §1: exports line up with the model's layers, from the CLI and the Python API.

SGLang's map has one row per model layer and TensorRT-LLM looks assignments up by model layer
id, so a placement numbered 0..L-1 (solved from a bare load matrix) is refused for them unless
the caller says those are the model's ids; round trips through the files put every trace layer
back on its own row.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from eplb import Placement, PlacementError, Topology, solvers, traces
from eplb.evaluation import metrics
from eplb.evaluation.align import align, with_layers
from eplb.io import read_placement, write_placement
from tests.conftest import BUNDLED

TOPO = Topology(4, 8, 9)
CALIBRATED = BUNDLED / "deepseek-v3-calibrated.npz"  # model layers 3..60 of 61


@pytest.fixture(scope="module")
def trace():
    t = traces.read(CALIBRATED)
    assert t.layer_ids[0] == 3 and t.meta["num_model_layers"] == 61
    return t


@pytest.mark.parametrize(("fmt", "name"), [("sglang", "sg.json"), ("trtllm", "lb.yaml")])
def test_default_layer_ids_are_refused_for_runtime_exports(trace, tmp_path, fmt, name):
    p = solvers.solve("greedy", trace.load(), TOPO)  # a bare array: rows 0..57
    assert np.array_equal(p.layer_ids, np.arange(58))
    with pytest.raises(PlacementError, match="layer_ids are the default 0..57") as info:
        write_placement(p, tmp_path / name, fmt)
    assert "layer_ids_are_model_ids=True" in str(info.value)
    assert "with_layers" in str(info.value)
    assert not (tmp_path / name).exists()
    # told otherwise, it writes (a model whose every layer is MoE)
    write_placement(p, tmp_path / name, fmt, layer_ids_are_model_ids=True)
    assert (tmp_path / name).exists()
    # native files keep layer ids as they are: no refusal
    write_placement(p, tmp_path / "p.json")


def _rows_match_trace(q: Placement, p: Placement, trace) -> None:
    """Every trace layer's row in the file-read placement ``q`` is ``p``'s row for it."""
    aligned = align(q, trace)
    assert np.array_equal(aligned.layer_ids, trace.layer_ids)
    assert np.array_equal(aligned.phy2log, p.phy2log)
    # and the loads it sees are the trace's: max GPU load per layer matches
    np.testing.assert_allclose(aligned.gpu_load(trace.load()), p.gpu_load(trace.load()))


def test_api_round_trip_with_trace_layer_ids(trace, tmp_path):
    """API -> SGLang / TensorRT-LLM file -> reader: every row is the trace's layer."""
    p = with_layers(solvers.solve("greedy", trace.load(), TOPO), trace.layer_ids)
    write_placement(p, tmp_path / "sg.json", "sglang", num_model_layers=61)
    rows = np.array(json.loads((tmp_path / "sg.json").read_text())["physical_to_logical_map"])
    assert rows.shape == (61, 288)
    np.testing.assert_array_equal(rows[3:], p.phy2log)
    np.testing.assert_array_equal(rows[:3], np.tile(np.arange(288) % 256, (3, 1)))  # dense
    q = read_placement(tmp_path / "sg.json", topology=TOPO, num_experts=256)
    _rows_match_trace(q, p, trace)
    write_placement(p, tmp_path / "lb.yaml")
    doc = yaml.safe_load((tmp_path / "lb.yaml").read_text())
    assert sorted(doc["initial_global_assignments"]) == list(range(3, 61))
    q = read_placement(tmp_path / "lb.yaml", topology=TOPO, num_experts=256)
    _rows_match_trace(q, p, trace)


def test_api_round_trip_solving_the_trace_itself(trace, tmp_path):
    """The README's API export path: ``solvers.solve(name, trace, topology)`` carries the
    trace's layer ids, and both runtime files read back onto the trace's layers."""
    p = solvers.solve("greedy", trace, TOPO)
    assert np.array_equal(p.layer_ids, trace.layer_ids)
    for fmt, name in (("sglang", "sg.json"), ("trtllm", "lb.yaml")):
        write_placement(p, tmp_path / name, fmt,
                        num_model_layers=61 if fmt == "sglang" else None)
        _rows_match_trace(read_placement(tmp_path / name, topology=TOPO, num_experts=256), p,
                          trace)


def test_cli_export_lines_up_with_the_model(trace, tmp_path):
    from eplb.cli import main

    assert main(["solve", str(CALIBRATED), "--topology", "4x8", "--slots", "288",
                 "--format", "sglang", "-o", str(tmp_path / "sg.json")]) == 0
    q = read_placement(tmp_path / "sg.json", topology=TOPO, num_experts=256)
    assert q.num_layers == 61
    # without --groups the CLI takes the groups the trace records (issue 37 part 2)
    p = solvers.solve("deepseek", trace.load(), TOPO, num_groups=trace.meta["num_groups"])
    _rows_match_trace(q, with_layers(p, trace.layer_ids), trace)


def test_score_layer_column_uses_model_layer_ids(trace):
    p = solvers.solve("deepseek", trace.load(), TOPO)  # rows numbered 0..57
    frame = metrics.score(p, trace)
    assert frame["layer"].tolist() == trace.layer_ids.tolist()
    labelled = with_layers(p, trace.layer_ids)
    pd_equal = metrics.score(labelled, trace.load())
    np.testing.assert_array_equal(frame["gpu_max"], pd_equal["gpu_max"])
    assert metrics.score(labelled, trace)["layer"].tolist() == list(range(3, 61))
