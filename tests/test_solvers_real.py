"""Quality targets on real DeepSeek-V3 counts (../shared/traces/deepseek-v3-sglang; skipped
when absent). Long ILP runs belong to benchmarks/bench_solvers.py, not here."""

from __future__ import annotations

import numpy as np
import pytest

from eplb import Topology, solvers, traces
from eplb.solvers.analysis.bounds import lower_bound

PREFILL = Topology(4, 8, 9)  # 4 nodes x 8 GPUs, 288 slots
DECODE = Topology(18, 8, 2)  # 18 nodes x 8 GPUs, 288 slots: two slots per GPU


@pytest.fixture(scope="module")
def loads(deepseek_jsons):
    return {p.stem: traces.read(p).load() for p in deepseek_jsons}


def _dups(p) -> int:
    e = np.sort(p.phy2log.reshape(p.num_layers, p.topology.num_gpus, -1), axis=2)
    return int((e[:, :, 1:] == e[:, :, :-1]).sum())


def test_greedy_prefill_targets(loads):
    for name, load in loads.items():
        p = solvers.solve("greedy", load, PREFILL)
        ratio = p.gpu_load(load).max(1) / lower_bound(load, PREFILL)
        assert ratio.mean() <= 1.002, name
        assert ratio.max() <= 1.01, name
        assert _dups(p) == 0 and p.logcnt.max() <= PREFILL.num_gpus
        for groups in (None, 8):  # never worse than DeepSeek, global or hierarchical
            ds = solvers.solve("deepseek", load, PREFILL, num_groups=groups)
            assert (p.gpu_load(load).max(1) <= ds.gpu_load(load).max(1) * (1 + 1e-12)).all()


def test_greedy_two_slots_never_worse_than_deepseek(loads):
    for name, load in loads.items():
        p = solvers.solve("greedy", load, DECODE)
        ds = solvers.solve("deepseek", load, DECODE)
        mine, theirs = p.gpu_load(load).max(1), ds.gpu_load(load).max(1)
        assert (mine <= theirs * (1 + 1e-12)).all(), name
        assert mine.mean() < theirs.mean()  # and better on average
        assert _dups(p) == 0
        assert (mine >= lower_bound(load, DECODE, lp=False) * (1 - 1e-12)).all()


def test_weighted_reaches_the_average(loads):
    for name, load in loads.items():
        p = solvers.solve("greedy_weighted", load, PREFILL)
        gpu = p.gpu_load(load)
        assert (gpu.max(1) / gpu.mean(1)).max() <= 1.001, name
        assert p.replica_share is not None


def test_hierarchical_keeps_groups_and_beats_deepseek(loads):
    for name, load in list(loads.items())[:3]:
        p = solvers.solve("hierarchical", load, PREFILL, num_groups=8)
        assert _dups(p) == 0
        node = PREFILL.node_of_slot
        grp = p.phy2log // 32
        for layer in range(load.shape[0]):
            for k in range(8):
                assert len(set(node[grp[layer] == k])) == 1
        mine = p.gpu_load(load).max(1)
        ds = solvers.solve("deepseek", load, PREFILL, num_groups=8).gpu_load(load).max(1)
        assert (mine <= ds * (1 + 1e-12)).all(), name
        # within 1% of the group-constrained lower bound, hence of the ilp optimum
        hb = lower_bound(load, PREFILL, num_groups=8, hierarchical=True)
        assert (mine <= hb * 1.01).all(), name


def test_ilp_one_layer_certified_gap(loads):
    load = next(iter(loads.values()))[:1]
    p = solvers.solve("ilp", load, PREFILL, deterministic_time=1, workers=1)
    g = solvers.solve("greedy", load, PREFILL)
    assert p.gpu_load(load).max() <= g.gpu_load(load).max() * (1 + 1e-12)
    info = p.meta["solver"]
    assert info["gap"][0] <= 0.005
    assert info["bound"][0] <= p.gpu_load(load).max()
    assert info["bound"][0] >= lower_bound(load, PREFILL)[0] * (1 - 1e-12)
