"""`balance_memory`: each layer's GPUs permuted, never below the even share, locally optimal
(no trade on the fullest GPU lowers the maximum), and on DeepSeek-V3's prefill dump at EP32
with no redundant slot it reaches the uniform layout's memory (advise's craft N=0 row)."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from eplb.solvers.primitives.replica_budget import balance_memory, expert_slots_per_gpu


def _used(phy2log: np.ndarray, S: int) -> np.ndarray:
    L, P = phy2log.shape
    return (phy2log.reshape(L, P // S, S) >= 0).sum(2)


@settings(max_examples=80, deadline=None)
@given(L=st.integers(1, 6), G=st.integers(1, 6), S=st.integers(1, 4), seed=st.integers(0, 9999))
def test_permutes_gpus_and_is_locally_optimal(L, G, S, seed):
    rng = np.random.default_rng(seed)
    used = rng.integers(0, S + 1, size=(L, G))
    phy2log = np.full((L, G, S), -1, dtype=np.int64)
    for layer in range(L):
        for g in range(G):
            phy2log[layer, g, : used[layer, g]] = rng.integers(0, 50, used[layer, g])
    out = balance_memory(phy2log.reshape(L, G * S), S).reshape(L, G, S)
    for layer in range(L):  # each layer's GPUs, contents and all, are a permutation
        key = lambda t: sorted(map(tuple, t))  # noqa: E731
        assert key(out[layer]) == key(phy2log[layer])
    placed = _used(out.reshape(L, G * S), S)
    total = placed.sum(0)
    assert total.max() == expert_slots_per_gpu(out.reshape(L, G * S), S)
    assert total.max() >= -(-used.sum() // G)
    for g in np.flatnonzero(total == total.max()):  # no trade lowers the fullest GPU
        gain = placed[:, g, None] - placed
        assert not ((gain > 0) & (np.maximum(total[g] - gain, total + gain) < total[g])).any()


def test_craft_at_no_redundant_slot_fits_uniform_memory(deepseek_prefill_json):
    from eplb import Topology
    from eplb.solvers.policies.craft import replica_plan

    dump = deepseek_prefill_json
    load = np.asarray(json.loads(dump.read_text())["logical_count"], dtype=float)
    load = load[load.sum(1) > 0]
    L, E = load.shape
    topo = Topology(4, 8, 9)
    cap = -(-L * E // topo.num_gpus)
    plan = replica_plan(load, topo, total_slots=L * E, max_gpu_slots=cap)
    assert plan["expert_slots_per_gpu"] == cap and plan["total_slots"] == L * E
