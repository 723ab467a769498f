"""``craft`` in the closed-loop simulator: empty slots free expert weight memory for decode KV
(sized once at the start), and rebalances keep within that memory (issue 20, part 5)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from eplb.evaluation.serving.config import EplbConfig
from eplb.evaluation.serving.simulator.loop import Simulation
from eplb.solvers.primitives.replica_budget import expert_slots_per_gpu
from tests.test_serving_sim import small_config, small_workload


def _sim(solver: str, duration_s: float, **options) -> Simulation:
    """A 2 x 8-GPU prefill and decode unit (17 slots per GPU: 16 redundant per layer)."""
    eplb = EplbConfig(solver=solver, rebalance_interval_s=20, history_s=20, initial="history",
                      options=options)
    cfg = small_config(eplb=eplb)
    units = {ph: replace(cfg.unit(ph), nodes=2, slots_per_layer=272)
             for ph in ("prefill", "decode")}
    return Simulation(cfg.replace(**units), small_workload(n=80, rate=3.0), 0, duration_s, False,
                      10.0)


@pytest.fixture(scope="module")
def pair():
    out = {}
    for name, opts in (("greedy", {}), ("craft", {"redundancy": 0.5, "budget": 0})):
        sim = _sim(name, 30.0, **opts)
        sim.eplb.initial_placements()
        out[name] = sim
    return out


def test_decode_kv_grows_by_the_freed_weights(pair):
    """Per decode rank: craft's capacity minus uniform replication's (every slot used, the
    config's promise) is the fullest GPU's freed FP8 expert bytes over a token's KV bytes."""
    uni, cr = pair["greedy"], pair["craft"]
    cfg = cr.cfg
    model, unit = cfg.model_spec, cfg.decode
    promise = unit.kv_capacity_tokens
    assert np.all(uni.admission.state.kv_cap == promise)
    assert np.all(uni.admission.state.d_state.kv_blocks_capacity == promise // cfg.kv.block_size)
    placement = cr.units["decode"][0].placement
    S = placement.topology.slots_per_gpu
    assert (placement.phy2log < 0).any()
    held = expert_slots_per_gpu(placement.phy2log, S)
    freed_bytes = (model.moe_layers * S - held) * model.expert_params  # FP8: 1 byte / param
    token_bytes = model.kv_bytes_per_token * model.num_layers
    assert freed_bytes > 0
    want = promise + freed_bytes // token_bytes
    assert np.all(cr.admission.state.kv_cap == want)
    assert np.all(cr.admission.state.d_state.kv_blocks_capacity == want // cfg.kv.block_size)
    assert cr.units["decode"][0].planner.max_gpu_slots == held


def test_rebalances_keep_the_weight_memory():
    """A run past a rebalance: each new craft placement fits the memory reserved at the
    start (the KV capacity is never taken back) and is relabeled against the live one."""
    sim = _sim("craft", 26.0, redundancy=0.5, budget=0)
    res = sim.run()
    unit = sim.units["decode"][0]
    cap = unit.planner.max_gpu_slots
    assert cap is not None and unit.version >= 2  # a rebalanced placement went live
    p = unit.placement
    assert expert_slots_per_gpu(p.phy2log, p.topology.slots_per_gpu) <= cap
    assert p.meta["solver"]["max_gpu_slots"] == cap and p.meta["solver"]["relabeled"]
    reb = res.rebalances
    assert (reb["kind"] != "skipped").any()
