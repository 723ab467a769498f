"""Issue 37 part 4: a file given to the wrong verb is named for what it is, with the verb that
takes it (a request trace to ``eplb solve`` used to say "the file may be truncated"), and
swapped ``eplb evaluate`` arguments say they look swapped (they used to say "missing field
'phy2log'")."""

from __future__ import annotations

import json

import pytest

from eplb import Topology, solvers, traces
from eplb.cli.recognise import CLUSTER, PLACEMENT, REQUESTS, RESULT, SUMMARY, TRACE, kind_of
from eplb.io import write_placement
from tests._cli import run_cli
from tests.conftest import BUNDLED

TRACE_FILE = BUNDLED / "zipf-58x256.npz"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("wrong")
    out = {}
    out["mooncake"] = d / "conv.jsonl"
    out["mooncake"].write_text("".join(json.dumps(
        {"timestamp": t, "input_length": 900 + t, "output_length": 20, "hash_ids": [t, t + 1]})
        + "\n" for t in range(3)))
    out["azure"] = d / "az.csv"
    out["azure"].write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                            "2023-11-16 18:17:03.9799600,4808,10\n")
    trace = traces.read(TRACE_FILE)
    p = solvers.solve("deepseek", trace, Topology.parse("4x8", 288))
    for name, suffix in (("native", ".json"), ("sglang", ".json"), ("trtllm", ".yaml"),
                         ("npz", ".npz")):
        out[name] = d / f"p_{name}{suffix}"
        write_placement(p, out[name], name, layer_ids_are_model_ids=True)
    code, toml, err = run_cli("simulate", "--print-config", "deepseek_day6")
    assert code == 0, err
    out["cluster"] = d / "cluster.toml"
    out["cluster"].write_text(toml)
    out["summary"] = d / "summary.json"
    out["summary"].write_text(json.dumps({"ttft_p50_s": 1.2, "goodput": 0.9}, indent=1))
    out["results"] = d / "results.csv"
    out["results"].write_text("trace,topology,solver,status,max_over_bound_mean\n"
                              "t,4x8:288,greedy,ok,1.01\n")
    return out


def test_kinds_are_recognised(files):
    want = {"mooncake": REQUESTS, "azure": REQUESTS, "native": PLACEMENT, "sglang": PLACEMENT,
            "trtllm": PLACEMENT, "npz": PLACEMENT, "cluster": CLUSTER, "summary": SUMMARY,
            "results": RESULT}
    assert {k: kind_of(files[k]).group for k in want} == want
    assert kind_of(TRACE_FILE).group == TRACE


@pytest.mark.parametrize(("name", "what", "verb"), [
    ("mooncake", "Mooncake request trace", "eplb workload info"),
    ("azure", "Azure LLM inference trace", "eplb simulate --workload"),
    ("native", "eplb placement", "eplb evaluate PLACEMENT TRACE"),
    ("sglang", "SGLang expert-location file", "eplb evaluate PLACEMENT TRACE"),
    ("cluster", "cluster config", "eplb simulate CONFIG"),
    ("summary", "serving result summary", "output of eplb"),
    ("results", "comparison result table", "output of eplb"),
])
def test_solve_names_the_file_and_its_verb(files, name, what, verb):
    code, _, err = run_cli("solve", files[name], "--topology", "4x8", "--slots", 288)
    assert code == 2
    assert what in err and verb in err and "not an expert-load trace" in err
    assert "truncated" not in err


def test_compare_and_trace_info_name_the_file(files):
    code, _, err = run_cli("compare", files["mooncake"], "--solvers", "deepseek", "--quiet")
    assert code == 2 and "Mooncake request trace" in err
    code, _, err = run_cli("trace", "info", files["cluster"])
    assert code == 2 and "eplb simulate CONFIG" in err


def test_evaluate_says_swapped_arguments(files):
    code, _, err = run_cli("evaluate", TRACE_FILE, files["native"])
    assert code == 2 and "look swapped" in err and "phy2log" not in err
    assert f"run eplb evaluate {files['native']} {TRACE_FILE}" in err


def test_evaluate_names_a_request_trace_and_a_trace_as_placement(files):
    code, _, err = run_cli("evaluate", files["native"], files["mooncake"])
    assert code == 2 and "Mooncake request trace" in err
    code, _, err = run_cli("evaluate", files["cluster"], TRACE_FILE)
    assert code == 2 and "cluster config" in err and "not a placement file" in err


def test_solve_names_the_verb_that_takes_a_summary(files):
    """A simulate summary.json is an input of ``advise --from-summary``, not only an output."""
    code, _, err = run_cli("solve", files["summary"], "--topology", "4x8", "--slots", 288)
    assert code == 2 and "eplb advise --from-summary" in err


@pytest.mark.parametrize(("name", "what"), [
    ("native", "eplb placement"), ("npz", "eplb placement"), ("cluster", "cluster config"),
    ("trace", "expert-load trace"),
])
def test_workload_readers_name_the_file_and_its_verb(files, name, what):
    """``eplb workload info`` and ``simulate --workload`` given another kind of file said "line
    1 has no 'timestamp'" or "unknown workload format"."""
    path = TRACE_FILE if name == "trace" else files[name]
    code, _, err = run_cli("workload", "info", path)
    assert code == 2 and what in err and "not a request workload" in err
    code, _, err = run_cli("simulate", "deepseek_day6", "--workload", path, "-o",
                           files["native"].parent / "never")
    assert code == 2 and what in err and "not a request workload" in err


@pytest.mark.parametrize(("name", "what"), [
    ("native", "eplb placement"), ("mooncake", "Mooncake request trace"),
])
def test_simulate_config_names_the_file_and_its_verb(files, name, what):
    """``eplb simulate PLACEMENT`` said "is not valid TOML"."""
    code, _, err = run_cli("simulate", files[name], "--workload", files["mooncake"], "-o",
                           files["native"].parent / "never")
    assert code == 2 and what in err and "not a cluster config" in err
    code, _, err = run_cli("simulate", "--print-config", files[name])
    assert code == 2 and what in err and "not a cluster config" in err


def test_execute_and_replay_name_the_file_and_its_verb(files):
    """``eplb execute TRACE`` said "missing array 'phy2log'"; ``replay`` and ``execute
    --trace`` read a request trace as a truncated expert-load file."""
    code, _, err = run_cli("execute", TRACE_FILE)
    assert code == 2 and "expert-load trace" in err and "not a placement file" in err
    code, _, err = run_cli("execute", files["native"], "--trace", files["mooncake"])
    assert code == 2 and "Mooncake request trace" in err and "not an expert-load trace" in err
    code, _, err = run_cli("replay", files["native"], "--topology", "4x8", "--slots", 288,
                           "--interval", 1)
    assert code == 2 and "eplb placement" in err and "not an expert-load trace" in err
