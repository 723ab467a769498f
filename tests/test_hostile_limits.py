"""Issue 38, the readers and the limits: every file a reader opens (also inside a per-rank
folder) is a regular file within ``EPLB_MAX_BYTES``; sizes implied by ids, headers and counts
are refused before they are allocated; a search's tolerance is one floating point resolves;
workload readers and API calls refuse what they cannot hold with one `EplbError`. Cases from
scripts/hostile_corpus.py's "never-ending work", "memory before refusal" and "tracebacks and
wrong accepts" classes."""

from __future__ import annotations

import json
import os
import shutil
import struct
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from eplb import Topology, traces
from eplb.errors import EplbError, InputError, TraceError
from eplb.evaluation.serving import ClusterConfig
from eplb.evaluation.serving import workload as W
from eplb.safeload import max_bytes
from eplb.tolerance import check_stop_tol
from tests._cli import run_cli
from tests.conftest import BUNDLED
from tests.test_hostile import one_error, small  # noqa: F401 - the fixture

TEN_MB = "10MB"


def _rankdir(root: Path, layers=("0",), ranks=("0",), rows='0,"[1, 2, 3, 4]"\n') -> Path:
    for rank in ranks:
        (root / rank).mkdir(parents=True, exist_ok=True)
        for lyr in layers:
            (root / rank / f"moe_layer-{lyr}.csv").write_text(
                "iteration,expert distribution\n" + rows)
    return root


# ------------------------------------------------------------------ 2. never-ending work
def test_every_file_in_a_rank_folder_is_checked_before_it_is_read(tmp_path, monkeypatch):
    fifo = _rankdir(tmp_path / "fifo", layers=("1",))
    os.mkfifo(fifo / "0" / "moe_layer-0.csv")  # reading it would block for ever
    data = _rankdir(tmp_path / "data")
    os.mkfifo(data / "data.json")
    zero = _rankdir(tmp_path / "zero", layers=("1",))
    (zero / "0" / "moe_layer-0.csv").symlink_to("/dev/zero")  # would never end
    for folder, what in ((fifo, "is a FIFO"), (data, "is a FIFO"),
                         (zero, "is a device or socket")):
        with pytest.raises(TraceError, match=what):
            traces.read(folder)
    big = _rankdir(tmp_path / "big")
    with open(big / "0" / "moe_layer-0.csv", "a") as fh:
        fh.truncate(11 * 10**6)  # sparse: 11 MB over a 10 MB limit
    monkeypatch.setenv("EPLB_MAX_BYTES", TEN_MB)
    with pytest.raises(TraceError, match="over the limit of 9.54 MiB"):
        traces.read(big)


@pytest.mark.parametrize("tol", [1e-300, 1e-17, 2e-16, 0.0, 1.0, float("nan"), True, "0.1"])
def test_a_search_tolerance_floating_point_cannot_resolve_is_refused(tol):
    with pytest.raises(InputError, match="rel_tol"):
        check_stop_tol("rel_tol", tol)
    assert 1.0 + 1e-12 > 1.0 and check_stop_tol("rel_tol", 1e-12) == 1e-12


def test_capacity_refuses_the_tolerance_before_simulating(small):  # noqa: F811
    from eplb.evaluation.serving import capacity

    with pytest.raises(InputError, match="below 1e-12"):
        capacity(ClusterConfig.load("deepseek_day6"), W.read("w.jsonl"), rel_tol=1e-300,
                 progress=False)
    sim = ["simulate", "deepseek_day6", "--workload", "w.jsonl", "--no-plots", "--capacity"]
    one_error(*run_cli(*sim, "--rel-tol", "1e-300")[::2], "--rel-tol", "below 1e-12")
    one_error(*run_cli(*sim, "--rates", "10,20")[::2], "--capacity searches the rate itself")


# ------------------------------------------------------------------ 3. memory before refusal
def test_env_limit_takes_units(monkeypatch):
    for text, value in (("10MB", 10**7), ("512 MiB", 2**29), ("4G", 4 * 10**9), ("8e9", 8e9),
                        ("2kib", 2048), ("100", 100)):
        monkeypatch.setenv("EPLB_MAX_BYTES", text)
        assert max_bytes() == value
    for text in ("10XB", "inf", "1e400", "-5", "abc", "MB"):
        monkeypatch.setenv("EPLB_MAX_BYTES", text)
        with pytest.raises(InputError, match="EPLB_MAX_BYTES"):
            max_bytes()


