"""Prefill admission (``scheduler.prefill_admission``): the default ``rank_queues`` (SGLang's PD
prefill server: each arrival dispatched at once to one DP rank's unbounded FCFS queue, one
partly prefilled prompt per rank, its chunk first) against a schedule worked out by hand, the
kept ``global_queue`` rule against its own, and what a saturated unit's steps hold."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from eplb.errors import InputError
from eplb.evaluation import serving
from eplb.evaluation.serving.config import EplbConfig, KVConfig, SchedulerConfig, UnitConfig
from eplb.evaluation.serving.config.overrides import apply
from eplb.evaluation.serving.config.schema import admission_text
from eplb.evaluation.serving.results.mix import LengthMix, prefill_batches
from eplb.evaluation.serving.simulator.loop import Simulation
from eplb.evaluation.serving.simulator.prefill import PrefillUnit

A, B, C, D, E = 10, 10, 40, 4, 4  # prompt tokens of the five requests, in arrival order


def _two_ranks(admission: str, **sched) -> serving.ClusterConfig:
    """One prefill unit of 2 ranks with a 16-token step budget, round-robin DP balancer,
    token-only chunks, perfectly balanced experts, no prefix cache."""
    base = serving.ClusterConfig.deepseek_day6()
    return base.replace(
        name="two_ranks",
        prefill=UnitConfig(nodes=1, gpus_per_node=2, slots_per_layer=256, token_budget=16,
                           balancer="round_robin"),
        decode=UnitConfig(nodes=1, gpus_per_node=2, slots_per_layer=256,
                          max_running_requests=8, balancer="round_robin"),
        eplb=EplbConfig(solver="balanced"),
        kv=KVConfig(store_capacity_blocks=0),
        scheduler=SchedulerConfig(prefill_chunking="tokens", prefill_admission=admission,
                                  **sched),
    )


def _five_at_zero() -> serving.workload.Workload:
    """A=10, B=10, C=40, D=4, E=4 prompt tokens, all arriving at t=0, one output token each
    (no decode: the first token is made by the prefill)."""
    frame = pd.DataFrame({
        "request_id": np.arange(5),
        "arrival_s": np.zeros(5),
        "input_tokens": [A, B, C, D, E],
        "output_tokens": np.ones(5, dtype=np.int64),
    })
    return serving.workload.Workload(frame)


def _steps(admission: str, **sched):
    """Run the five requests; ``(per-step tokens per rank, requests frame)``."""
    sim = Simulation(_two_ranks(admission, **sched), _five_at_zero(), 0, None, False, 10.0)
    seen = []
    orig = PrefillUnit.start

    def start(self, t):
        ev = orig(self, t)
        if self.busy:
            seen.append(np.bincount([c[0] for c in self.inflight],
                                    weights=[c[3] for c in self.inflight],
                                    minlength=self.G).tolist())
        return ev

    PrefillUnit.start = start
    try:
        res = sim.run()
    finally:
        PrefillUnit.start = orig
    return seen, res.requests


def test_rank_queues_follows_the_hand_worked_schedule():
    """Round robin at arrival: A, C, E -> rank 0 and B, D -> rank 1, nothing waits in front
    of the ranks (routed at arrival). Step 1: rank 0 A10 + C6 (C truncated to the budget left),
    rank 1 B10 + D4. Steps 2, 3: rank 0 C16 each (C is its one partly prefilled prompt, its
    chunk first), rank 1 idle. Step 4: rank 0 C's last 2 tokens, then E4."""
    steps, req = _steps("rank_queues")
    assert steps == [[16, 14], [16, 0], [16, 0], [6, 0]]
    assert req["routed_s"].tolist() == [0.0] * 5
    assert req["prefill_rank"].tolist() == [0, 1, 0, 1, 0]
    end = req["prefill_end_s"].to_numpy()
    assert end[0] == end[1] == end[3] < end[2] == end[4]  # A, B, D in step 1; C, E in step 4
    assert req["prefill_start_s"].iloc[2] == 0.0  # C's first chunk in step 1


