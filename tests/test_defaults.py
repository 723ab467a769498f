"""Issue 37 part 2: defaults that never fail. ``eplb compare``'s default solver list runs on
every trace and topology (``lplb`` with a replica graph that fits, or left out with one line;
policies that need groups left out where none are known); ``solve`` and ``compare`` take the
expert groups (and the groups a token may use) from the trace's record or its model, else say
in one line what ran and how to give them; the README's solver table lists every registered
policy, and the default lists run every one of them (``repair`` needs ``--previous``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from eplb import solvers
from eplb.evaluation.compare import compare
from eplb.evaluation.serving.advise import LEVERS
from eplb.traces import Trace
from tests._cli import run_cli

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_policies() -> set[str]:
    """The names in the first column of the README's solver table."""
    text = README.read_text()
    table = text[text.index("| name | what it does |"):]
    table = table[:table.index("\n\n")]
    return {n for row in table.splitlines()[2:] for n in re.findall(r"`(\w+)`",
                                                                     row.split("|")[1])}


def small_trace(groups: bool) -> Trace:
    rng = np.random.default_rng(5)
    counts = rng.gamma(0.6, 40.0, size=(1, 2, 256)).round() + 1
    meta = {"num_groups": 8, "topk_groups": 4} if groups else {}
    return Trace(counts, np.array([3, 4]), meta={"num_model_layers": 61, **meta})


def test_readme_table_lists_every_registered_policy():
    assert readme_policies() == set(solvers.available())


def test_default_list_runs_everywhere_and_says_what_it_left_out():
    res = compare({"t": small_trace(groups=False)}, topologies="4x8:288,18x8:288,1x8x35",
                  time_limit=0.2, progress=False)
    assert (res.summary["status"] == "ok").all()
    ran = set(res.summary["solver"])
    left = res.skipped
    # every policy of the README's table runs or is left out with a reason; repair needs a
    # live placement and is no default
    assert ran | set(left["solver"]) == readme_policies() - {"repair"}
    assert set(left[left["solver"] == "lplb"]["topology"]) == {"4x8:288", "18x8:288"}
    assert "lplb" in ran  # 1 x 8 GPUs x 35 slots: the cube graph fits, chosen by default
    assert set(left[left["solver"].isin(["hierarchical", "relaxed"])]["why"].str[:21]) == {
        "needs expert groups a"}
    lines = res.skipped_lines()
    assert len(lines) == len(set(left["solver"]))  # one line per policy left out
    assert any(line.startswith("lplb left out") and "no replica graph" in line
               for line in lines)


def test_default_list_with_groups_runs_group_policies():
    res = compare({"t": small_trace(groups=True)}, topologies="4x8:288", time_limit=0.2,
                  progress=False)
    assert {"hierarchical", "relaxed"} <= set(res.summary["solver"])
    assert set(res.skipped["solver"]) == {"lplb"}


@pytest.fixture()
def dump(tmp_path):
    """An SGLang dump (no groups, no model named): 61 model layers, 3 MoE layers with load."""
    counts = np.zeros((61, 256), dtype=int)
    counts[3:5] = small_trace(False).counts[0].astype(int)
    path = tmp_path / "dump.json"
    path.write_text(json.dumps({"logical_count": counts.tolist()}))
    return path


def test_solve_without_groups_says_the_global_policy_ran(dump):
    code, out, err = run_cli("solve", dump, "--topology", "4x8", "--slots", 288)
    assert code == 0, err
    assert re.search(r"expert groups +none known.*deepseek ran the global policy.*--groups G "
                     r"\(DeepSeek-V3: 8\) or --model", out)
    code, out, err = run_cli("solve", dump, "--topology", "4x8", "--slots", 288, "--model",
                             "deepseek_v3")
    assert code == 0, err
    assert "deepseek (hierarchical)" in out and "8 from model deepseek_v3 (--model)" in out


def test_solve_takes_groups_from_the_model_the_dump_names(tmp_path):
    L, E, P = 3, 256, 288
    rng = np.random.default_rng(0)
    rec = {"record_type": "eplb_load_stats", "version": 1, "model": "deepseek-ai/DeepSeek-V3",
           "step": 1, "num_ranks": 32, "num_layers": L,
           "expert_load": rng.integers(0, 50, size=(L, P)).tolist(),
           "p2l_map": [[p % E for p in range(P)]] * L}
    path = tmp_path / "stats.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    code, out, err = run_cli("solve", path, "--topology", "4x8", "--slots", P)
    assert code == 0, err
    assert "8 from model deepseek_v3 (named by the trace: 'deepseek-ai/DeepSeek-V3')" in out
    assert "deepseek (hierarchical)" in out


def test_compare_without_topk_groups_says_what_traffic_assumes(dump):
    code, _, err = run_cli("compare", dump, "--solvers", "deepseek", "--quiet")
    assert code == 0, err
    assert "traffic assumes unrestricted top-k routing" in err and "--topk-groups 4" in err
    code, _, err = run_cli("compare", dump, "--solvers", "deepseek", "--groups", 8, "--quiet")
    assert code == 0 and "any of the 8 expert groups" in err
    out = dump.parent / "r.csv"
    code, _, err = run_cli("compare", dump, "--solvers", "deepseek", "--model", "deepseek_v3",
                           "--quiet", "-o", out)
    assert code == 0, err
    assert "traffic assumes" not in err
    import pandas as pd

    row = pd.read_csv(out).iloc[0]
    assert (row["num_groups"], row["topk_groups"]) == (8, 4)


def test_advise_default_levers_run_policies_of_the_readme_table():
    policies = readme_policies()
    assert "craft" in LEVERS and "craft" in policies  # advise's craft lever is a table policy
    code, text, _ = run_cli("advise", "--help")
    assert code == 0
    help_levers = re.search(r"default all: ([a-z_, ]+);", " ".join(text.split())).group(1)
    assert [x.strip() for x in help_levers.split(",")] == list(LEVERS)
    assert re.search(r"--solver NAME.*default deepseek", " ".join(text.split()))
    assert "deepseek" in policies
