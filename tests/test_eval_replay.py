"""evaluation.replay: rebalancing schedule, no peeking, migration counts, errors."""

from __future__ import annotations

import numpy as np
import pytest

from eplb import InputError, Placement, Topology, TraceError, solvers
from eplb.evaluation.metrics import score, summarize
from eplb.evaluation.replay import replay, replay_summary
from eplb.solvers.analysis.migration import replicas_moved
from eplb.traces import Trace


@pytest.fixture
def spy_calls():
    """Registers ``eval_spy`` for one test (unregistered after it): a policy that records what
    it was given, then places like deepseek. Yields the list of its calls."""
    calls: list[dict] = []

    def spy(load, topology, *, num_groups=None, previous=None, seed=0, time_limit=None, **kw):
        calls.append({"load": np.array(load), "previous": previous})
        return solvers.get("deepseek")(load, topology, num_groups=num_groups, previous=None,
                                       seed=seed, time_limit=time_limit)

    solvers.register("eval_spy")(spy)
    try:
        yield calls
    finally:
        solvers.unregister("eval_spy")


def shifting_trace(T=9, L=3, E=12, seed=0):
    """Each window has a different hot expert, so a placement fit to the wrong window shows."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(5, 15, (T, L, E)).astype(float)
    for t in range(T):
        counts[t, :, t % E] += 400
    # one expert takes ~80% of the picks: only top-1 routing can produce that
    return Trace(counts, layer_ids=np.arange(10, 10 + L), meta={"top_k": 1})


TOPO = Topology(2, 2, 4)  # 16 slots for 12 experts


def test_schedule_and_no_peeking_via_solver_inputs(spy_calls):
    trace = shifting_trace()
    df = replay(trace, TOPO, solver="eval_spy", interval=2, history=3)
    # first call: the uniform initial placement; then one per rebalance at t = 2, 4, 6, 8
    assert len(spy_calls) == 1 + 4
    np.testing.assert_array_equal(spy_calls[0]["load"], np.ones((3, 12)))
    for call, t in zip(spy_calls[1:], (2, 4, 6, 8), strict=True):
        expect = trace.counts[max(0, t - 3) : t].sum(0)  # strictly before window t
        np.testing.assert_array_equal(call["load"], expect)
        assert isinstance(call["previous"], Placement)
    assert df["rebalanced"].tolist() == [t in (2, 4, 6, 8) for t in range(9)]
    assert df["version"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4]
    assert df.loc[df["window"] == 5, "fit_start"].item() == 1
    assert df.loc[df["window"] == 5, "fit_stop"].item() == 4


def test_future_windows_never_change_past_rows():
    # A replay that peeked at window t (or later) would change when later windows change.
    trace = shifting_trace(seed=1)
    base = replay(trace, TOPO, solver="deepseek", interval=1, history=2)
    for cut in (3, 6):
        counts = np.array(trace.counts)
        counts[cut:] = counts[cut:][:, :, ::-1] * 3 + 7  # rewrite the future
        changed = replay(Trace(counts, trace.layer_ids), TOPO, solver="deepseek", interval=1,
                         history=2)
        cols = ["step_max_over_mean", "balancedness_min", "replicas_moved"]
        np.testing.assert_array_equal(changed[cols][:cut].to_numpy(), base[cols][:cut].to_numpy())
        # the placement that goes live at window `cut` was solved before it was seen
        assert changed["replicas_moved"][cut] == base["replicas_moved"][cut]
        assert not np.allclose(changed["step_max_over_mean"][cut:],
                               base["step_max_over_mean"][cut:])


def test_scores_use_the_live_placement():
    trace = shifting_trace(T=4)
    df = replay(trace, TOPO, solver="deepseek", interval=1, history=1)
    # window 2 is scored with the placement solved from window 1 only
    live = solvers.solve("deepseek", trace.counts[1], TOPO)
    expect = summarize(score(live, trace.counts[2], bound=False))["step_max_over_mean"]
    assert df.loc[2, "step_max_over_mean"] == pytest.approx(expect)
    # hot expert moves every window, so the stale placement is worse than the oracle
    oracle = replay(trace, TOPO, solver="deepseek", interval=1, history=1, oracle=True)
    assert (oracle["oracle_step_max_over_mean"][1:] < oracle["step_max_over_mean"][1:]).all()


def test_ema_and_all_history(spy_calls):
    trace = shifting_trace(T=5)
    replay(trace, TOPO, solver="eval_spy", interval=4, history=None, ema=0.5)
    np.testing.assert_allclose(spy_calls[1]["load"], trace.load(slice(0, 4), ema=0.5))


def test_migration_counts():
    topo = Topology(1, 2, 2)
    a = Placement([[0, 1, 2, 3]], 4, topo).validate()
    same_gpus = Placement([[1, 0, 3, 2]], 4, topo).validate()  # reordered inside GPUs
    swapped = Placement([[2, 1, 0, 3]], 4, topo).validate()  # experts 0 and 2 change GPU
    assert replicas_moved(a, a).tolist() == [0]
    assert replicas_moved(a, same_gpus).tolist() == [0]
    assert replicas_moved(a, swapped).tolist() == [2]
    trace = shifting_trace(T=4)
    df = replay(trace, TOPO, solver="deepseek", interval=1, history=1, expert_bytes=1000)
    np.testing.assert_array_equal(df["bytes_moved"], df["replicas_moved"] * 1000.0)
    assert (df.loc[~df["rebalanced"], "replicas_moved"] == 0).all()
    s = replay_summary(df)
    assert s["rebalances"] == 3 and s["replicas_moved"] == df["replicas_moved"].sum()


def test_traffic_per_window():
    trace = shifting_trace(T=3)
    df = replay(trace, TOPO, solver="deepseek", interval=1, policy="local_first")
    assert (df["rdma_bytes"] > 0).all() and (df["alltoall_seconds"] > 0).all()


def test_bad_input():
    one = Trace(np.ones((1, 2, 12)))
    with pytest.raises(TraceError, match="needs at least 2"):
        replay(one, TOPO, solver="deepseek")
    trace = shifting_trace(T=3)
    with pytest.raises(InputError, match="interval must be a positive integer"):
        replay(trace, TOPO, solver="deepseek", interval=0)
    with pytest.raises(InputError, match="ema must be in"):
        replay(trace, TOPO, solver="deepseek", ema=1.5)
    with pytest.raises(InputError, match="unknown dispatch policy"):
        replay(trace, TOPO, solver="deepseek", policy="nope")
    with pytest.raises(InputError, match="unknown solver"):
        replay(trace, TOPO, solver="nope")