def test_global_queue_follows_its_own_hand_worked_schedule():
    """The kept rule: a router-held FCFS queue, a rank taking at most 16 queued tokens (an
    empty rank any one prompt). At t=0 A -> rank 0, B -> rank 1; C (40) fits no rank holding
    a prompt and blocks D and E behind it. Step 1: A10, B10; at its start the queues empty,
    so C -> rank 0 (empty), D -> rank 1, E -> rank 1 (4 + 4 <= 16): queued for step 2. Step 2:
    C16, D4 + E4; steps 3, 4: C16, C8."""
    steps, req = _steps("global_queue")
    assert steps == [[10, 10], [16, 8], [16, 0], [8, 0]]
    start = req["prefill_start_s"].to_numpy()
    assert start[0] == start[1] == 0.0 and (start[2:] == start[2]).all() and start[2] > 0
    assert req["prefill_rank"].tolist() == [0, 1, 0, 1, 1]


@pytest.mark.parametrize("admission", ["rank_queues", "global_queue"])
def test_hand_worked_runs_conserve_tokens(admission):
    steps, req = _steps(admission)
    assert sum(map(sum, steps)) == A + B + C + D + E
    assert all(max(s) <= 16 for s in steps)  # never above the step budget of a rank
    assert req["finish_s"].notna().all()


def _bare_unit(budget: int, ranks: int = 1) -> PrefillUnit:
    """A prefill unit without a step model (its queues and `end` only)."""
    sm = SimpleNamespace(topology=SimpleNamespace(num_gpus=ranks),
                         policy=SimpleNamespace(alike=False), model=SimpleNamespace(top_k=8))
    return PrefillUnit(0, sm, None, None, None, requests=None, records=None,
                       token_budget=budget, chunking="tokens")


def test_partly_prefilled_prompt_goes_first():
    """Prompt X still loading its cached prefix, A behind it: A takes the step (X skipped, not
    blocking) and is left partly prefilled; once X is ready A's chunk still comes first (one
    partly prefilled prompt per rank, SGLang's ``chunked_req``), then X's."""
    unit = _bare_unit(16)
    x = unit.enqueue(0, 0, 20, 0, 5.0)  # ready at t=5
    a = unit.enqueue(0, 1, 40, 0, 0.0)
    chunks, _, _ = unit.build(0.0)
    assert [(c[2][0], c[3]) for c in chunks] == [(1, 16)]
    unit.inflight, unit.busy = chunks, True
    assert unit.end(1.0) == [] and unit.queues[0] == [a, x]  # A moved to the head
    chunks, _, _ = unit.build(6.0)
    assert [(c[2][0], c[3]) for c in chunks] == [(1, 16)]  # A again, not X
    unit.inflight, unit.busy = chunks, True
    unit.end(7.0)
    chunks, _, _ = unit.build(8.0)
    assert [(c[2][0], c[3]) for c in chunks] == [(1, 8), (0, 8)]  # A's rest, then X


def test_held_request_is_skipped_not_blocking():
    """A request without its decode reservation sits on its rank unready (inf); the one behind
    it runs."""
    unit = _bare_unit(16)
    unit.enqueue(0, 0, 10, 0, math.inf)
    unit.enqueue(0, 1, 10, 0, 0.0)
    chunks, _, min_ready = unit.build(0.0)
    assert [(c[2][0], c[3]) for c in chunks] == [(1, 10)] and min_ready == math.inf


