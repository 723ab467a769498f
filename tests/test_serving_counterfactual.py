"""Counterfactual pairs (serving.compare mode="counterfactual"): one step sequence replayed
under each placement policy; the balanced reference is a lower bound; paired intervals."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eplb import solvers
from eplb.errors import InputError
from eplb.evaluation import serving
from eplb.evaluation.serving import counterfactual as C
from eplb.evaluation.serving.config import EplbConfig, UnitConfig
from eplb.evaluation.serving.intervals import ci_table, mean_ci
from eplb.evaluation.serving.steptime import RankBatch, StepModel
from eplb.io import write_placement
from eplb.placement import Placement
from eplb.tolerance import REL_TOL
from tests.test_serving_sim import small_config, small_workload

POLICIES = {
    "trivial": EplbConfig(solver="static", initial="trivial"),
    "deepseek": EplbConfig(solver="deepseek", rebalance_interval_s=4, history_s=4),
    "balanced": EplbConfig(solver="balanced"),
}


@pytest.fixture(scope="module")
def frame():
    cfgs = {name: small_config(eplb=e, name=name) for name, e in POLICIES.items()}
    wl = small_workload(n=50, rate=6.0)
    return serving.compare(cfgs, wl, seeds=[0], mode="counterfactual", progress=False), cfgs, wl


def _by_step(steps: pd.DataFrame, col: str) -> pd.DataFrame:
    return steps.pivot_table(index=["seed", "phase", "unit", "step"], columns="config",
                             values=col)


def test_same_steps_same_dp_wait(frame):
    f, _, _ = frame
    steps = f.attrs["steps"]
    assert set(steps["config"]) == set(POLICIES)
    for col in ("dp_wait_s", "tokens", "start_s"):
        p = _by_step(steps, col)
        assert p.notna().all().all()
        assert (p.sub(p["trivial"], axis=0) == 0).all().all(), col
    # the placements did differ: deepseek rebalanced and its step times moved
    assert f.set_index("config").loc["deepseek", "rebalances"] > 0
    assert (_by_step(steps, "step_s").nunique(axis=1) > 1).any()


def test_balanced_never_slower(frame):
    f, _, _ = frame
    p = _by_step(f.attrs["steps"], "step_s")
    for other in ("trivial", "deepseek"):
        assert (p["balanced"] <= p[other] * (1 + REL_TOL)).all()
    assert (p["balanced"] < p["trivial"]).mean() > 0.5


def test_replay_of_the_driver_is_the_closed_loop_run(frame):
    f, cfgs, wl = frame
    res = serving.simulate(cfgs["trivial"], wl, seed=0, progress=False)
    closed = res.steps.sort_values(["phase", "unit", "step"])
    steps = f.attrs["steps"]
    mine = steps[steps["config"] == "trivial"].sort_values(["phase", "unit", "step"])
    np.testing.assert_allclose(mine["step_s"].to_numpy(), closed["duration_s"].to_numpy())
    # the breakdown sums to the step, and deltas are against the same step of the baseline
    parts = mine[[f"{k}_s" for k in serving.steptime.BREAKDOWN]].sum(axis=1)
    np.testing.assert_allclose(parts, mine["step_s"], rtol=1e-9)
    assert (mine["d_step_s"] == 0).all()


def test_replay_starts_from_the_initial_placement_file(tmp_path):
    """``eplb.initial = FILE``: the replay starts from the file as the closed loop does, so
    replaying the driver is the closed-loop run (it solved on the history instead)."""
    cfg = small_config()
    m = cfg.model_spec
    load = np.random.default_rng(5).gamma(0.5, size=(m.moe_layers, m.num_experts)) + 0.01
    path = tmp_path / "p.json"
    write_placement(solvers.solve("greedy", load, cfg.topology("decode"), num_groups=8), path)
    cfg = cfg.replace(eplb=EplbConfig(solver="static", initial=str(path)), name="file")
    wl = small_workload(n=50, rate=6.0)
    f = serving.compare({"file": cfg}, wl, seeds=[0], mode="counterfactual", progress=False)
    closed = serving.simulate(cfg, wl, seed=0, progress=False).steps
    key = ["phase", "unit", "step"]
    steps = f.attrs["steps"]
    mine = steps[steps["config"] == "file"].sort_values(key)
    np.testing.assert_allclose(mine["step_s"].to_numpy(),
                               closed.sort_values(key)["duration_s"].to_numpy())


def test_paired_deltas_and_intervals(frame):
    f, _, _ = frame
    r = f.set_index("config")
    assert r.loc["balanced", "d_decode_step_s"] == pytest.approx(
        r.loc["balanced", "decode_step_s"] - r.loc["trivial", "decode_step_s"])
    assert r.loc["balanced", "d_decode_step_s"] < 0
    m, lo, hi = mean_ci([1.0, 2.0, 3.0])
    assert (m, round(lo, 4), round(hi, 4)) == (2.0, round(2 - 4.302653 / 3 ** 0.5, 4),
                                               round(2 + 4.302653 / 3 ** 0.5, 4))
    two = pd.DataFrame({"config": ["a", "b", "a", "b"], "seed": [0, 0, 1, 1],
                        "x": [1.0, 1.5, 2.0, 2.5]})
    t = ci_table(two, ["x"])
    assert t.loc["b", ("x", "d_mean")] == 0.5 and t.loc["b", ("x", "d_lo")] == 0.5


def test_counterfactual_rejects_what_it_cannot_replay():
    wl = small_workload(n=10, rate=6.0)
    a = small_config()
    b = a.replace(decode=UnitConfig(**{**a.decode.__dict__, "count": 2}))
    with pytest.raises(InputError, match="differ in decode"):
        serving.compare({"a": a, "b": b}, wl, mode="counterfactual", progress=False)
    with pytest.raises(InputError, match="mode must be"):
        serving.compare([a], wl, mode="what")
    with pytest.raises(InputError, match="driver"):
        serving.compare({"a": a}, wl, mode="counterfactual", driver="zz", progress=False)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), tokens=st.integers(1, 400), phase=st.sampled_from(
    ["decode", "prefill"]), skew=st.floats(0.0, 3.0))
def test_balanced_step_is_a_lower_bound(seed, tokens, phase, skew):
    """On any counts and any placement (random replicas), `balanced_step` is never slower."""
    cfg = small_config()
    topo = cfg.topology(phase)
    sm = StepModel(phase, topo, model=cfg.model_spec, hardware=cfg.hardware_spec,
                   micro_batches=cfg.unit(phase).micro_batches)
    rng = np.random.default_rng(seed)
    m = cfg.model_spec
    L, E, G, P = m.moe_layers, m.num_experts, topo.num_gpus, topo.num_slots
    pop = rng.dirichlet(np.full(E, 1.0 / (1 + skew)), size=L)
    per = rng.integers(1, tokens + 1, size=G).astype(float)
    counts = rng.poisson(pop * m.top_k * per.sum()).astype(float)
    phy = np.concatenate([np.tile(np.arange(E), (L, 1)),
                          rng.integers(0, E, size=(L, P - E))], axis=1)
    phy = np.take_along_axis(phy, rng.permuted(np.tile(np.arange(P), (L, 1)), axis=1), 1)
    placement = Placement(phy, E, topo).validate()
    if phase == "decode":
        batch = RankBatch.trusted(per, per * 2000.0, per * 2000.0, per.copy())
    else:
        batch = RankBatch.prefill(per, np.zeros(G), np.arange(G), num_ranks=G)
    routed = sm.prepare(placement, pop)
    real = sm.time_routed(batch, routed, counts, check=False, tabulated=True, picks=True)
    ideal = C.balanced_step(sm, batch, counts)
    assert ideal.total_s <= real.total_s * (1 + REL_TOL)


def test_retime_follows_the_units_schedule():
    """Back-to-back steps stay back to back with their new durations; a step the driver's unit
    waited for (an idle gap before it) starts no earlier than it did, and no earlier than the
    step before ends."""
    drv = pd.DataFrame({"start_s": [0.0, 1.0, 2.0, 5.0], "duration_s": [1.0, 1.0, 1.0, 1.0]})
    start, end = C.retime(drv, np.array([0.5, 0.5, 0.5, 0.5]))
    np.testing.assert_allclose(start, [0.0, 0.5, 1.0, 5.0])  # idle before step 3: keeps 5 s
    np.testing.assert_allclose(end, [0.5, 1.0, 1.5, 5.5])
    start, end = C.retime(drv, np.array([2.0, 2.0, 2.0, 2.0]))
    np.testing.assert_allclose(start, [0.0, 2.0, 4.0, 6.0])  # late: the gap is used up
    start, end = C.retime(drv, drv["duration_s"].to_numpy())
    np.testing.assert_allclose(start, drv["start_s"])  # the driver's own durations: itself


def test_user_metrics_and_operating_point(frame):
    """The counterfactual reports what a user sees (TTFT, TPOT, tok/s re-timed with each
    config's steps, with paired deltas) and where the driver ran: the driver's own row is its
    closed-loop run; every config shares the operating point (the batches are the driver's);
    the balanced reference is never slower to a first token or per output token."""
    f, cfgs, wl = frame
    for col in (*C.REQUEST_METRICS, *C.OPERATING):
        assert col in f and f"d_{col}" in f
    by = f.set_index("config")
    run = serving.simulate(cfgs["trivial"], wl, seed=0, progress=False)
    req = run.requests
    assert by.loc["trivial", "ttft_p50_s"] == pytest.approx(
        float(np.percentile(req["ttft_s"].dropna(), 50)), rel=1e-9)
    assert by.loc["trivial", "tpot_p90_s"] == pytest.approx(
        float(np.percentile(req["tpot_s"].dropna(), 90)), rel=1e-9)
    s = run.summary()
    assert by.loc["trivial", "output_tok_s_per_node"] == pytest.approx(
        s["output_tok_s_per_node"], rel=1e-9)
    for col in C.OPERATING:
        assert by[col].nunique() == 1
    assert by.loc["balanced", "ttft_p50_s"] <= by.loc["trivial", "ttft_p50_s"] * (1 + 1e-9)
    assert by.loc["balanced", "tpot_p50_s"] <= by.loc["trivial", "tpot_p50_s"] * (1 + 1e-9)
    ops = f.attrs["operating_point"][0]
    assert ops["decode"]["per_rank"] == pytest.approx(by.loc["trivial",
                                                             "decode_requests_per_rank"])
    assert ops["decode"]["bound"] in ("kv cache", "max_running_requests", "arrivals")
