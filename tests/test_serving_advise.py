"""`eplb advise` / `serving.advise`: the table, its columns, bad input, and properties that hold
on every load (balance bounds, break-even against the gain's sign, KV cost of redundancy)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eplb.cli.main import main
from eplb.errors import InputError
from eplb.evaluation.serving.advise import COLUMNS, LEVERS, advise, balance_bound, columns_for

L, E = 58, 256  # deepseek_v3's MoE layers and routed experts


def _load(seed: int, shape: float = 0.5) -> np.ndarray:
    return np.random.default_rng(seed).gamma(shape, 100.0, size=(L, E))


@pytest.fixture(scope="module")
def small():
    """One decode advice on a 2 x 8 H800 unit (256 slots, +16 redundant)."""
    return advise(_load(0), "2x8", 256, phase="decode", tokens_per_rank=32, redundant=(0, 16),
                  max_tokens=128)


def _dump(tmp_path, load=None, name="dump.json"):
    """An SGLang expert-distribution JSON (every model layer; the 3 dense rows zero)."""
    load = _load(1) if load is None else load
    rows = np.vstack([np.zeros((3, load.shape[1])), load])
    path = tmp_path / name
    path.write_text(json.dumps({"logical_count": rows.tolist()}))
    return path


def test_table_rows_and_columns(small):
    t = small.table
    assert list(t.columns) == list(columns_for("decode"))
    # decode counts its batch in requests: the per-rank columns say so by name and unit
    assert "requests_per_rank" in t and "break_even_requests" in t
    assert "tokens_per_rank" not in t and "break_even_tokens" not in t
    assert small.columns["break_even_requests"][0] == "requests/rank"
    assert list(columns_for("prefill")) == list(COLUMNS)
    assert t.iloc[0]["lever"] == "today" and t.iloc[0]["gain_pct"] == 0.0
    assert set(t["lever"]) == set(LEVERS)
    assert set(small.columns) == set(t.columns)
    for unit, source, meaning in small.columns.values():
        assert unit and source and meaning
    kinds = {c: s for c, (_, s, _) in small.columns.items()}
    assert "modelled" in kinds["step_ms"] and "modelled" in kinds["tok_s_per_node"]
    assert "measured" in " ".join(small.meta["notes"])
    # the today row moves nothing; the redundant rows are the slot counts asked for
    assert t.iloc[0]["bytes_moved_gb"] == 0.0
    assert sorted(t.loc[t.lever == "redundant", "slots"]) == [256, 272]
    json.dumps(small.to_dict(), allow_nan=False)  # NaN becomes null
    text = small.to_text()
    for c in columns_for("decode"):
        assert f"  {c} [" in text  # one line per column


def test_properties_on_the_fixture(small):
    t = small.table
    placed = t[t.lever != "bound"]
    assert (placed["balance"] >= placed["balance_bound"] - 1e-9).all()
    stall = t[t.bytes_moved_gb > 0]
    assert (stall["stall_s"] == stall["copy_s"]).all() and (stall["copy_s"] > 0).all()
    red = t[t.lever == "redundant"].sort_values("slots")
    assert red["kv_tokens_per_gpu"].is_monotonic_decreasing
    assert red["max_requests_per_gpu"].is_monotonic_decreasing


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), shape=st.sampled_from([0.2, 1.0, 5.0]),
       tokens=st.sampled_from([4, 24, 64]))
def test_break_even_agrees_with_the_gain(seed, shape, tokens):
    a = advise(_load(seed, shape), "2x8", 256, phase="decode", tokens_per_rank=tokens,
               redundant=(16,), levers=["redundant", "dispatch_lp"], max_tokens=64)
    for _, r in a.table.iloc[1:].iterrows():
        be = r["break_even_requests"]
        if r["gain_pct"] > 0:
            assert be <= tokens, r.to_dict()
        else:
            assert math.isnan(be) or be > tokens, r.to_dict()


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**16), shape=st.floats(0.05, 5.0),
       gpus=st.sampled_from([8, 16, 32]), extra=st.lists(st.integers(0, 6), min_size=2,
                                                         max_size=4))
def test_balance_bound_never_rises_with_slots(seed, shape, gpus, extra):
    load = _load(seed, shape)[:4]
    slots = sorted({E + gpus * k for k in extra})
    b = [balance_bound(load, gpus, p) for p in slots]
    assert all(x >= y - 1e-12 for x, y in zip(b, b[1:], strict=False))
    assert all(x >= 1.0 for x in b)


def test_steps_are_steady_states(small):
    """advise's prepared step model gives steady_state's step on the same unit."""
    from eplb.evaluation.serving import ClusterConfig, UnitConfig, steady_state
    from eplb.evaluation.serving.simulator.planner import trivial_placement

    cfg = ClusterConfig(prefill=UnitConfig(nodes=2, slots_per_layer=256, token_budget=1),
                        decode=UnitConfig(nodes=2, slots_per_layer=256, max_running_requests=32))
    today = trivial_placement(cfg.model_spec, cfg.unit("decode").topology())
    t = small.table.set_index("option")
    for placement, option in ((today, "trivial"), (None, "perfect balance")):
        n = int(t.loc[option, "requests_per_rank"])  # 32 asked, capped by the KV cache
        assert n == min(32, int(t.loc[option, "max_requests_per_gpu"]))
        r = steady_state(cfg, "decode", placement=placement, kv_tokens=4096, batch=n,
                         load=None if placement is None else _load(0))
        assert t.loc[option, "step_ms"] == pytest.approx(r["step_s"] * 1e3, rel=1e-9)
        assert t.loc[option, "tok_s_per_node"] == pytest.approx(r["tok_s_per_node"], rel=1e-9)
    # the waterfill row on today's placement is steady_state with shared_expert = "waterfill"
    row = small.table[(small.table.lever == "waterfill") & (small.table.option == "today")]
    assert list(row["shared_expert"]) == ["waterfill"]
    n = int(row["requests_per_rank"].iloc[0])
    r = steady_state(cfg.replace(shared_expert="waterfill"), "decode", placement=today,
                     kv_tokens=4096, batch=n, load=_load(0))
    assert row["step_ms"].iloc[0] == pytest.approx(r["step_s"] * 1e3, rel=1e-9)


def test_previous_placement_that_is_the_solution_moves_nothing(tmp_path):
    from eplb import solvers
    from eplb.io import write_placement
    from eplb.topology import Topology

    load = _load(3)
    p = solvers.solve("deepseek", load, Topology(2, 8, 16), num_groups=8, seed=0)
    path = tmp_path / "placement.json"
    write_placement(p, path)
    a = advise(load, "2x8", 256, previous=str(path), tokens_per_rank=16,
               levers=["rebalance"], max_tokens=64)
    row = a.table.set_index("lever").loc["rebalance"]
    assert row["bytes_moved_gb"] == 0.0 and row["copy_s"] == 0.0


def _solution_files(tmp_path, load):
    """The placement deepseek solves on ``load`` (2 x 8 GPUs, 256 slots), written twice with
    model layer ids 3..60: rows in layer order, and the same rows shuffled."""
    from eplb import solvers
    from eplb.io import write_placement
    from eplb.placement import Placement
    from eplb.topology import Topology

    p = solvers.solve("deepseek", load, Topology(2, 8, 16), num_groups=8, seed=0)
    ids = np.arange(3, 3 + L)
    perm = np.random.default_rng(0).permutation(L)
    assert not (perm == np.arange(L)).all()
    paths = tmp_path / "sorted.json", tmp_path / "shuffled.json"
    write_placement(Placement(p.phy2log, E, p.topology, None, p.meta, ids), paths[0])
    write_placement(Placement(p.phy2log[perm], E, p.topology, None, p.meta, ids[perm]), paths[1])
    return paths


def test_previous_file_rows_in_any_layer_order(tmp_path):
    """A placement file's rows are matched to the model's layers by their layer ids, whatever
    order the file lists them in (advise applied them in file order: on a shuffled file that
    is the solution, "today" ran a scrambled placement and rebalancing moved ~593 GB)."""
    load = _load(3)
    tables = [advise(load, "2x8", 256, previous=str(path), tokens_per_rank=16,
                     levers=["rebalance"], max_tokens=64).table
              for path in _solution_files(tmp_path, load)]
    pd.testing.assert_frame_equal(tables[0], tables[1])
    row = tables[1].set_index("lever").loc["rebalance"]
    assert row["bytes_moved_gb"] == 0.0 and row["copy_s"] == 0.0


def test_cli_previous_file_rows_in_any_layer_order(tmp_path, capsys):
    load = _load(1)
    dump = _dump(tmp_path, load)
    rows = []
    for path in _solution_files(tmp_path, load):
        assert main(["advise", str(dump), "--topology", "2x8", "--slots", "256",
                     "--tokens-per-rank", "16", "--levers", "rebalance", "--max-tokens", "64",
                     "--previous", str(path), "--json"]) == 0
        rows.append(json.loads(capsys.readouterr().out)["rows"])
    assert rows[0] == rows[1]
    assert [r["bytes_moved_gb"] for r in rows[1]] == [0.0, 0.0]


def test_overlap_migration_does_not_stall():
    a = advise(_load(4), "2x8", 256, tokens_per_rank=16, migration="overlap",
               levers=["rebalance"], max_tokens=64)
    row = a.table.set_index("lever").loc["rebalance"]
    assert row["copy_s"] > 0 and row["stall_s"] == 0.0


def test_cli_table_json_and_csv(tmp_path, capsys):
    dump = _dump(tmp_path)
    args = [str(dump), "--topology", "2x8", "--slots", "256", "--tokens-per-rank", "16",
            "--redundant", "16", "--max-tokens", "32"]
    assert main(["advise", *args]) == 0
    out = capsys.readouterr().out
    assert "step_ms [ms]" in out and "columns:" in out and "measured" in out
    assert main(["advise", *args, "--json", "-o", str(tmp_path / "a.csv")]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["lever"] for r in data["rows"]][0] == "today"
    assert set(data["columns"]) == set(columns_for("decode"))
    assert (tmp_path / "a.csv").read_text().startswith("lever,option,slots")


def test_cli_lp_overhead_is_the_lp_rows_cost(tmp_path, capsys):
    # --lp-overhead: seconds per MoE layer and micro-batch on the critical path of the lp rows
    args = [str(_dump(tmp_path)), "--topology", "2x8", "--slots", "288", "--tokens-per-rank",
            "16", "--redundant", "0", "--max-tokens", "32", "--json"]
    steps = {}
    for v in ("0", None, "2e-4"):
        assert main(["advise", *args, *(["--lp-overhead", v] if v else [])]) == 0
        rows = json.loads(capsys.readouterr().out)["rows"]
        steps[v] = [r["step_ms"] for r in rows if r["lever"] == "dispatch_lp"]
    for a, b in zip(steps["0"], steps[None], strict=True):  # default: 100 us x 58 x 2
        assert b - a == pytest.approx(11.6, rel=1e-6)
    for a, b in zip(steps["0"], steps["2e-4"], strict=True):
        assert b - a == pytest.approx(23.2, rel=1e-6)
    for bad in ("-1", "nan", "inf"):
        with pytest.raises(SystemExit) as exc:  # argparse's own one-line error
            main(["advise", *args, "--lp-overhead", bad])
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--lp-overhead" in err[0], err


@pytest.mark.parametrize("extra, needle", [
    (["--topology", "2by8"], "topology"),
    (["--slots", "250"], "slots"),
    (["--hardware", "b300"], "hardware"),
    (["--tokens-per-rank", "0"], "tokens_per_rank"),
    (["--redundant", "a,b"], "--redundant"),
    (["--solver", "nope"], "solver"),
    (["--kv-tokens", "100000000"], "KV"),
    (["--solver", "lplb", "--option", "graph=ring"], "graph"),
    (["--option", "bogus=1"], "bogus"),
    (["--option", "seed=1"], "--seed"),
    (["--option", "graph"], "KEY=VALUE"),
])
def test_cli_bad_input_one_error_line(tmp_path, capsys, extra, needle):
    dump = _dump(tmp_path)
    base = {"--topology": "2x8", "--slots": "256", "--tokens-per-rank": "16"}
    args = [str(dump)]
    flags = dict(zip(extra[::2], extra[1::2], strict=True))
    for k, v in {**base, **flags}.items():
        args += [k, v]
    assert main(["advise", *args, "--max-tokens", "64"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("eplb: error:") and needle in err[0], err


def test_cli_bad_dumps(tmp_path, capsys):
    wrong = _dump(tmp_path, np.ones((10, 64)), "wrong.json")
    for dump in (wrong, tmp_path / "missing.json"):
        assert main(["advise", str(dump), "--topology", "2x8", "--slots", "256"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("eplb: error:"), err


def test_api_rejects_bad_arguments():
    with pytest.raises(InputError, match="phase"):
        advise(_load(0), "2x8", 256, phase="train")
    with pytest.raises(InputError, match="lever"):
        advise(_load(0), "2x8", 256, levers=["magic"])
    with pytest.raises(InputError, match="migration"):
        advise(_load(0), "2x8", 256, migration="later")
    with pytest.raises(InputError, match="redundant"):
        advise(_load(0), "2x8", 256, redundant=5)
    with pytest.raises(InputError, match="levers"):
        advise(_load(0), "2x8", 256, levers="rebalance")
    with pytest.raises(InputError, match="max_tokens"):
        advise(_load(0), "2x8", 256, max_tokens=2**40)


LPLB = dict(hardware="h200", phase="decode", tokens_per_rank=16, max_tokens=32)  # 1x8, 304 slots


def test_solver_options_reach_every_row_that_solves():
    # lplb's graph: torus (degree 2 on 1 x 8 GPUs) against the default hypercube (degree 3);
    # graph=cube is the hypercube itself on 8 GPUs (the only count it takes), so it is not used
    from eplb import solvers
    from eplb.topology import Topology

    load = _load(0)
    levers = ["rebalance", "redundant", "dispatch_lp", "waterfill", "dispatch_duplicate"]
    a = advise(load, "1x8", 304, solver="lplb", solver_options={"graph": "torus"},
               redundant=(48,), levers=levers, **LPLB)
    want = solvers.solve("lplb", load, Topology(1, 8, 38), num_groups=8, seed=0, graph="torus")
    plain = solvers.solve("lplb", load, Topology(1, 8, 38), num_groups=8, seed=0)
    assert not np.array_equal(want.phy2log, plain.phy2log)
    solved = [(r, p) for r, p in zip(a.table.to_dict("records"), a.placements, strict=True)
              if r["option"] != "today" and r["lever"] != "today"]
    assert {r["lever"] for r, _ in solved} == set(levers)
    for row, p in solved:
        assert np.array_equal(p.phy2log, want.phy2log), row
        assert row["option"] in ("lplb(graph=torus)", "N=48") or \
            row["option"].startswith("lplb(graph=torus)+"), row
    assert a.meta["solver_options"] == {"graph": "torus"}
    assert "solver lplb(graph=torus);" in a.to_text().splitlines()[0]
    with pytest.raises(InputError, match="graph"):
        advise(load, "1x8", 304, solver="lplb", solver_options={"graph": "ring"}, **LPLB)
    with pytest.raises(InputError, match="solver_options"):
        advise(load, "1x8", 304, solver="lplb", solver_options="graph=torus", **LPLB)


def test_cli_option_changes_the_placement(tmp_path, capsys):
    args = ["advise", str(_dump(tmp_path)), "--topology", "1x8", "--slots", "304",
            "--hardware", "h200", "--tokens-per-rank", "16", "--max-tokens", "32",
            "--levers", "rebalance", "--solver", "lplb"]
    out = {}
    for extra in ([], ["--option", "graph=torus"]):
        assert main([*args, *extra, "--json"]) == 0
        out[tuple(extra)] = json.loads(capsys.readouterr().out)
    plain, torus = out[()], out[("--option", "graph=torus")]
    assert plain["meta"]["solver_options"] == {}
    assert torus["meta"]["solver_options"] == {"graph": "torus"}
    rows = [{r["lever"]: r for r in o["rows"]}["rebalance"] for o in (plain, torus)]
    assert rows[0]["option"] == "lplb" and rows[1]["option"] == "lplb(graph=torus)"
    assert rows[0]["balance"] != rows[1]["balance"]  # another placement
    assert main([*args, "--option", "graph=torus"]) == 0
    assert "solver lplb(graph=torus);" in capsys.readouterr().out.splitlines()[0]


def test_stacked_windows_file_is_summed(tmp_path):
    from eplb import traces

    a, b = _load(5), _load(6)
    path = tmp_path / "stacked.npz"
    traces.write(traces.Trace(np.stack([a, b])), path)
    got = advise(str(path), "2x8", 256, tokens_per_rank=16, levers=["rebalance"], max_tokens=32)
    ref = advise(a + b, "2x8", 256, tokens_per_rank=16, levers=["rebalance"], max_tokens=32)
    assert got.meta["windows"] == 2
    assert got.table["step_ms"].tolist() == ref.table["step_ms"].tolist()


def test_cli_previous_for_another_deployment(tmp_path, capsys):
    from eplb import solvers
    from eplb.io import write_placement
    from eplb.topology import Topology

    p = solvers.solve("greedy", _load(7), Topology(4, 8, 8), seed=0)
    path = tmp_path / "other.json"
    write_placement(p, path)
    dump = _dump(tmp_path)
    assert main(["advise", str(dump), "--topology", "2x8", "--slots", "256",
                 "--previous", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("eplb: error:"), err


@pytest.fixture(scope="module")
def crafted():
    """Decode advice with the craft lever on a 2 x 8 unit of 272 slots (16 redundant today)."""
    return advise(_load(8), "2x8", 272, phase="decode", tokens_per_rank=32, redundant=(0, 8, 16),
                  levers=["redundant", "craft"], max_tokens=64)


def test_craft_rows_are_steady_states(crafted):
    """A craft row's step and KV capacity are steady_state's for its placement (empty slots
    free their expert weights for KV cache, `with_placement_memory`)."""
    from eplb.evaluation.serving import ClusterConfig, UnitConfig, steady_state
    from eplb.evaluation.serving.config import kv_capacity_tokens
    from eplb.evaluation.serving.config.budget import with_placement_memory
    from eplb.evaluation.serving.config.hardware import get_hardware
    from eplb.evaluation.serving.config.model import get_model

    cap = kv_capacity_tokens(get_model("deepseek_v3"), get_hardware("h800"), 17)
    cfg = ClusterConfig(prefill=UnitConfig(nodes=2, slots_per_layer=272, token_budget=1),
                        decode=UnitConfig(nodes=2, slots_per_layer=272, kv_capacity_tokens=cap,
                                          max_running_requests=32))
    t = crafted.table
    rows = [i for i in range(len(t)) if t.iloc[i]["lever"] == "craft"]
    options = [t.iloc[i]["option"] for i in rows]
    assert {"N=8", "N=16"} <= set(options)  # N=0 may not fit uniform's memory: then a note
    assert "N=0" in options or any(n.startswith("craft N=0 skipped") for n in
                                   crafted.meta["notes"])
    # a budget below today's 16 redundant slots per layer leaves slots empty
    assert (crafted.placements[rows[options.index("N=8")]].phy2log < 0).any()
    for i in rows:
        p, r = crafted.placements[i], t.iloc[i]
        kv = with_placement_memory(cfg, "decode", p).unit("decode").kv_capacity_tokens
        assert r["kv_tokens_per_gpu"] == kv
        n = int(r["requests_per_rank"])
        s = steady_state(cfg, "decode", placement=p, load=_load(8), kv_tokens=4096, batch=n)
        assert r["step_ms"] == pytest.approx(s["step_s"] * 1e3, rel=1e-9)
        keep = 600.0 / (600.0 + r["stall_s"])  # the copy from today's, amortised
        assert r["stall_s"] > 0
        assert r["tok_s_per_node"] == pytest.approx(s["tok_s_per_node"] * keep, rel=1e-9)


def test_craft_memory_matches_the_redundant_rows(crafted):
    """Each craft row keeps at most uniform N's routed experts per GPU, so it holds at least
    the KV cache of the redundant row at the same N (1 token of rounding: two floors)."""
    t, L, G = crafted.table, 58, 16
    for info in crafted.meta["craft"]:
        n = info["N"]
        assert info["total_slots"] == L * (E + n)
        assert info["expert_slots_per_gpu"] <= math.ceil(L * (E + n) / G)
        uni = t[(t.lever == "redundant") & (t.option == f"N={n}")]
        row = t[(t.lever == "craft") & (t.option == f"N={n}")]
        if len(uni):
            assert row["kv_tokens_per_gpu"].iloc[0] >= uni["kv_tokens_per_gpu"].iloc[0] - 1


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), shape=st.sampled_from([0.1, 0.5, 3.0]),
       budgets=st.lists(st.sampled_from([0, 4, 8, 16]), min_size=1, max_size=2, unique=True))
def test_craft_never_worse_than_uniform_on_its_objective(seed, shape, budgets):
    """On any load, each craft row's summed per-layer max GPU load (read from its placement)
    is at most uniform replication's at the same budget and at least the bound."""
    load = _load(seed, shape)
    a = advise(load, "2x8", 272, phase="decode", tokens_per_rank=8, redundant=tuple(budgets),
               levers=["craft"], max_tokens=16)
    crafts = [i for i in range(len(a.table)) if a.table.iloc[i]["lever"] == "craft"]
    infos = a.meta.get("craft", [])
    skipped = [n for n in a.meta["notes"] if n.startswith("craft N=") and "skipped" in n]
    assert len(crafts) == len(infos) and len(crafts) + len(skipped) == len(budgets)
    for i, info in zip(crafts, infos, strict=True):
        p = a.placements[i].validate()
        objective = float(p.gpu_load(load).max(1).sum())
        assert objective == pytest.approx(info["objective_sum"], rel=1e-9)
        assert objective <= info["uniform_objective_sum"] * (1 + 1e-12)
        assert info["bound_sum"] <= objective * (1 + 1e-12)