def test_saturated_steady_state_fills_every_step():
    """`steady_state(mix=)`'s saturated prefill under ``rank_queues``: every rank's queue holds
    a step of work, so token-only chunks fill the budget on every rank in every step (the
    former ``global_queue`` model leaves ranks short behind a long prompt)."""
    rng = np.random.default_rng(0)
    inp = np.minimum(rng.lognormal(np.log(3000), 1.2, 400).astype(np.int64) + 1, 60_000)
    mix = LengthMix(inp, np.zeros_like(inp), np.ones_like(inp))
    full = prefill_batches(mix, 8, 4096, 12, 4, 0, chunking="tokens")
    assert all((b.tokens == 4096).all() for b in full)
    old = prefill_batches(mix, 8, 4096, 12, 4, 0, chunking="tokens", admission="global_queue")
    assert min(float(b.tokens.sum()) for b in old) < 8 * 4096
    with pytest.raises(InputError, match="admission must be one of"):
        prefill_batches(mix, 8, 4096, 2, 0, 0, admission="per_rank")


def test_admission_option_in_config_toml_and_set(tmp_path):
    cfg = serving.ClusterConfig.deepseek_day6()
    assert cfg.scheduler.prefill_admission == "rank_queues"
    old = apply(cfg, ["scheduler.prefill_admission=global_queue"])
    assert old.scheduler.prefill_admission == "global_queue"
    assert 'prefill_admission = "global_queue"' in old.to_toml()
    assert serving.ClusterConfig.from_toml(old.write_toml(tmp_path / "c.toml")) == old
    with pytest.raises(InputError, match="scheduler.prefill_admission must be one of"):
        apply(cfg, ["scheduler.prefill_admission=fifo"])
    # the queue rule and the balancer are separate choices: Day 6 keeps DeepSeek's balancer,
    # the SGLang preset takes SGLang's PD default (a random bootstrap room)
    assert cfg.prefill.balancer == "deepseek_prefill"
    sg = serving.ClusterConfig.sglang_96xh100()
    assert (sg.scheduler.prefill_admission, sg.prefill.balancer) == ("rank_queues", "random")


@pytest.mark.parametrize("admission", ["rank_queues", "global_queue"])
def test_run_meta_states_admission_and_balancers(admission):
    res = serving.simulate(_two_ranks(admission), _five_at_zero(), progress=False)
    meta = res.meta["admission"]
    assert meta["prefill_admission"] == admission
    assert meta["prefill_balancer"] == "round_robin"
    assert meta["decode_balancer"] == "round_robin"
    line = admission_text(meta)
    assert f"prefill {admission} (" in line and "prefill balancer round_robin" in line


def test_prefix_looked_up_when_the_prompt_comes_up_not_at_dispatch():
    """``rank_queues`` dispatches Q at t=0, before P (whose prompt is Q's first 16 tokens) has
    been prefilled; Q looks its prefix up only when it comes within two step budgets of its
    rank's head (step 3), after P finished in step 1: it gets P's 16 tokens from the store
    (the store's blocks load before its chunk runs: step 4). Round robin: P, G, Q -> rank 0."""
    bs = 4
    frame = pd.DataFrame({
        "request_id": np.arange(5),
        "arrival_s": np.zeros(5),
        "input_tokens": [16, 4, 32, 4, 24],  # P, filler, G, filler, Q
        "output_tokens": np.ones(5, dtype=np.int64),
        "block_hashes": [[1, 2, 3, 4], [9], [20, 21, 22, 23, 24, 25, 26, 27], [8],
                         [1, 2, 3, 4, 5, 6]],
    })
    wl = serving.workload.Workload(frame, block_size=bs)
    cfg = _two_ranks("rank_queues").replace(kv=KVConfig(block_size=bs))
    sim = Simulation(cfg, wl, 0, None, False, 10.0)
    r = sim.run().requests
    assert r["prefill_rank"].tolist() == [0, 1, 0, 1, 0]
    assert r["routed_s"].tolist() == [0.0] * 5
    assert r["cached_tokens"].tolist() == [0, 0, 0, 0, 16]
    assert r["store_loaded_tokens"].iloc[4] == 16
    assert r["prefill_start_s"].iloc[4] > r["prefill_end_s"].iloc[0]
    stats = sim.admission.state.store.stats()
    assert stats["lookups"] == 5 and stats["hit_blocks"] == 4  # each prompt looked up once
