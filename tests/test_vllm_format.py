"""Issue 22 §1: vLLM's offline-EPLB files.

The mapping file is checked by `vllm_parse`, a re-implementation of the rules vLLM's loader
documents (PR #41141: one ``eplb_initial_mapping`` JSON line; ``num_slots`` equals the physical
experts; ``num_redundant_experts`` = physical - logical; keys are the MoE-layer indices
``"0".."num_moe_layers-1"``; every logical expert has a replica), written from that description
and not from vLLM's code. The stats reader is checked on hand-made records.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from eplb import Placement, Topology, solvers, traces
from eplb.errors import EplbError, TraceError
from eplb.io import read_placement, write_placement
from tests.conftest import BUNDLED


def vllm_parse(text: str, num_moe_layers: int, num_physical: int, num_logical: int,
               num_redundant: int):
    """vLLM's documented parsing of the initial mapping -> (p2l[L][P], logcnt[L][E])."""
    recs = [json.loads(line) for line in text.splitlines() if line.strip()]
    rec = next(r for r in recs if r.get("record_type") == "eplb_initial_mapping")
    if rec["version"] != 1:
        raise ValueError("version")
    if rec["num_redundant_experts"] != num_redundant:
        raise ValueError("num_redundant_experts mismatch")
    if rec["num_slots"] != num_physical:
        raise ValueError("num_slots mismatch")
    assign = rec["initial_global_assignments"]
    p2l = []
    for layer in range(num_moe_layers):
        row = assign[str(layer)]  # keyed by MoE-layer index as a string
        if len(row) != num_physical or not all(0 <= x < num_logical for x in row):
            raise ValueError(f"layer {layer}")
        p2l.append(row)
    p2l = np.array(p2l)
    logcnt = np.stack([np.bincount(r, minlength=num_logical) for r in p2l])
    if (logcnt == 0).any():
        raise ValueError("a logical expert has no replica")
    return p2l, logcnt


def test_vllm_mapping_round_trip_keeps_layer_order(tmp_path):
    topo = Topology(2, 4, 5)
    rng = np.random.default_rng(1)
    load = rng.random((5, 32)) * 100
    base = solvers.solve("greedy", load, topo)
    ids = np.array([7, 3, 6, 4, 5])  # model layer ids, not sorted, no gap
    p = Placement(base.phy2log, base.num_experts, topo, None, {}, ids)
    write_placement(p, tmp_path / "map.jsonl")
    text = (tmp_path / "map.jsonl").read_text()
    assert len(text.splitlines()) == 1
    p2l, logcnt = vllm_parse(text, 5, topo.num_slots, 32, topo.num_slots - 32)
    order = np.argsort(ids)  # MoE-layer index i = i-th model layer of the placement
    assert np.array_equal(p2l, p.phy2log[order])
    assert np.array_equal(logcnt, p.logcnt[order])
    back = read_placement(tmp_path / "map.jsonl", topology=topo, layer_ids=np.sort(ids))
    assert np.array_equal(back.phy2log, p.phy2log[order])
    assert np.array_equal(back.layer_ids, np.sort(ids))


def test_vllm_mapping_reader_refuses_bad_records(tmp_path):
    topo = Topology(1, 2, 3)
    rec = {"record_type": "eplb_initial_mapping", "version": 1, "num_redundant_experts": 2,
           "num_slots": 6, "initial_global_assignments": {"0": [0, 1, 2, 3, 0, 1]}}
    f = tmp_path / "m.jsonl"
    f.write_text(json.dumps(rec) + "\n")
    assert read_placement(f, topology=topo).num_slots == 6
    for bad, match in [({"num_redundant_experts": 1}, "num_redundant_experts"),
                       ({"num_slots": 5}, "num_slots"),
                       ({"initial_global_assignments": {"1": [0, 1, 2, 3, 0, 1]}}, "keys"),
                       ({"version": 2}, "version")]:
        f.write_text(json.dumps({**rec, **bad}) + "\n")
        with pytest.raises(EplbError, match=match):
            read_placement(f, topology=topo)
    with pytest.raises(EplbError, match="topology"):
        f.write_text(json.dumps(rec) + "\n")
        read_placement(f)


