"""Found by an acceptance pass on unseen inputs: repeated paired seeds refused before any work,
`--previous` with any solver (relabels, as `solvers.solve` and the README say), and `solve`'s
groups row true for a policy that places globally although the groups fit."""

from __future__ import annotations

import json

from tests._cli import run_cli

BUNDLED = "traces/data/deepseek-v3-calibrated.npz"


def test_repeated_seeds_are_one_error_before_work(tmp_path):
    out = tmp_path / "run"
    code, _, err = run_cli("simulate", "deepseek_day6", "--workload", "synth:n=10,rate=3",
                           "--duration", "2", "--seeds", "0,0", "--no-progress", "-o", out)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("eplb: error:"), err
    assert "repeats a seed" in lines[0] and not out.exists()


def test_previous_relabels_for_any_solver(tmp_path):
    from pathlib import Path

    trace = str(Path(__file__).resolve().parents[1] / BUNDLED)
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    assert run_cli("solve", trace, "--topology", "2x4", "--slots", "288", "-o", first)[0] == 0
    code, out, err = run_cli("solve", trace, "--topology", "2x4", "--slots", "288", "--solver",
                             "greedy", "--previous", first, "-o", second)
    assert code == 0, err
    moved = json.loads(second.read_text())["solver"]["replicas_moved"]
    assert "replicas moved" in out and len(moved) == 58 and min(moved) >= 0  # per layer


def test_groups_row_for_a_global_policy_whose_groups_fit(tmp_path):
    from pathlib import Path

    trace = str(Path(__file__).resolve().parents[1] / BUNDLED)
    code, out, _ = run_cli("solve", trace, "--topology", "4x8", "--slots", "288", "--groups",
                           "8", "--solver", "greedy", "-o", tmp_path / "g.json")
    row = next(x for x in out.splitlines() if x.startswith("groups"))
    assert code == 0 and "not a multiple" not in row
    assert "8 groups fit the 4 nodes" in row and "hierarchical" in row
    code, out, _ = run_cli("solve", trace, "--topology", "3x8", "--slots", "288", "--groups",
                           "8", "--solver", "greedy", "-o", tmp_path / "h.json")
    row = next(x for x in out.splitlines() if x.startswith("groups"))
    assert code == 0 and "8 groups are not a multiple of the 3 nodes" in row


def test_workload_errors_show_cells_as_written(tmp_path):
    path = tmp_path / "w.csv"
    path.write_text("request_id,arrival_s,input_tokens,output_tokens\n0,0.0,10,5\n1,nan,10,5\n")
    code, _, err = run_cli("workload", "info", path)
    assert code == 2 and "(request_id 1): nan;" in err and "np." not in err, err


def test_advise_cells_never_use_exponents():
    from eplb.evaluation.serving.advise import _cell

    assert _cell(32_280.4) == "32,280" and _cell(9_067.0) == "9,067"
    assert _cell(1.16649) == "1.166" and _cell(-27.31) == "-27.31"
