"""Issue 18, part 2: every consumer of a placement with failed GPUs treats their slots (-1) as
empty; NumPy reads index -1 as the last expert, so each use below once put the last expert
(or a crash) on a dead GPU. Each test pins one site."""

from __future__ import annotations

import numpy as np
import pytest

from eplb import Placement, Topology, solvers
from eplb.evaluation import metrics, traffic
from eplb.executor import MoELayer
from eplb.executor.executor import ReferenceExecutor
from eplb.solvers.primitives import local_first
from eplb.solvers.primitives.traffic_cost import expected_rdma

POLICIES = ["even", "random", "local_first", "weighted", "lp"]
ONE = Placement(np.array([[0, -1]]), 1, Topology(1, 2, 1, failed_gpus=[1]))


@pytest.mark.parametrize("policy", POLICIES)
def test_dispatch_never_reaches_the_failed_gpu(policy):
    """The issue's case: one expert on GPU 0, GPU 1 failed; ``lp`` sent half the picks to
    GPU 1 (``[[2, 2]]``, counts ``[15.5, 15.5]``)."""
    rank = np.array([0, 1, 0, 1])
    ids = traffic.simulate(ONE, topk_ids=np.zeros((4, 1, 1), int), token_rank=rank, policy=policy)
    assert ids.gpu_tokens.tolist() == [[4, 0]]
    counts = traffic.simulate(ONE, load=np.array([[31.0]]), top_k=1, policy=policy)
    assert counts.gpu_tokens.tolist() == [[31.0, 0.0]]


@pytest.fixture(scope="module")
def failed():
    """Two layers, 4 experts on 2 nodes x 2 GPUs x 2 slots, GPU 2 failed (slots 4, 5 empty)."""
    topo = Topology(2, 2, 2, failed_gpus=[2])
    load = np.array([[10.0, 20, 30, 40], [40.0, 30, 20, 10]])
    p = solvers.solve("greedy", load, topo)
    assert (p.phy2log[:, 4:6] == -1).all()
    return p, load


def test_gpu_matrix_with_empty_slots(failed):
    """Was ``ValueError: 'list' argument must have no negative elements`` (key -1)."""
    p, _ = failed
    m = metrics.gpu_matrix(p)
    assert np.allclose(m.sum(2), 1.0) and (m[:, :, 2] == 0).all()


def test_metrics_gpu_loads_with_empty_slots(failed):
    p, load = failed
    got = metrics.gpu_loads(p, load)
    assert np.allclose(got, p.gpu_load(load)) and (got[:, 2] == 0).all()
    assert np.allclose(got.sum(1), load.sum(1))


def test_expected_rdma_with_empty_slots(failed):
    """Was an InputError ("expert ids outside 0..3") for a valid placement."""
    p, load = failed
    node = np.arange(8) // 4
    want = []
    for row, w in zip(p.phy2log, load, strict=True):
        nodes = [len({node[s] for s in range(8) if row[s] == e}) for e in range(4)]
        want.append(float((w * (1 - np.array(nodes) / 2)).sum()))
    assert np.allclose(expected_rdma(p, load), want)


def test_local_first_loads_with_empty_slots(failed):
    """Node counts and local-first loads skip empty slots (was a negative bincount key)."""
    p, load = failed
    topo = p.topology
    k = local_first.node_counts(p.phy2log, 4, topo)
    assert (k.sum((1, 2)) == 6).all()  # 6 live slots per layer
    gl = local_first.gpu_loads(load, p.phy2log, topo)
    assert (gl[:, 2] == 0).all() and np.allclose(gl.sum(1), load.sum(1))


def test_executor_holds_no_weights_on_a_failed_gpu(failed):
    """A failed GPU's slots held the last expert's weights; they hold none, and the forward
    pass still equals the dense one."""
    p, _ = failed
    layer = MoELayer(4, 6, 5, 2, dtype=np.float64, seed=1)
    ex = ReferenceExecutor(layer, p)
    w1, w3, w2 = ex.rank_weights(0)
    assert not w1[2].any() and not w3[2].any() and not w2[2].any()
    x = np.random.default_rng(0).standard_normal((10, 6))
    ids, w = layer.route(x)
    out, _ = ex.forward(x, ids, w, np.resize([0, 1, 3], 10))  # sources: the live GPUs
    assert np.allclose(out, layer.dense_forward(x, ids, w), atol=1e-10)
