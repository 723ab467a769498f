"""Issue 37 part 1: a placement and a policy per phase. ``[prefill.eplb]`` / ``[decode.eplb]``
(`UnitConfig.eplb`) override ``[eplb]`` field by field; the Day-6 preset starts from two files
written by ``eplb solve``, one per phase (prefill EP32: 4x8 GPUs x 9 slots; decode EP144: 18x8
x 2), and the first step of each phase runs its own file exactly."""

from __future__ import annotations

import numpy as np
import pytest

from eplb.errors import InputError
from eplb.evaluation.serving import ClusterConfig, workload
from eplb.evaluation.serving.config import EplbConfig, overrides
from eplb.evaluation.serving.placements import fit_placement
from eplb.evaluation.serving.simulator.loop import Simulation
from tests._cli import run_cli
from tests.conftest import BUNDLED

TRACE = BUNDLED / "deepseek-v3-calibrated.npz"


@pytest.fixture(scope="module")
def phase_files(tmp_path_factory):
    """``eplb solve`` on the calibrated DeepSeek-V3 trace, once per phase's unit."""
    d = tmp_path_factory.mktemp("phases")
    pre, dec = d / "prefill.json", d / "decode_location.json"
    for out, topo, extra in ((pre, "4x8", ("--groups", 8)),
                             (dec, "18x8", ("--solver", "greedy", "--format", "sglang"))):
        code, _, err = run_cli("solve", TRACE, "--topology", topo, "--slots", 288, *extra,
                               "-o", out)
        assert code == 0, err
    return pre, dec


def test_phase_tables_override_field_by_field():
    base = ClusterConfig.deepseek_day6()
    c = overrides.apply(base, ["eplb.options={tolerance=0.01}", "eplb.solver=greedy",
                               "decode.eplb.solver=deepseek", "prefill.eplb.min_gain=0.05",
                               "prefill.eplb.migration=stall"])
    pre, dec = c.eplb_for("prefill"), c.eplb_for("decode")
    assert (pre.solver, pre.min_gain, pre.migration) == ("greedy", 0.05, "stall")
    assert pre.options == {"tolerance": 0.01}  # kept: the phase keeps [eplb]'s solver
    assert (dec.solver, dec.min_gain, dec.migration) == ("deepseek", 0.0, "overlap")
    assert dec.options == {}  # another solver: [eplb]'s options are not its
    assert dec.rebalance_interval_s == pre.rebalance_interval_s == base.eplb.rebalance_interval_s
    assert c.eplb == EplbConfig(**{**base.eplb.to_dict(), "solver": "greedy",
                                   "options": {"tolerance": 0.01}})


def test_phase_table_errors_name_the_table():
    base = ClusterConfig.deepseek_day6()
    with pytest.raises(InputError, match=r"decode\.eplb\.min_gain"):
        overrides.apply(base, ["decode.eplb.min_gain=2"])
    with pytest.raises(InputError, match=r"unknown key prefill\.eplb\.slover"):
        overrides.apply(base, ["prefill.eplb.slover=greedy"])
    with pytest.raises(InputError, match=r"decode: decode\.eplb\.solver 'lplb' does not fit"):
        overrides.apply(base, ["decode.eplb.solver=lplb"])  # 144 GPUs: no hypercube
    ok = overrides.apply(base, ["prefill.slots_per_layer=384", "prefill.eplb.solver=lplb",
                                "prefill.eplb.options={graph='torus'}"])
    assert ok.eplb_for("prefill").options == {"graph": "torus"}
    assert ok.eplb_for("decode").solver == "deepseek"  # lplb only where its graph fits


def test_print_config_shows_phase_tables(phase_files):
    pre, _ = phase_files
    code, text, err = run_cli("simulate", "--print-config", "deepseek_day6", "--set",
                              f"prefill.eplb.initial={pre}", "--set", "decode.eplb.solver=greedy")
    assert code == 0, err
    assert f'[prefill.eplb]\ninitial = "{pre}"' in text
    assert '[decode.eplb]\nsolver = "greedy"' in text
    code, plain, _ = run_cli("simulate", "--print-config", "deepseek_day6")
    assert "[prefill.eplb]" not in plain  # none set: both phases take [eplb]


