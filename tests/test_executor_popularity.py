"""Issue 22 §2: ``eplb execute`` on a counts trace reproduces the trace's popularity: executed
GPU loads converge to `evaluate`'s (the placement's even split of the trace's load) as tokens
grow; picks stay distinct per token and inside ``topk_groups`` groups."""

from __future__ import annotations

import numpy as np
import pytest

from eplb import Topology, solvers, traces
from eplb.evaluation.align import with_layers
from eplb.evaluation.execute import execute_trace
from eplb.executor.popularity import inclusion, popularity_picks
from tests.conftest import BUNDLED


def test_picks_have_the_popularity_as_inclusion_probabilities():
    rng = np.random.default_rng(0)
    load = rng.random(32) + 0.3
    for groups in ((None, None), (8, 3)):
        ids = popularity_picks(load, 40_000, 4, np.random.default_rng(1), num_groups=groups[0],
                               topk_groups=groups[1])
        assert ids.shape == (40_000, 4)
        assert (np.sort(ids, 1)[:, 1:] != np.sort(ids, 1)[:, :-1]).all()  # distinct
        if groups[0]:
            assert max(len(set(r)) for r in (ids[:500] // 4).tolist()) <= 3
        share = np.bincount(ids.ravel(), minlength=32) / ids.size
        np.testing.assert_allclose(share, load / load.sum(), rtol=0.05)


def test_inclusion_caps_at_one_and_keeps_the_sum():
    pi = inclusion(np.array([10.0, 1, 1, 1, 1]), 2)
    assert pi[0] == 1.0 and pi.sum() == pytest.approx(2.0)
    np.testing.assert_allclose(pi[1:], 0.25)


def test_executed_loads_converge_to_evaluated_loads():
    trace = traces.read(BUNDLED / "deepseek-v3-calibrated.npz")
    topo = Topology.parse("4x8", 288)
    p = with_layers(solvers.solve("greedy", trace.load(), topo), trace.layer_ids)
    lid = int(trace.layer_ids[0])
    want = p.gpu_load(trace.load())[0]
    want = want / want.sum()
    errs = []
    for n in (256, 4096):
        rep = execute_trace(p, trace, layer=lid, num_tokens=n, hidden=8, top_k=8)
        assert rep.routing == "biased" and rep.passed
        got = rep.stats.gpu_tokens / rep.stats.gpu_tokens.sum()
        errs.append(np.abs(got - want).max() / want.mean())
    assert errs[1] < errs[0] / 2 and errs[1] < 0.15