def _stats_file(path, records):
    meta = {"record_type": "eplb_load_meta", "version": 1, "model": "m", "num_ranks": 2,
            "num_groups": 2, "num_nodes": 1, "num_layers": 2, "num_redundant_experts": 1}
    lines = [meta] + [{"record_type": "eplb_load_stats", "version": 1, "step": s,
                       "expert_load": load, "p2l_map": p2l} for s, load, p2l in records]
    path.write_text("\n".join(json.dumps(r) for r in lines) + "\n")


def test_vllm_stats_become_windows_of_logical_load(tmp_path):
    f = tmp_path / "stats.jsonl"
    _stats_file(f, [(10, [[5, 1, 2, 3, 4, 6], [0, 1, 1, 1, 2, 2]],
                     [[0, 1, 2, 3, 0, 1], [3, 2, 1, 0, 3, 3]]),
                    (20, [[1, 1, 1, 1, 1, 1], [2, 2, 2, 2, 2, 2]],
                     [[0, 1, 2, 3, 0, 1], [3, 2, 1, 0, 3, 3]])])
    t = traces.read(f)
    assert t.counts.shape == (2, 2, 4)
    assert t.counts[0, 0].tolist() == [9, 7, 2, 3]  # slots 0 and 4 hold expert 0
    assert t.counts[0, 1].tolist() == [1, 1, 1, 4]
    assert t.counts[1].sum() == 18
    assert t.meta["num_groups"] == 2 and t.meta["provenance"]["steps"] == [10, 20]
    assert traces.sniff(f) == "vllm"


@pytest.mark.parametrize(("text", "match"), [
    ('{"record_type": "eplb_load_meta", "version": 1}\n', "no eplb_load_stats"),
    # a stats record with no meta is revision A's layout (read: test_runtime_formats.py); a
    # meta record after stats records is two files run together
    ('{"record_type": "eplb_load_stats", "version": 1, "expert_load": [[1]], "p2l_map": [[0]]}'
     '\n{"record_type": "eplb_load_meta"}', "must come first"),
    ('{"record_type": "eplb_load_meta"}\n{"record_type": "eplb_load_meta"}', "second"),
    # records of other types are skipped (the PR's tooling writes markers): none is left here
    ('{"record_type": "eplb_load_meta"}\n{"record_type": "garbage"}', "no eplb_load_stats"),
    ('{"record_type": "eplb_load_meta"}\n{"record_type": "eplb_load_stats", "expert_load": '
     '[[1, 2]], "p2l_map": [[0]]}', "must match"),
    ('{"record_type": "eplb_load_meta"}\n{"record_type": "eplb_load_st', "truncated"),
])
def test_vllm_stats_bad_input_names_the_problem(tmp_path, text, match):
    f = tmp_path / "s.jsonl"
    f.write_text(text)
    with pytest.raises(TraceError, match=match):
        traces.read(f, "vllm")


def test_cli_solve_writes_vllm(tmp_path):
    out = tmp_path / "placement.jsonl"
    r = subprocess.run([sys.executable, "-m", "eplb.cli", "solve",
                        str(BUNDLED / "deepseek-v3-calibrated.npz"), "--topology", "4x8",
                        "--slots", "288", "--format", "vllm", "-o", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    trace = traces.read(BUNDLED / "deepseek-v3-calibrated.npz")
    p2l, _ = vllm_parse(out.read_text(), trace.num_layers, 288, 256, 32)
    solved = read_placement(out, topology=Topology.parse("4x8", 288),
                            layer_ids=trace.layer_ids)
    assert np.array_equal(p2l, solved.phy2log)
    assert solved.gpu_load(trace.load()).shape == (trace.num_layers, 32)