def _first_steps(config, duration_s=3.0):
    """Each unit's placement at its first step (the step-time calls recorded), and the
    result."""
    w = workload.synthesize(40, rate=20.0, input_mean=1024.0, output_mean=32.0, seed=3)
    sim = Simulation(config, w, 0, duration_s, False, 10.0)
    first = {}
    for units in sim.units.values():
        for unit in units:
            def spy(batch, t, tokens, unit=unit, inner=unit.step_time):
                first.setdefault((unit.phase, unit.index), unit.placement)
                return inner(batch, t, tokens)
            unit.step_time = spy
    return first, sim.run()


def test_day6_starts_each_phase_from_its_own_file(phase_files):
    pre, dec = phase_files
    config = overrides.apply(ClusterConfig.deepseek_day6(), [
        "eplb.solver=static", f"prefill.eplb.initial={pre}", f"decode.eplb.initial={dec}"])
    first, result = _first_steps(config)
    model = config.model_spec
    for (phase, _), placement in first.items():
        want = fit_placement(pre if phase == "prefill" else dec, model, config.topology(phase),
                             what="expected")
        assert placement.topology.num_gpus == (32 if phase == "prefill" else 144)
        assert placement.topology.slots_per_gpu == (9 if phase == "prefill" else 2)
        assert np.array_equal(placement.phy2log, want.phy2log), phase
    assert {ph for ph, _ in first} == {"prefill", "decode"}
    assert result.meta["eplb"]["prefill"]["initial"] == str(pre)
    assert result.meta["eplb"]["decode"]["initial"] == str(dec)


def test_one_file_for_both_phases_is_refused_naming_the_phase_table(phase_files):
    pre, _ = phase_files
    config = overrides.apply(ClusterConfig.deepseek_day6(),
                             ["eplb.solver=static", f"eplb.initial={pre}"])
    with pytest.raises(InputError, match=r"decode: eplb\.initial.*\[decode\.eplb\] initial"):
        _first_steps(config)


def test_rebalance_rows_name_the_phase_and_its_solver():
    config = overrides.apply(ClusterConfig.deepseek_day6(), [
        "eplb.rebalance_interval_s=1", "eplb.history_s=1", "eplb.min_gain=-1",
        "decode.eplb.solver=greedy", "prefill.eplb.solver=static"])
    _, result = _first_steps(config, duration_s=2.5)
    rb = result.rebalances
    assert len(rb) and set(rb["phase"]) == {"decode"}  # static prefill never rebalances
    assert set(rb["solver"]) == {"greedy"}
    assert result.meta["eplb"]["prefill"]["solver"] == "static"


def test_few_tokens_per_gpu_gets_a_word():
    """Issue 37 part 4: a decode max/mean GPU load of 2-2.9 at under one running request per
    GPU is printed with why (few tokens per GPU), not alone."""
    from eplb.evaluation.serving.results.notes import few_tokens_note

    cfg = ClusterConfig.deepseek_day6().to_dict()
    note = few_tokens_note({"decode_gpu_load_max_over_mean": 2.4,
                            "decode_running_per_gpu": 0.5}, cfg)
    assert "few tokens per GPU" in note and "about 8.0 expert picks" in note  # 0.5 x 2 x 8
    assert few_tokens_note({"decode_gpu_load_max_over_mean": 2.4,
                            "decode_running_per_gpu": 3.0}, cfg) is None
    assert few_tokens_note({"decode_gpu_load_max_over_mean": 1.1,
                            "decode_running_per_gpu": 0.5}, cfg) is None
    _, result = _first_steps(ClusterConfig.deepseek_day6())
    s = result.summary()
    assert s["decode_running_per_gpu"] < 1 and s["decode_gpu_load_max_over_mean"] >= 1.5
    assert "few tokens per GPU" in result.summary_table()


def test_counterfactual_variants_may_differ_in_a_phase_policy():
    from eplb.evaluation.serving.counterfactual import check_shared

    base = ClusterConfig.deepseek_day6()
    variant = overrides.apply(base, ["decode.eplb.solver=greedy"])
    check_shared({"base": base, "decode greedy": variant})  # the step sequence is shared
    with pytest.raises(InputError, match="differ in decode"):
        check_shared({"base": base, "other": overrides.apply(base, ["decode.count=2"])})