def test_npy_header_length_is_checked_before_it_is_read(tmp_path):
    head = b"\x93NUMPY\x02\x00" + struct.pack("<I", 2**32 - 64) + b"{" * 64
    (tmp_path / "h.npy").write_bytes(head)
    with zipfile.ZipFile(tmp_path / "h.npz", "w") as zf:
        zf.writestr("counts.npy", head)
    for name in ("h.npy", "h.npz"):
        with pytest.raises(TraceError, match="header claims 4,294,967,232 bytes"):
            traces.read(tmp_path / name)


@pytest.mark.parametrize("column", ["expert", "rank"])
def test_table_ids_are_sized_before_the_dense_trace(tmp_path, column):
    df = pd.DataFrame({"window": [0, 0], "layer": [0, 0], "expert": [0, 1], "count": [1, 2],
                       "rank": [0, 0]})
    df.loc[1, column] = 500_000_000  # 5e8 x 16 bytes: over 4 GiB, before any allocation
    df.to_csv(tmp_path / "t.csv", index=False)
    df.to_parquet(tmp_path / "t.parquet")
    for name in ("t.csv", "t.parquet"):
        with pytest.raises(TraceError, match="the dense trace needs"):
            traces.read(tmp_path / name)


def test_torch_and_vllm_map_ids_are_sized_before_allocation(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("EPLB_MAX_BYTES", TEN_MB)
    for exp in (27, 40):
        p2l = torch.tensor([[0, 1, 2, 2**exp]])
        torch.save({"last_physical_to_logical_map": p2l,
                    "records": [{"global_physical_count": torch.ones(1, 4)}]}, tmp_path / "r.pt")
        with pytest.raises(TraceError, match=f"largest expert id {2**exp}"):
            traces.read(tmp_path / "r.pt")
    meta = {"record_type": "eplb_load_meta", "num_layers": 1}
    stats = {"record_type": "eplb_load_stats", "step": 0, "expert_load": [[1, 2, 3, 4]],
             "p2l_map": [[0, 1, 2, 2**30]]}
    (tmp_path / "s.jsonl").write_text(json.dumps(meta) + "\n" + json.dumps(stats) + "\n")
    with pytest.raises(TraceError, match=f"largest expert id {2**30}"):
        traces.read(tmp_path / "s.jsonl")


def test_stacked_traces_are_sized_together(tmp_path, monkeypatch):
    t = traces.read(BUNDLED / "deepseek-v3-calibrated.npz")  # 1 x 58 x 256: 116 KiB
    monkeypatch.setenv("EPLB_MAX_BYTES", "300000")
    with pytest.raises(TraceError, match="the stacked trace needs"):
        traces.stack([t, t])


def test_counts_in_configs_and_options_are_bounded(small):  # noqa: F811
    sim = ["simulate", "deepseek_day6", "--workload", "w.jsonl", "--no-plots", "--no-progress",
           "-o", "out"]
    one_error(*run_cli(*sim, "--set", "decode.mtp_draft_tokens=1000000000")[::2],
              "over the limit of 64 draft tokens")
    one_error(*run_cli(*sim, "--set", "decode.nodes=2048", "--set",
                       "decode.slots_per_layer=16384")[::2],
              "utilisation record of 16,416 ranks", "over the limit")
    from eplb.evaluation.serving.advise import advise

    with pytest.raises(InputError, match="redundant 1,000,000 is more than 256 experts x"):
        advise(str(BUNDLED / "deepseek-v3-calibrated.npz"), "4x8", 288, redundant=[1_000_000])


def test_a_billion_system_prompts_builds_only_those_drawn():
    """System prompt j's two blocks (1024 tokens) hash to 2j, 2j + 1 however many there are:
    only the prompts drawn are built (not a billion lists)."""
    for n, prompts in ((200, 2), (40, 10**9)):
        w = W.synthesize(n, system_prompts=prompts, system_prompt_tokens=1024, seed=3)
        firsts = {tuple(int(b) for b in x[:2]) for x in w.requests["block_hashes"]}
        assert all(a % 2 == 0 and b == a + 1 and a < 2 * prompts for a, b in firsts)
        assert len(w) == n and (prompts > 2 or firsts == {(0, 1), (2, 3)})


# ------------------------------------------------------------------ 5. tracebacks, accepts
def test_rank_folders_take_ascii_digits_only(tmp_path):
    dup = _rankdir(tmp_path / "layers", layers=("0", "1"))
    shutil.copy(dup / "0" / "moe_layer-1.csv", dup / "0" / "moe_layer-\u0661.csv")
    ranks = _rankdir(tmp_path / "ranks", ranks=("0", "1"))
    shutil.copytree(ranks / "1", ranks / "\u0661")  # Arabic-Indic one: a second rank 1
    for folder, what in ((dup, "layer id is not written in ASCII"),
                         (ranks, "'\u0661' is not written in ASCII")):
        with pytest.raises(TraceError, match=what):
            traces.read(folder)
    sup = _rankdir(tmp_path / "sup", rows='\u00b2,"[1, 2, 3, 4]"\n')  # iteration '²': a label
    assert traces.read(sup).meta["provenance"]["iterations"] == [0]


def test_torch_records_mixing_top_k(tmp_path):
    torch = pytest.importorskip("torch")
    records = [{"global_physical_count": torch.ones(1, 4), "forward_pass_id": i,
                "topk_ids_of_layer": torch.zeros(1, 3, k, dtype=torch.int64)}
               for i, k in enumerate((2, 3))]
    torch.save({"last_physical_to_logical_map": torch.tensor([[0, 1, 2, 3]]),
                "records": records}, tmp_path / "k.pt")
    with pytest.raises(TraceError, match="picks 3 experts per token but records"):
        traces.read(tmp_path / "k.pt")


DIGITS = "7" * 5000
WORKLOADS = {
    "bigint.jsonl": ('{"timestamp": 0, "input_length": ' + DIGITS + ', "output_length": 1}\n',
                     "not usable JSON"),
    "hugetime.jsonl": ('{"timestamp": 1' + "0" * 400 + ', "input_length": 5, '
                       '"output_length": 1}\n', "beyond 2**53"),
    "deep.jsonl": ('{"timestamp": 0, "input_length": 5, "output_length": 1, "x": '
                   + "[" * 100_000 + "]" * 100_000 + "}\n", "nested too deeply"),
    "hugetime.csv": ("arrival_s,input_tokens,output_tokens\n1" + "0" * 400 + ",10,10\n",
                     "arrival times must be finite"),
    "bigint.csv": (f"arrival_s,input_tokens,output_tokens\n0,{DIGITS},10\n",
                   "(5002 characters) is not a number"),
    "azure_header.csv": ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "header but no requests"),
    "azure_years.csv": ("TIMESTAMP,ContextTokens,GeneratedTokens\n9999-12-31 23:59:59,10,10\n"
                        "0001-01-01 00:00:00,10,10\n", "beyond years 1677..2262"),
}


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_workload_files_beyond_what_they_can_hold(tmp_path, name):
    text, fragment = WORKLOADS[name]
    (tmp_path / name).write_text(text)
    with pytest.raises(InputError, match=fragment.replace("*", r"\*").replace("(", r"\(")
                       .replace(")", r"\)")):
        W.read(tmp_path / name)