def test_craft_refuses_budgets_above_todays_slots(capsys, tmp_path):
    a = advise(_load(9), "2x8", 256, tokens_per_rank=8, redundant=(0, 16), levers=["craft"],
               max_tokens=16)
    assert list(a.table["option"]) == ["trivial", "N=0"]
    assert any(n.startswith("craft N=16 skipped") and "--slots 272" in n
               for n in a.meta["notes"])
    # at the CLI the skip is a note under the table, not an error
    dump = _dump(tmp_path)
    assert main(["advise", str(dump), "--topology", "2x8", "--slots", "256",
                 "--tokens-per-rank", "8", "--redundant", "0,16", "--max-tokens", "16"]) == 0
    assert "craft N=16 skipped" in capsys.readouterr().out


def test_cli_levers_picks_rows(tmp_path, capsys):
    dump = _dump(tmp_path)
    args = ["advise", str(dump), "--topology", "2x8", "--slots", "256", "--tokens-per-rank", "8",
            "--max-tokens", "16", "--json"]
    assert main([*args, "--levers", "rebalance,bound"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["lever"] for r in rows] == ["today", "rebalance", "bound"]
    for bad, needle in (("craft,magic", "magic"), (",", "--levers")):
        assert main([*args, "--levers", bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err


def test_dump_of_another_model_is_named_before_the_slots():
    """A Qwen1.5-MoE-shaped dump (24 layers x 60 experts) on its own deployment (60 slots) is
    refused for its shape (not the default model's; the message says how to name its own),
    not for the slots the DeepSeek preset would need."""
    with pytest.raises(InputError, match=r"24 layers x 60 experts.*own model with --model"):
        advise(np.ones((24, 60)), "1x6", 60, phase="prefill")


def test_several_dumps_are_stacked_as_windows(tmp_path, capsys):
    """`eplb advise A B` (and ``advise([A, B])``) is advise on `eplb trace stack A B`."""
    a = _dump(tmp_path, _load(5), "a.json")
    b = _dump(tmp_path, _load(6), "b.json")
    kw = dict(tokens_per_rank=16, levers=["rebalance"], max_tokens=32)
    got = advise([str(a), str(b)], "2x8", 256, **kw)
    ref = advise(_load(5) + _load(6), "2x8", 256, **kw)
    assert got.meta["windows"] == 2 and str(a) in got.meta["source"]
    assert got.table["step_ms"].tolist() == ref.table["step_ms"].tolist()
    args = ["--topology", "2x8", "--slots", "256", "--tokens-per-rank", "16", "--levers",
            "rebalance", "--max-tokens", "32", "--json"]
    assert main(["advise", str(a), str(b), *args]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["step_ms"] for r in rows] == pytest.approx(got.table["step_ms"].tolist())
    other = _dump(tmp_path, np.ones((10, 64)), "other.json")  # another model: one error line
    assert main(["advise", str(a), str(other), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("eplb: error:"), err


@pytest.mark.parametrize("topology, policy", [("4x8", "hierarchical"), ("9x8", "global")])
def test_groups_used_are_named_with_their_source(tmp_path, capsys, topology, policy):
    """advise passes the model preset's expert groups (deepseek_v3: 8) to the solver, so the
    deepseek rows are hierarchical where the groups divide the nodes and global otherwise: the
    heading and a note name the groups and their source, and the JSON meta carries them."""
    args = ["advise", str(_dump(tmp_path)), "--topology", topology, "--slots", "288",
            "--tokens-per-rank", "16", "--redundant", "0", "--levers", "rebalance",
            "--max-tokens", "32"]
    assert main(args) == 0
    out = capsys.readouterr().out
    head = out.splitlines()[0]
    assert "solver deepseek; 8 expert groups from the model preset" in head, head
    note = next(ln for ln in out.splitlines() if ln.startswith("expert groups: 8"))
    assert "model preset deepseek_v3" in note and f"the {policy} policy" in note, note
    assert main([*args, "--json"]) == 0
    groups = json.loads(capsys.readouterr().out)["meta"]["groups"]
    assert groups == {"num_groups": 8, "topk_groups": 4, "source": "model preset deepseek_v3",
                      "nodes": int(topology[0]), "solver_policy": policy}


def test_bound_row_says_it_is_perfect_balance_not_a_placement(small, tmp_path, capsys):
    """The bound row has balance 1 while balance_bound (any placement's lower bound) may be
    above 1, and craft's freed KV cache can beat its throughput: its note, the column help and
    the lever table say what the row is."""
    row = small.table.set_index("lever").loc["bound"]
    assert row["balance"] == 1.0 and row["balance_bound"] >= 1.0
    note = next(n for n in small.meta["notes"] if n.startswith("bound:"))
    for words in ("perfect balance", "today's slots and KV", "not reachable by any placement",
                  "ignores KV cache freed by craft"):
        assert words in note, note
    assert "not reachable by placement" in COLUMNS["balance_bound"][2]
    assert "ignores KV freed by craft" in COLUMNS["balance_bound"][2]
    args = ["advise", str(_dump(tmp_path)), "--topology", "2x8", "--slots", "256",
            "--tokens-per-rank", "16", "--redundant", "0", "--levers", "bound",
            "--max-tokens", "32"]
    assert main(args) == 0
    assert note in capsys.readouterr().out.splitlines()
    assert main([*args[:-4], "--levers", "rebalance", *args[-2:]]) == 0  # no bound row: no note
    assert not any(ln.startswith("bound:") for ln in capsys.readouterr().out.splitlines())



def _operating_line(text: str) -> str:
    """The header's operating-point line (after the line saying what the curves rest on)."""
    lines = text.splitlines()
    assert lines[2].startswith("operating point:"), lines[:3]
    return lines[2]

def test_kv_capped_operating_point_is_stated():
    """A decode batch the KV cache cannot hold runs capped, and says so: the header, a note
    and the meta name what was asked and what ran (issue 34: asked 256, ran 135)."""
    a = advise(_load(0), "2x8", 256, phase="decode", tokens_per_rank=100_000,
               kv_tokens=4096, redundant=(), levers=["today", "bound"], max_tokens=100_000)
    op = a.meta["operating_point"]
    ran = int(a.table.iloc[0]["requests_per_rank"])
    assert op["asked"] == 100_000 and op["ran"] == ran < 100_000
    assert op["kv_limited"] and op["unit"] == "requests"
    assert ran == op["kv_capacity_requests"] == op["kv_tokens_per_gpu"] // 4096
    text = a.to_text()
    head = _operating_line(text)
    assert f"asked 100,000, the KV cache holds {ran:,}" in head and "KV-limited" in head
    assert any(n.startswith(f"operating point: asked 100,000 requests per rank, ran {ran:,}")
               for n in a.meta["notes"])
    # within the cache nothing is capped and the header says so
    b = advise(_load(0), "2x8", 256, phase="decode", tokens_per_rank=4, redundant=(),
               levers=["today"], max_tokens=8)
    assert not b.meta["operating_point"]["kv_limited"]
    assert "not KV-limited" in _operating_line(b.to_text())
    assert not any(n.startswith("operating point") for n in b.meta["notes"])


def test_sglang_replica_routing(tmp_path):
    """``replicas="sglang"``: today's trivial layout serves expert e from slot e only (the
    redundant slots idle, so their GPUs get no routed picks) and a solved placement follows
    SGLang's static map: every row's dispatch is weighted by those shares."""
    from eplb.evaluation.serving.placements import sglang_first_slot, sglang_static

    load = _load(5, 0.3)
    a = advise(load, "2x8", 288, phase="decode", tokens_per_rank=16, redundant=(),
               levers=["today", "rebalance"], replicas="sglang", max_tokens=32)
    today, new = a.placements[0], a.placements[1]
    assert list(a.table["dispatch"]) == ["weighted", "weighted"]
    share = today.replica_share
    assert (share[:, :E] == 1).all() and (share[:, E:] == 0).all()
    assert (today.gpu_load(load)[:, -1] == 0).all()  # GPU 15 holds slots 270..287 only
    # SGLang's static map: a GPU holding a replica serves itself, the rest choose at random
    topo = new.topology
    for layer in (0, 31):
        row = new.phy2log[layer]
        for e in np.unique(row):
            reps = np.flatnonzero(row == e)
            assert new.replica_share[layer, reps].sum() == pytest.approx(1.0)
            if len(reps) > 1:  # each GPU holding a replica sends its own picks to it
                gpus = reps // topo.slots_per_gpu
                for g in np.unique(gpus):
                    own = new.replica_share[layer, reps[gpus == g]].sum()
                    assert own >= 1 / topo.num_gpus - 1e-12
    assert sglang_static(new, seed=0).replica_share.shape == new.phy2log.shape
    even = advise(load, "2x8", 288, phase="decode", tokens_per_rank=16, redundant=(),
                  levers=["today"], max_tokens=32)
    assert a.table.iloc[0]["balance"] > even.table.iloc[0]["balance"]
    with pytest.raises(InputError, match="replicas"):
        advise(load, "2x8", 288, replicas="round_robin")
    with pytest.raises(InputError, match="slot e"):
        sglang_first_slot(new)


def test_advise_takes_the_operating_point_a_simulation_measured(tmp_path):
    """``from_summary``: a simulation's output folder sets the decode batch and context advise
    scores (its measured running requests per rank and context), and the header names where
    they came from; the CLI refuses it beside --tokens-per-rank."""
    from eplb.evaluation import serving
    from eplb.evaluation.serving.operating_point import describe, from_run, measured
    from tests.test_serving_sim import small_config, small_workload

    cfg = small_config()
    run = serving.simulate(cfg, small_workload(n=40, rate=8.0), seed=0, progress=False)
    out = tmp_path / "run"
    out.mkdir()
    run.save(out, cfg, plots=False)
    ops = from_run(out / "summary.json")
    assert ops["decode"] == {**measured(run.steps, run.requests, cfg)["decode"],
                             "source": ops["decode"]["source"]}
    dec = ops["decode"]
    steps = run.steps[run.steps["phase"] == "decode"]
    w = steps["duration_s"]
    assert dec["per_rank"] == pytest.approx(
        float(np.average(steps["requests"] / cfg.decode.num_gpus, weights=w)))
    assert "running requests per rank" in describe(dec)
    a = advise(_load(0), "2x8", 256, phase="decode", redundant=(), levers=["today"],
               from_summary=out, max_tokens=64)
    op = a.meta["operating_point"]
    assert op["asked"] == max(1, round(dec["per_rank"]))
    assert op["context_tokens"] == round(dec["context_tokens"])
    assert str(out) in op["source"] and str(out) in _operating_line(a.to_text())
    with pytest.raises(InputError, match="not found"):
        from_run(tmp_path)
    dump = _dump(tmp_path)
    assert main(["advise", str(dump), "--topology", "2x8", "--slots", "256",
                 "--from-summary", str(out), "--tokens-per-rank", "8"]) == 2
