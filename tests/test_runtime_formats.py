"""Issue 37 part 3: every revision of the runtimes' file formats.

vLLM PR #41141 (offline EPLB) wrote three stats layouts over its history; one fixture per
revision lives in ``tests/fixtures/vllm`` (written for these tests, after the layouts the PR's
code writes: revision A ``63727bfc`` has no ``eplb_load_meta`` record and interleaves the MTP
model's records, B ``8f4722ce`` puts the meta first and its tooling adds marker records, C keeps
only ``step``/``expert_load``/``p2l_map`` per record). ``mapping_ab.jsonl`` is the mapping
record A's and B's loader reads. SGLang's stat dumps are a recorder buffer of per-pass rows;
TensorRT-LLM's YAML stores ``num_slots``, standalone or inline in an LLM-API config.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from eplb import Placement, Topology, solvers, traces
from eplb.errors import EplbError, PlacementError, TraceError
from eplb.io import VLLM_LOADED_BY, read_placement, write_placement
from tests._cli import run_cli

FIX = Path(__file__).parent / "fixtures" / "vllm"


# ----------------------------------------------------------------- vLLM stats, per revision
def test_revision_a_stats_without_meta_keeps_the_main_model_in_file_order():
    t = traces.read(FIX / "rev_a_stats.jsonl")
    prov = t.meta["provenance"]
    assert prov["revision"].startswith("63727bfc")
    assert prov["steps"] == [2250, 2251, 0]  # file order: step restarts at a rearrangement
    assert t.counts.shape == (3, 2, 4) and t.meta["model"] == "acme/moe-mini"
    # slot loads summed onto each record's own p2l_map (the map changed at step 0)
    assert t.counts[0].tolist() == [[6, 1, 3, 0], [3, 3, 1, 3]]
    assert t.counts[2].tolist() == [[3, 2, 4, 1], [2, 2, 3, 3]]
    assert prov["num_ranks"] == 2
    assert any("left out 2" in n and "MTP" in n for n in t.meta["notes"])


def test_revision_b_stats_skip_marker_records_and_keep_groups():
    t = traces.read(FIX / "rev_b_stats.jsonl")
    assert t.meta["provenance"]["revision"].startswith("8f4722ce")
    assert t.counts.shape == (3, 2, 4) and t.meta["num_groups"] == 2
    assert t.meta["provenance"]["steps"] == [2250, 2500, 2750]
    assert any("skipped 2 records" in n and "bench_run_start" in n for n in t.meta["notes"])
    assert traces.sniff(FIX / "rev_b_stats.jsonl") == "vllm"  # a marker is its first line


def test_revision_c_minimal_records():
    t = traces.read(FIX / "rev_c_stats.jsonl")
    assert t.counts.shape == (2, 2, 4)
    assert t.counts[:, 0].sum(0).tolist() == [14, 5, 7, 2]
    assert t.meta["model"] == "acme/moe-mini" and "num_groups" not in t.meta  # 1 group


def test_passes_group_into_windows():
    t = traces.read(FIX / "rev_b_stats.jsonl")
    g = traces.group_passes(t, 2)
    assert g.num_windows == 2 and g.meta["provenance"]["passes_per_window"] == 2
    assert np.array_equal(g.counts[0], t.counts[0] + t.counts[1])
    assert np.array_equal(g.counts[1], t.counts[2])
    assert np.array_equal(g.load(), t.load())
    with pytest.raises(TraceError, match="whole number"):
        traces.group_passes(t, 0)


def test_cli_trace_info_groups_passes_and_prints_notes():
    code, out, err = run_cli("trace", "info", FIX / "rev_a_stats.jsonl", "--passes-per-window",
                             2)
    assert code == 0, err
    assert "2 windows" in out and "note: left out 2" in out


def test_version_and_order_problems_name_the_line(tmp_path):
    lines = (FIX / "rev_b_stats.jsonl").read_text().splitlines()
    bad = tmp_path / "s.jsonl"
    bad.write_text("\n".join([lines[2], lines[1]]) + "\n")  # meta after stats
    with pytest.raises(TraceError, match="must come first"):
        traces.read(bad)
    rec = json.loads(lines[2])
    bad.write_text(json.dumps({**rec, "version": 2}) + "\n")
    with pytest.raises(TraceError, match=r"s.jsonl:1: .*version 2"):
        traces.read(bad)


# ----------------------------------------------------------------- vLLM mapping file
def load_initial_mapping(text: str, num_moe_layers: int, num_logical: int, num_physical: int,
                         num_redundant: int) -> np.ndarray:
    """The rules of revision A's and B's ``_load_initial_mapping`` (as described in the PR):
    the last ``eplb_initial_mapping`` line wins, version 1, ``num_redundant_experts`` equal to
    the server's, ``num_slots`` the physical experts, string keys ``"0".."L-1"`` (MoE-layer
    indices), every row ``num_physical`` ids in range holding every logical expert, at most
    1024 replicas of one."""
    recs = [json.loads(line) for line in text.splitlines() if line.strip()]
    rec = [r for r in recs if r.get("record_type") == "eplb_initial_mapping"][-1]
    assert rec["version"] == 1
    assert rec["num_redundant_experts"] == num_redundant
    assert rec["num_slots"] == num_physical == num_logical + num_redundant
    rows = []
    for layer in range(num_moe_layers):
        row = rec["initial_global_assignments"][str(layer)]
        assert len(row) == num_physical and all(0 <= x < num_logical for x in row)
        assert len(set(row)) == num_logical
        assert np.bincount(row).max() <= 1024
        rows.append(row)
    return np.array(rows)


def test_mapping_fixture_reads_with_the_slots_from_the_file():
    text = (FIX / "mapping_ab.jsonl").read_text()
    p2l = load_initial_mapping(text, 2, 4, 6, 2)
    p = read_placement(FIX / "mapping_ab.jsonl", topology="1x2")  # 6 slots from the file
    assert p.topology.num_slots == 6 and np.array_equal(p.phy2log, p2l)


def test_written_mapping_is_what_revisions_a_and_b_load(tmp_path):
    trace = traces.read(FIX / "rev_b_stats.jsonl")
    topo = Topology(1, 2, 3)
    p = solvers.solve("greedy", trace, topo)
    out = tmp_path / "mapping.jsonl"
    write_placement(p, out)
    p2l = load_initial_mapping(out.read_text(), 2, 4, 6, 2)
    assert np.array_equal(p2l, p.phy2log)
    # vLLM keeps the last mapping record and ignores other record types; so does eplb
    other = Placement(p.phy2log[:, ::-1].copy(), 4, topo)
    write_placement(other, tmp_path / "second.jsonl")
    both = tmp_path / "both.jsonl"
    both.write_text('{"record_type": "note"}\n' + out.read_text()
                    + (tmp_path / "second.jsonl").read_text())
    assert np.array_equal(read_placement(both, topology=topo).phy2log, other.phy2log)
    assert "63727bfc" in VLLM_LOADED_BY and "8f4722ce" in VLLM_LOADED_BY


def test_solve_format_vllm_names_the_revisions(tmp_path):
    out = tmp_path / "m.jsonl"
    code, text, err = run_cli("solve", FIX / "rev_c_stats.jsonl", "--topology", "1x2",
                              "--slots", 6, "--format", "vllm", "-o", out)
    assert code == 0, err
    assert "63727bfc" in text and "8f4722ce" in text
    assert "63727bfc" in run_cli("solve", "--help")[1]


def test_stats_and_mapping_files_given_to_the_wrong_reader():
    with pytest.raises(PlacementError, match="recorded expert load.*eplb solve"):
        read_placement(FIX / "rev_b_stats.jsonl", topology="1x2")
    with pytest.raises(TraceError, match="mapping file.*evaluate"):
        traces.read(FIX / "mapping_ab.jsonl")


# ----------------------------------------------------------------- SGLang recorder buffer
def _stat_dump(path, logical_count):
    torch = pytest.importorskip("torch")
    torch.save({"rank": 0, "logical_count": torch.tensor(logical_count, dtype=torch.int32),
                "average_utilization_rate_over_window": None}, path)


def test_sglang_stat_dump_passes_drop_unreached_rows(tmp_path):
    passes = np.zeros((6, 3, 4), dtype=np.int64)  # a 6-row buffer, 2 passes recorded
    passes[0, 1:] = [[5, 1, 0, 2], [3, 3, 1, 1]]  # layer 0 dense (zero)
    passes[1, 1:] = [[2, 2, 2, 2], [0, 4, 2, 2]]
    _stat_dump(tmp_path / "d.pt", passes.tolist())
    t = traces.read(tmp_path / "d.pt")
    assert t.counts.shape == (2, 2, 4) and t.layer_ids.tolist() == [1, 2]
    assert any("dropped 4 all-zero passes of 6" in n for n in t.meta["notes"])


def test_sglang_stat_dump_full_buffer_may_have_wrapped(tmp_path):
    passes = np.ones((3, 2, 4), dtype=np.int64)
    _stat_dump(tmp_path / "d.pt", passes.tolist())
    t = traces.read(tmp_path / "d.pt")
    assert t.num_windows == 3 and t.meta["provenance"]["order"] == "may have wrapped"
    assert any("buffer-size -1" in n for n in t.meta["notes"])


# ----------------------------------------------------------------- TensorRT-LLM YAML
def _trtllm(tmp_path):
    trace = traces.read(FIX / "rev_b_stats.jsonl")
    p = solvers.solve("greedy", trace, Topology(1, 2, 3))
    path = tmp_path / "lb.yaml"
    write_placement(p, path, layer_ids_are_model_ids=True)
    return p, path


def test_trtllm_num_slots_come_from_the_file(tmp_path):
    p, path = _trtllm(tmp_path)
    back = read_placement(path, topology="1x2")
    assert back.topology.num_slots == 6 and np.array_equal(back.phy2log, p.phy2log)
    with pytest.raises(PlacementError, match="6 slots per layer do not fit"):
        read_placement(path, topology="1x4")  # num_slots % ep_size != 0, as TRT-LLM refuses
    code, _, err = run_cli("evaluate", path, FIX / "rev_b_stats.jsonl", "--topology", "1x2")
    assert code == 0, err  # no --slots needed
    code, out, err = run_cli("execute", path, "--topology", "1x2", "--hidden", 16, "--top-k", 2)
    assert code == 0 and "PASS" in out, err


def test_trtllm_inline_llm_api_config(tmp_path):
    import yaml

    p, path = _trtllm(tmp_path)
    mapping = yaml.safe_load(path.read_text())
    inline = tmp_path / "config.yaml"
    inline.write_text(yaml.safe_dump({"moe_expert_parallel_size": 2, "moe_config": {
        "backend": "WIDEEP", "load_balancer": mapping}}))
    assert np.array_equal(read_placement(inline, topology="1x2").phy2log, p.phy2log)
    named = tmp_path / "named.yaml"
    named.write_text(yaml.safe_dump({"moe_config": {"load_balancer": path.name}}))
    assert np.array_equal(read_placement(named, topology="1x2").phy2log, p.phy2log)
    with pytest.raises(EplbError, match="moe_expert_parallel_size 2"):
        read_placement(inline, topology="1x3")
