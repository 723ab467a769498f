"""The overlap formulas of `steptime.assemble` against a brute-force per-rank schedule.

Every all-to-all is a barrier: a rank issues it, waits until every rank has issued it, and the
collective then runs on one communication stream (one all-to-all after another). Between two
barriers each rank runs its own stages back to back, so an interval lasts as long as its
communication or the slowest rank's own total, not the sum of per-stage maxima over ranks. The
schedule below is an event loop over ranks, written independently of the closed forms.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eplb.evaluation.serving import RankBatch, StepModel
from eplb.evaluation.serving.config.hardware import h800
from eplb.evaluation.serving.config.model import deepseek_v3
from eplb.evaluation.serving.steptime.assemble import Assembly
from eplb.topology import Topology

REL = 1e-9


def programme(phase: str, micro_batches: int) -> list[tuple]:
    """One MoE layer per rank in program order: ``("run", stage)``, ``("issue", comm)``
    (a barrier; the comm starts once every rank reached it and the stream is free),
    ``("wait", comm)`` (until that comm has finished). Stages: a1, a2, sh, o, moe."""
    att = [("run", "a1"), ("run", "a2"), ("run", "sh"), ("run", "o")]
    if micro_batches == 1:
        return [
            *att,
            ("issue", "d"),
            ("wait", "d"),
            ("run", "moe"),
            ("issue", "c"),
            ("wait", "c"),
        ]
    if phase == "prefill":  # DBO: mb0's attention ran in the previous layer's last interval
        return [
            ("issue", "d0"),
            ("wait", "c1-prev"),
            *att,  # mb1
            ("issue", "d1"),
            ("wait", "d0"),
            ("run", "moe"),  # mb0
            ("issue", "c0"),
            ("wait", "d1"),
            ("run", "moe"),  # mb1
            ("issue", "c1"),
            ("wait", "c0"),
            *att,  # mb0, next layer
        ]
    half = [
        ("issue", "c_x"),
        ("run", "a2"),  # y
        ("issue", "d_y"),
        ("wait", "c_x"),
        ("run", "a1"),  # x, next layer
        ("wait", "d_y"),
        ("run", "sh"),
        ("run", "o"),
        ("run", "moe"),  # y
    ]
    swap = {"c_x": "c_y", "d_y": "d_x"}
    return half + [(kind, swap.get(name, name)) for kind, name in half]


def brute_force(phase, micro_batches, f, a1, a2, sh, o, moe, d, c) -> float:
    """Seconds of ``L`` consecutive MoE layers by an event loop over the ``G`` ranks."""
    G, L = a1.size, moe.shape[0]
    clock = np.zeros(G)
    stream = 0.0  # when the communication stream is free
    done = {"c1-prev": 0.0}
    for layer in range(L):
        stage = {"a1": a1, "a2": a2, "sh": sh, "o": np.full(G, o), "moe": moe[layer]}
        for kind, name in programme(phase, micro_batches):
            if kind == "run":
                clock = clock + f * stage[name]
            elif kind == "issue":
                start = max(clock.max(), stream)
                clock[:] = clock.max()  # barrier
                dur = d[layer] if name.startswith("d") else c[layer]
                stream = done[name] = start + dur
            else:
                clock = np.maximum(clock, done[name])
        if phase == "prefill" and micro_batches == 2:
            done["c1-prev"] = done["c1"]
    return max(clock.max(), stream)


@settings(max_examples=60, deadline=None)
@given(
    phase=st.sampled_from(["prefill", "decode"]),
    micro_batches=st.sampled_from([1, 2]),
    G=st.integers(1, 6),
    L=st.integers(1, 4),
    comm_scale=st.sampled_from([0.0, 0.3, 1.0, 3.0]),
    seed=st.integers(0, 2**16),
)
def test_layer_formula_equals_per_rank_schedule(phase, micro_batches, G, L, comm_scale, seed):
    rng = np.random.default_rng(seed)
    a1, a2, sh = (rng.gamma(0.5, 1.0, G) for _ in range(3))
    moe = rng.gamma(0.5, 1.0, (L, G))
    d, c = (comm_scale * rng.gamma(1.0, 1.0, L) for _ in range(2))
    o = float(rng.random() * 0.1)
    asm = Assembly(phase, deepseek_v3, h800, micro_batches, "even")
    closed = asm.layer(a1, a2, sh, o, moe, d, c)
    assert closed.shape == (L,)
    f = asm.sm_factor
    want = brute_force(phase, micro_batches, f, a1, a2, sh, o, moe, d, c)
    assert closed.sum() == pytest.approx(want, rel=REL)


def test_own_total_not_sum_of_stage_maxima():
    """A mixed prefill batch: one rank's long prompt (core attention heavy), another's many
    short ones (projections heavy). The layer waits for the slowest rank's own total, which
    is less than the sum of the per-stage maxima the old formula charged."""
    topo = Topology(1, 2, 129)
    sm = StepModel("prefill", topo)
    batch = RankBatch.prefill([8192] + [64] * 256, rank=[0] + [1] * 256, num_ranks=2)
    a1, a2, sh = sm.rank.stages(batch)
    assert a1.argmax() != a2.argmax()  # the two ranks peak in different stages
    res = sm.time(batch)
    o = sm.hardware.fit.layer_overhead_s
    moe, _ = sm.gpu.balanced(batch.tokens.sum() / 2)
    comm = np.zeros(deepseek_v3.moe_layers)
    own = sm.assembly.layer(a1, a2, sh, o, moe, comm, comm)
    per_stage = sm.assembly.layer(
        a1.max(keepdims=True), a2.max(keepdims=True), sh.max(keepdims=True), o, moe, comm, comm
    )
    assert (own < per_stage).all()
    assert (res.layer_s <= per_stage * (1 + REL)).all()