def test_parquet_workloads_with_odd_columns_and_metadata(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    frame = {"arrival_s": [0.0, 1.0], "input_tokens": [10, 20], "output_tokens": [5, 5]}
    bad = {"na": ({**frame, "input_tokens": pd.array([10, None], dtype="Int64")},
                  "is missing or not finite"),
           "dates": ({**frame, "arrival_s": pd.to_datetime(["2024-01-01", "2024-01-02"])},
                     "holds datetime64"),
           "durations": ({**frame, "arrival_s": pd.to_timedelta([0, 1], unit="s")},
                         "holds timedelta64")}
    for name, (cols, fragment) in bad.items():
        pd.DataFrame(cols).to_parquet(tmp_path / f"{name}.parquet")
        with pytest.raises(InputError, match=fragment):
            W.read(tmp_path / f"{name}.parquet")
    base = pa.Table.from_pandas(pd.DataFrame(frame), preserve_index=False)
    for i, meta in enumerate((b"\xff\xfe", b"[1, 2]", b"[" * 50_000 + b"]" * 50_000)):
        pq.write_table(base.replace_schema_metadata({b"eplb.workload.meta": meta}),
                       tmp_path / f"m{i}.parquet")  # provenance only: left out
        assert len(W.read(tmp_path / f"m{i}.parquet")) == 2
    for i, size in enumerate((b"1" + b"0" * 30, b"-512", "\u00b2".encode(), b"9" * 5000)):
        pq.write_table(base.replace_schema_metadata({b"eplb.workload.block_size": size}),
                       tmp_path / f"b{i}.parquet")
        with pytest.raises(InputError, match="block_size"):
            W.read(tmp_path / f"b{i}.parquet")


def test_workload_api_takes_only_what_it_can_hold(small):  # noqa: F811
    w = W.read("w.jsonl")
    for n in ("x", 1.5, -3, None):
        with pytest.raises(InputError, match="n must be a non-negative integer"):
            w.head(n)
    with pytest.raises(InputError, match="block_size must be a whole number"):
        W.read("w.jsonl", block_size=10**30)
    one_error(*run_cli("workload", "info", "w.jsonl", "--block-size", "1" + "0" * 30)[::2],
              "block_size")


def test_config_api_takes_only_what_it_can_hold():
    from eplb.evaluation.serving.config.overrides import apply, parse_variant

    for junk in (None, 3, b"c.toml"):
        with pytest.raises(InputError, match="a cluster config is a TOML file name"):
            ClusterConfig.from_toml(junk)
    for junk in (None, 5, ["a:b=1"]):
        with pytest.raises(InputError, match="a variant is a NAME:KEY=VALUE"):
            parse_variant(junk)
    config = ClusterConfig.load("deepseek_day6")
    with pytest.raises(InputError, match="an override is a KEY=VALUE string"):
        apply(config, [None])
    with pytest.raises(InputError, match="a list of KEY=VALUE strings"):
        apply(config, "decode.count=2")


def test_scheduler_addresses_are_checked_before_connecting(small):  # noqa: F811
    pytest.importorskip("distributed")
    from eplb.runners import _check_address

    for address in ("bogus", "::x::", "tcp://", "tcp://:8786", "tcp://h:99999", 5, None):
        with pytest.raises(InputError, match="scheduler"):
            _check_address(address)
    _check_address("tcp://10.0.0.5:8786")
    _check_address("inproc://10.0.0.5/1/2")  # a LocalCluster in this process
    one_error(*run_cli("compare", "t.npz", "--topologies", "2x4:32", "--quiet", "--solvers",
                       "greedy", "--scheduler", "::x::")[::2], "scheduler '::x::'")


@pytest.mark.parametrize("fmt, field", [("vllm", "initial_global_assignments"),
                                        ("sglang", "physical_to_logical_map")])
def test_runtime_files_with_an_empty_slot_are_refused(small, fmt, field):  # noqa: F811
    from eplb.io import read_placement

    name = "map.jsonl" if fmt == "vllm" else "map.json"
    assert run_cli("solve", "t.npz", "--topology", "2x4", "--slots", "32", "--format", fmt,
                   "-o", name)[0] == 0
    doc = json.loads((small / name).read_text())
    if fmt == "vllm":
        doc["initial_global_assignments"]["0"][5] = -1
    else:
        doc["physical_to_logical_map"][0][5] = -1
    (small / name).write_text(json.dumps(doc) + "\n")
    with pytest.raises(EplbError, match=f"{field} row 0, slot 5 is -1"):
        read_placement(small / name, format=fmt, topology=Topology.parse("2x4", 32))
    one_error(*run_cli("evaluate", name, "t.npz", "--topology", "2x4", "--slots", "32")[::2],
              "slot 5 is -1", "no empty slot")


def test_trace_stack_refuses_a_fifo_inside_a_folder(small):  # noqa: F811
    fifo = _rankdir(small / "rd", layers=("1",))
    os.mkfifo(fifo / "0" / "moe_layer-0.csv")
    one_error(*run_cli("trace", "stack", "rd", "t.npz", "-o", "s.npz")[::2], "is a FIFO")
    assert not (small / "s.npz").exists()
    assert np.isfinite(traces.read("t.npz").counts).all()
