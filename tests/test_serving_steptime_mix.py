"""`steady_state(mix=...)`: a workload's length mix and the DP imbalance it causes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from eplb.errors import InputError
from eplb.evaluation.serving import ClusterConfig, steady_state
from eplb.evaluation.serving.results.mix import LengthMix, prefill_batches
from eplb.evaluation.serving.workload import Workload


def workload(inputs, outputs) -> Workload:
    n = len(inputs)
    return Workload(
        pd.DataFrame(
            {
                "arrival_s": np.arange(n, dtype=float),
                "input_tokens": inputs,
                "output_tokens": outputs,
            }
        )
    )


CFG = ClusterConfig.deepseek_day6()


def test_one_length_mix_is_the_fixed_length_answer():
    w = workload([4096] * 8, [100] * 8)
    fixed = steady_state(CFG, "prefill", input_tokens=4096)
    mixed = steady_state(CFG, "prefill", mix=w, steps=4)
    assert mixed["step_s"] == pytest.approx(fixed["step_s"], rel=1e-9)
    assert mixed["dp_imbalance"] == pytest.approx(1.0, rel=1e-9)
    assert mixed["requests_per_s"] == pytest.approx(
        fixed["tok_s_per_node"] * CFG.prefill.nodes / 4096, rel=1e-9
    )


def test_long_tail_costs_dp_wait_and_is_seeded():
    rng = np.random.default_rng(0)
    inputs = np.minimum(rng.lognormal(np.log(4096), 1.5, 400).astype(int) + 1, 200_000)
    w = workload(inputs, [200] * inputs.size)
    a = steady_state(CFG, "prefill", mix=w, steps=6, seed=1)
    b = steady_state(CFG, "prefill", mix=w, steps=6, seed=1)
    assert a == b
    assert a["dp_imbalance"] > 1.2
    assert a["breakdown"]["dp_wait"] > 0.1 * a["step_s"]
    assert sum(a["breakdown"].values()) == pytest.approx(a["step_s"], rel=1e-9)
    # token-only chunks: no rank above its budget; the queues are refilled as the simulator
    # admits prompts (tokens left within the budget), so ranks are not all full
    lengths = LengthMix.of(w, 0)
    tokens = np.array([rb.tokens for rb in prefill_batches(lengths, 4, 16384, 3, warmup=2,
                                                           seed=0)])
    assert np.all(tokens <= 16384) and tokens.mean() > 0.5 * 16384


def test_decode_mix_is_capped_by_kv_and_reports_requests():
    w = workload([8000, 500, 30000, 2000], [400, 50, 1000, 10])
    out = steady_state(CFG, "decode", mix=w, steps=4)
    assert out["batch"] <= CFG.decode.max_running_requests
    assert out["kv_usage"] <= 1.05
    assert out["dp_imbalance"] >= 1.0
    accepted = 1 + CFG.decode.mtp_draft_tokens * CFG.decode.mtp_acceptance
    assert out["requests_per_s"] == pytest.approx(
        CFG.decode.num_gpus * out["batch"] * accepted / out["step_s"] / np.mean([400, 50, 1000, 10])
    )


def test_bad_mix_is_one_clear_error():
    with pytest.raises(InputError, match="mix must be a Workload"):
        steady_state(CFG, "prefill", mix=[1, 2, 3])
    with pytest.raises(InputError, match="steps"):
        steady_state(CFG, "prefill", mix=workload([10], [1]), steps=0)


def test_prefill_queue_at_a_trickle_is_each_prompts_own_step():
    from eplb.evaluation.serving import RankBatch, StepModel
    from eplb.evaluation.serving.results.mix import prefill_ttft

    lengths = LengthMix.of(workload([300, 5000, 12000], [10, 10, 10]), 0)
    sm = StepModel("prefill", CFG.topology("prefill"))
    ttft = prefill_ttft(lengths, lambda b: sm.time(b).total_s, 32, 16384, 1e-4, 6, seed=3)
    rng = np.random.default_rng(3)
    pick = rng.integers(3, size=6)
    for t, i in zip(ttft, pick, strict=True):
        alone = RankBatch.prefill([lengths.new_tokens[i]], rank=[0], num_ranks=32)
        assert t == pytest.approx(sm.time(alone).total_s, rel=1e-9)
    # a heavier load only waits longer (same draws, arrivals closer together)
    busy = prefill_ttft(lengths, lambda b: sm.time(b).total_s, 32, 16384, 50.0, 60, seed=3)
    assert np.all(np.isfinite(busy)) and busy.mean() > ttft.mean()


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"duration_s": 0.0}, "duration_s"),
        ({"duration_s": float("nan")}, "duration_s"),
        ({"warmup_s": -1.0}, "warmup_s"),
        ({"prompts": 0}, "prompts"),
        ({"warmup_prompts": -5}, "warmup_prompts"),
        ({"warmup_prompts": 2.5}, "warmup_prompts"),
        ({"duration_s": 1e6}, "duration_s"),
        ({"prompts": 10**7}, "prompts"),
    ],
)
def test_slo_rate_horizon_is_checked(kw, field):
    from eplb.evaluation.serving.results.steady import slo_rate

    with pytest.raises(InputError, match=field):
        slo_rate(CFG, workload([4096] * 4, [10] * 4), **kw)
