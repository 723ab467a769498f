"""Capacity search (serving.capacity): bracketing and bisection on the goodput target; twice
the units serve about twice the rate; the unit-mix search over a node budget."""

from __future__ import annotations

import sys

import pytest

from eplb.errors import InputError
from eplb.evaluation import serving
from eplb.evaluation.serving import workload as W
from eplb.evaluation.serving.capacity import _mixes, capacity
from eplb.evaluation.serving.config import EplbConfig, SLOConfig, UnitConfig

C = sys.modules["eplb.evaluation.serving.capacity"]  # the module (serving.capacity: the function)

BASE = serving.ClusterConfig.deepseek_day6()


def tiny(count: int = 1) -> serving.ClusterConfig:
    """One-node prefill and decode units (8 GPUs each), balanced routing: cheap to simulate."""
    return BASE.replace(
        prefill=UnitConfig(nodes=1, count=count, slots_per_layer=256, token_budget=2048,
                           balancer="round_robin"),
        decode=UnitConfig(nodes=1, count=count, slots_per_layer=256, max_running_requests=64,
                          kv_capacity_tokens=BASE.decode.kv_capacity_tokens,
                          balancer="round_robin"),
        eplb=EplbConfig(solver="balanced"),
        slo=SLOConfig(ttft_s=2.0, tpot_s=1.0),
        name="tiny",
    )


@pytest.fixture(scope="module")
def wl():
    return W.synthesize(600, rate=10.0, input_mean=2000, output_mean=16, input_sigma=0.2,
                        output_sigma=0.2, hit_rate=0.0, open_sessions=64, seed=1)


@pytest.fixture(scope="module")
def one(wl):
    return capacity(tiny(1), wl, rel_tol=0.1, progress=False)


def test_target_holds_at_the_rate_and_fails_above(one, wl):
    lo, hi = one["interval"]
    assert one["rate"] == lo < hi <= lo * 1.1 * (1 + 1e-12)
    assert one["goodput"] >= 0.9 > one["goodput_hi"]
    res = serving.simulate(tiny(1), serving.rescale(wl, rate=1.2 * one["rate"]), seed=0,
                           progress=False)
    assert res.summary()["goodput"] < 0.9
    runs = one["runs"]
    assert runs.loc[runs["rate"] == lo, "goodput"].iloc[0] >= 0.9


def test_twice_the_units_twice_the_capacity(one, wl):
    two = capacity(tiny(2), wl, rel_tol=0.1, progress=False)
    (lo1, hi1), (lo2, hi2) = one["interval"], two["interval"]
    # the ratio's interval [lo2 / hi1, hi2 / lo1] reaches 2 within 15%
    assert lo2 / hi1 <= 2 * 1.15 and hi2 / lo1 >= 2 / 1.15


def test_per_seed_interval(wl):
    res = capacity(tiny(1), wl.head(120), seeds=(0, 1), rel_tol=0.3, per_seed=True,
                   progress=False)
    c_lo, c_hi = res["ci"]
    assert len(res["seed_intervals"]) == 2
    assert c_lo <= min(s[0] for s in res["seed_intervals"])
    assert c_hi >= max(s[1] for s in res["seed_intervals"])


def test_slo_override_and_bad_input(wl):
    with pytest.raises(InputError, match="goodput"):
        capacity(tiny(), wl, goodput=1.5)
    with pytest.raises(InputError, match="slo takes"):
        capacity(tiny(), wl, slo={"ttft": 1.0})



def test_capacity_concludes_with_a_reason_on_an_unservable_workload(wl):
    """A TTFT SLO no prefill meets: the search stops once halving the rate no longer raises
    goodput (the misses do not come from load), within its stated bound, and says why in one
    line: the share that misses TTFT, their prompts, the option that would change it."""
    lines: list[str] = []
    res = capacity(tiny(), wl.head(20), slo={"ttft_s": 1e-4}, progress=False, log=lines.append)
    assert res["rate"] != res["rate"]  # NaN: no rate met the target
    runs = res["runs"]
    assert 2 <= len(runs) <= 1 + C.MAX_HALVINGS and len(lines) == len(runs)
    assert not runs["overloaded"].iloc[-1] and (runs["goodput"] == 0).all()
    # every progress line carries its rate's goodput
    for line, (rate, g) in zip(lines, zip(runs["rate"], runs["goodput"], strict=True),
                               strict=True):
        assert f"{rate:.4g} req/s -> goodput {g:.3f}" in line
    reason = res["reason"]
    assert "\n" not in reason and reason.startswith("no rate meets goodput 0.9")
    assert "100.0% of the requests miss TTFT <= 0.0001 s" in reason
    assert "prompts: median" in reason and "prefill_chunking=context_parallel" in reason
    assert "do not come from load" in reason


def test_unit_mixes_fill_the_budget():
    cfg = tiny()
    assert _mixes(cfg, 4) == [(1, 3), (2, 2), (3, 1)]
    big = cfg.replace(decode=UnitConfig(**{**cfg.decode.__dict__, "nodes": 2}))
    assert _mixes(big, 5) == [(1, 2), (3, 1)]
    with pytest.raises(InputError, match="cannot hold"):
        serving.capacity_mix(big, W.synthesize(5, rate=1.0, seed=0), nodes=2)
