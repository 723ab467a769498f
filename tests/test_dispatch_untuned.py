"""Issue 21's options on units the project did not tune to (prefill 3 x 4 GPUs, 264 slots;
decode 5 x 4, 260 slots), through the API and the CLI: ``lp``, Waterfill and duplication run
there; LPLB's replica graph (``eplb.solver = "lplb"``), which these units cannot hold, is
refused before any run with one error naming the phase, the unit and the fix."""

from __future__ import annotations

import pytest

from eplb.errors import EplbError, InputError
from eplb.evaluation import serving
from eplb.evaluation.serving.advise import advise
from eplb.evaluation.serving.config import EplbConfig, UnitConfig
from tests._cli import run_cli
from tests.conftest import shared_file

DUMP = ("deepseek-v3-sglang", "decode_in1000out1000.json")  # under the shared traces
UNITS = ("--set", "prefill.nodes=3", "--set", "prefill.gpus_per_node=4",
         "--set", "prefill.slots_per_layer=264", "--set", "decode.nodes=5",
         "--set", "decode.gpus_per_node=4", "--set", "decode.slots_per_layer=260")


def _untuned(**kw) -> serving.ClusterConfig:
    base = serving.ClusterConfig.deepseek_day6()
    return base.replace(
        prefill=UnitConfig(nodes=3, gpus_per_node=4, slots_per_layer=264,
                           balancer="deepseek_prefill"),
        decode=UnitConfig(nodes=5, gpus_per_node=4, slots_per_layer=260,
                          max_running_requests=32, balancer="deepseek_decode"),
        **kw,
    )


def _cli(*args) -> tuple[int, list[str]]:
    code, _, err = run_cli(*args)
    return code, err.strip().splitlines()


def test_lp_waterfill_and_duplication_run_on_untuned_units():
    wl = serving.workload.synthesize(12, rate=4.0, input_mean=400.0, output_mean=8.0, seed=0)
    for kw in ({"dispatch": "lp", "shared_expert": "waterfill"}, {"dispatch": "duplicate"}):
        res = serving.simulate(_untuned(**kw), wl, seed=0, duration_s=4.0, progress=False)
        assert set(res.steps["phase"]) == {"prefill", "decode"}, kw


def test_lplb_that_does_not_fit_is_refused_before_any_run():
    with pytest.raises(InputError, match=r"prefill: eplb.solver 'lplb' does not fit the 3 x 4 "
                       r"GPU unit with 264 slots: graph='hypercube' .*use 'torus'"):
        _untuned(eplb=EplbConfig(solver="lplb"))
    with pytest.raises(InputError, match="experts divisible by GPUs: 256 experts on 12 GPUs"):
        _untuned(eplb=EplbConfig(solver="lplb", options={"graph": "torus"}))
    with pytest.raises(InputError, match="eplb.options.graph 'ring' is unknown"):
        _untuned(eplb=EplbConfig(solver="lplb", options={"graph": "ring"}))
    # where the graph fits both units it is accepted: 8 GPUs x (32 + 3) slots, 16 x (16 + 4)
    base = serving.ClusterConfig.deepseek_day6()
    ok = base.replace(prefill=UnitConfig(nodes=1, gpus_per_node=8, slots_per_layer=280),
                      decode=UnitConfig(nodes=2, gpus_per_node=8, slots_per_layer=320),
                      eplb=EplbConfig(solver="lplb"), dispatch="lp")
    assert ok.eplb.solver == "lplb"


@pytest.mark.parametrize("solver", ["static", "oracle"])
def test_lplb_as_base_solver_that_does_not_fit_is_refused_before_any_run(solver):
    with pytest.raises(InputError, match=r"prefill: eplb.base_solver 'lplb' does not fit the 3 x "
                       r"4 GPU unit with 264 slots: graph='hypercube' .*set another "
                       r"eplb.base_solver"):
        _untuned(eplb=EplbConfig(solver=solver, initial="history", base_solver="lplb"))
    # where the hypercube fits both units it is accepted; where nothing places with the base
    # solver (a rebalancing solver, or balanced routing) it is not checked
    base = serving.ClusterConfig.deepseek_day6()
    ok = base.replace(prefill=UnitConfig(nodes=1, gpus_per_node=8, slots_per_layer=280,
                                         balancer="deepseek_prefill"),
                      decode=UnitConfig(nodes=2, gpus_per_node=8, slots_per_layer=320,
                                        max_running_requests=32, balancer="deepseek_decode"),
                      eplb=EplbConfig(solver=solver, initial="history", base_solver="lplb"))
    wl = serving.workload.synthesize(12, rate=4.0, input_mean=400.0, output_mean=8.0, seed=0)
    res = serving.simulate(ok, wl, seed=0, duration_s=4.0, progress=False)
    assert set(res.steps["phase"]) == {"prefill", "decode"}
    for other in ("deepseek", "balanced"):
        assert _untuned(eplb=EplbConfig(solver=other, base_solver="lplb")).eplb.solver == other


def test_cli_refuses_lplb_base_solver_from_a_toml(tmp_path):
    cfg = tmp_path / "cluster.toml"
    _untuned().write_toml(cfg)
    text = cfg.read_text()
    for line, to in (('[eplb]\nsolver = "deepseek"', '[eplb]\nsolver = "static"'),
                     ('base_solver = "deepseek"', 'base_solver = "lplb"')):
        assert text.count(line) == 1, line
        text = text.replace(line, to)
    cfg.write_text(text)
    out = tmp_path / "run"
    code, err = _cli("simulate", cfg, "--workload", "synth:n=10,rate=3", "--duration", "2",
                     "--no-progress", "--no-plots", "-o", out)
    assert code == 2 and len(err) == 1 and err[0].startswith("eplb: error:"), err
    assert "prefill: eplb.base_solver 'lplb' does not fit" in err[0] and not out.exists()


@pytest.mark.parametrize(("extra", "needle"), [
    (("--set", 'eplb.solver="lplb"'), "prefill: eplb.solver 'lplb' does not fit"),
    (("--set", 'dispatch="duplicate"', "--set", "duplicate.hbm_gb=0.001"),
     "prefill: duplicate.hbm_gb"),
    (("--set", 'dispatch="lp"', "--set", "lp_overhead_s=-1"), "lp_overhead_s"),
])
def test_cli_refusals_are_one_line(tmp_path, extra, needle):
    out = tmp_path / "run"
    code, err = _cli("simulate", "deepseek_day6", *UNITS, *extra, "--workload",
                     "synth:n=10,rate=3", "--duration", "2", "--no-progress", "--no-plots",
                     "-o", out)
    assert code == 2 and len(err) == 1 and err[0].startswith("eplb: error:"), err
    assert needle in err[0] and not out.exists()


def test_advise_names_the_solver_that_does_not_fit(shared_traces):
    dump = str(shared_file(shared_traces, *DUMP))
    with pytest.raises(EplbError, match="solver 'lplb' on 5x4 GPUs with 260 slots"):
        advise(dump, "5x4", 260, phase="decode", tokens_per_rank=16, solver="lplb",
               redundant=(), max_tokens=32)
    code, err = _cli("advise", dump, "--topology", "5x4", "--slots", "260", "--phase", "decode",
                     "--tokens-per-rank", "16", "--solver", "lplb", "--redundant", "0",
                     "--max-tokens", "32")
    assert code == 2 and len(err) == 1 and err[0].startswith("eplb: error:"), err
    assert "solver 'lplb'" in err[0] and "power-of-two" in err[0]
