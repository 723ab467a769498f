"""``biased`` (ROCm ATOM's top-K fully replicated baseline): replica counts, every hot expert
on every GPU, valid placements on random problems."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings

from eplb import Topology, solvers
from eplb.solvers.policies.biased import replica_counts
from eplb.testing import assert_valid_placement, check_solver
from eplb.testing.strategies import problems


def test_counts_by_hand():
    load = np.array([[5.0, 1.0, 3.0, 2.0]])
    # 4 GPUs, 8 slots: 4 redundant -> K = 4 // 3 = 1 fully replicated, 1 slot to the next
    assert replica_counts(load, 4, 8).tolist() == [[4, 1, 2, 1]]
    # one GPU: no full replication, the extra slots go to the hottest in turn
    assert replica_counts(load, 1, 6).tolist() == [[2, 1, 2, 1]]
    # room for every expert on every GPU and more: cycle from the hottest again
    assert replica_counts(load, 2, 9).tolist() == [[3, 2, 2, 2]]


@settings(max_examples=30, deadline=None)
@given(prob=problems())
def test_hot_experts_on_every_gpu(prob):
    load, topo, _ = prob
    p = solvers.solve("biased", load, topo)
    assert_valid_placement(p, load)
    L, E = load.shape
    G, S = topo.num_gpus, topo.slots_per_gpu
    counts = replica_counts(load, G, topo.num_slots)
    assert (counts.sum(1) == topo.num_slots).all()
    got = np.stack([np.bincount(p.phy2log[i], minlength=E) for i in range(L)])
    assert (got == counts).all()
    if G > 1 and topo.num_slots >= E + G - 1:
        by_gpu = p.phy2log.reshape(L, G, S)
        hot = np.argsort(-load, axis=1, kind="stable")[:, 0]
        assert all((by_gpu[i] == hot[i]).any(-1).all() for i in range(L))


def test_suite_checks():
    assert check_solver("biased").ok
    topo = Topology(num_nodes=1, gpus_per_node=4, slots_per_gpu=6)
    load = np.random.default_rng(0).pareto(1.5, size=(3, 16)) + 0.01
    assert solvers.solve("biased", load, topo).meta["solver"]["fully_replicated"] == 2
