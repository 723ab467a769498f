"""The serving simulator: conservation, determinism, Little's law, load response, the KV hit
rate against an independent prefix oracle, EPLB in the loop, bad input."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from eplb.errors import InputError
from eplb.evaluation import serving
from eplb.evaluation.serving import workload as W
from eplb.evaluation.serving.config import EplbConfig, KVConfig, RoutingConfig, UnitConfig


def small_config(**changes) -> serving.ClusterConfig:
    """One prefill and one decode unit of 4 x 8 GPUs each (9 slots per GPU), DeepSeek-V3."""
    base = serving.ClusterConfig.deepseek_day6()
    prefill = UnitConfig(
        nodes=4, slots_per_layer=288, token_budget=8192, balancer="deepseek_prefill"
    )
    decode = UnitConfig(
        nodes=4,
        slots_per_layer=288,
        max_running_requests=64,
        kv_capacity_tokens=base.decode.kv_capacity_tokens,
        mtp_draft_tokens=1,
        mtp_acceptance=0.85,
        balancer="deepseek_decode",
    )
    cfg = base.replace(
        prefill=prefill,
        decode=decode,
        name="small",
        eplb=EplbConfig(
            solver="deepseek", rebalance_interval_s=30, history_s=30, initial="history"
        ),
    )
    return cfg.replace(**changes) if changes else cfg


def small_workload(n=240, rate=6.0, seed=1, **kw) -> W.Workload:
    args = dict(input_mean=1500, output_mean=120, hit_rate=0.5, open_sessions=64, seed=seed)
    args.update(kw)
    return W.synthesize(n, rate=rate, **args)


@pytest.fixture(scope="module")
def run():
    cfg = small_config()
    wl = small_workload()
    return cfg, wl, serving.simulate(cfg, wl, seed=0, progress=False)


def test_every_request_finishes_once_tokens_conserved(run):
    cfg, wl, res = run
    req = res.requests
    assert len(req) == len(wl)
    assert req["request_id"].tolist() == wl.requests["request_id"].tolist()
    assert req["finish_s"].notna().all()
    assert res.summary()["requests_finished"] == len(wl)
    assert (req["arrival_s"] <= req["routed_s"]).all()
    assert (req["routed_s"] < req["first_token_s"]).all()
    assert (req["first_token_s"] <= req["finish_s"]).all()
    # tokens out: the first from prefill, the rest from decode steps
    dec = res.steps[res.steps["phase"] == "decode"]
    # (a float sum of whole token counts: equal to rounding)
    assert dec["output_tokens"].sum() == pytest.approx((req["output_tokens"] - 1).sum(),
                                                       rel=1e-12)
    pre = res.steps[res.steps["phase"] == "prefill"]
    assert pre["input_tokens_done"].sum() == req["input_tokens"].sum()
    # tokens in: every prompt token is either computed (chunks) or cached
    assert pre["tokens"].sum() == (req["input_tokens"] - req["cached_tokens"]).sum()
    assert (req["cached_tokens"] >= 0).all()
    assert (req["cached_tokens"] < req["input_tokens"]).all()
    assert (req["retries"] == 0).all()
    # the breakdown sums to each step's time
    parts = res.steps[
        [c for c in res.steps.columns if c.endswith("_s") and c not in ("start_s", "duration_s")]
    ].sum(axis=1)
    np.testing.assert_allclose(parts, res.steps["duration_s"], rtol=1e-9)


def test_deterministic_for_a_seed(run):
    cfg, wl, res = run
    again = serving.simulate(cfg, wl, seed=0, progress=False)
    pd.testing.assert_frame_equal(res.requests, again.requests)
    pd.testing.assert_frame_equal(res.steps, again.steps)
    pd.testing.assert_frame_equal(
        res.rebalances.drop(columns="solve_wall_s"), again.rebalances.drop(columns="solve_wall_s")
    )
    other = serving.simulate(cfg, wl, seed=1, progress=False, duration_s=10.0)
    assert not np.array_equal(
        other.steps["duration_s"].to_numpy()[:50], res.steps["duration_s"].to_numpy()[:50]
    )


def test_rebalancing_in_the_loop(run):
    cfg, wl, res = run
    rb = res.rebalances
    assert len(rb) >= 2 and set(rb["phase"]) == {"prefill", "decode"}
    assert (rb["time_s"] % cfg.eplb.rebalance_interval_s == 0).all()
    assert (rb["copy_s"] >= 0).all() and (rb["stall_s"] == 0).all()  # overlap mode
    np.testing.assert_allclose(rb["copy_s"], rb["max_gpu_bytes"] / (cfg.eplb.migration_gbps * 1e9))
    # a new placement goes live after its copy: the step's placement version moves
    assert res.steps["placement_version"].max() >= 2


def test_littles_law_on_decode():
    """L (time-average running requests, from the units' steps) = lambda (offered rate) x W
    (mean time in decode, from request timestamps), in a steady window."""
    cfg = small_config(eplb=EplbConfig(solver="static", initial="history"))
    rate = 10.0
    wl = small_workload(n=1000, rate=rate, seed=5, output_mean=150)
    res = serving.simulate(cfg, wl, seed=0, progress=False)
    t0, t1 = 30.0, float(wl.requests["arrival_s"].iloc[-1]) - 15
    dec = res.steps[(res.steps["phase"] == "decode")]
    # time-average running count over [t0, t1] from the steps (clipped to the window)
    s, e = dec["start_s"].to_numpy(), (dec["start_s"] + dec["duration_s"]).to_numpy()
    overlap = np.clip(np.minimum(e, t1) - np.maximum(s, t0), 0, None)
    L = float((dec["requests"].to_numpy() * overlap).sum() / (t1 - t0))
    req = res.requests[res.requests["decode_start_s"].notna()]
    inside = (req["decode_start_s"] >= t0) & (req["decode_start_s"] < t1)
    W_ = float((req["finish_s"] - req["decode_start_s"])[inside].mean())
    share = float((wl.requests["output_tokens"] > 1).mean())  # one-token outputs skip decode
    assert L == pytest.approx(rate * share * W_, rel=0.08)


def test_latency_grows_with_load():
    """Median and mean TTFT and TPOT grow with the offered load (same requests, faster); one
    8-GPU decode node so that decode batches grow enough to show in TPOT."""
    cfg = small_config(
        eplb=EplbConfig(solver="static", initial="history"),
        decode=UnitConfig(
            nodes=1, slots_per_layer=288, max_running_requests=256, balancer="deepseek_decode"
        ),
    )
    base = small_workload(n=200, rate=4.0, seed=2, output_mean=200)
    rows = []
    for rate in (4.0, 10.0, 25.0):
        wl = W.rescale(base, rate=rate)
        res = serving.simulate(cfg, wl, seed=0, progress=False)
        s, req = res.summary(), res.requests
        rows.append((s["ttft_p50_s"], s["tpot_p50_s"], req["ttft_s"].mean(), req["tpot_s"].mean()))
    arr = np.array(rows)
    assert np.all(np.diff(arr, axis=0) > 0), arr


def _oracle_cached(req: pd.DataFrame, hashes: list, block: int) -> np.ndarray:
    """Prompt tokens an unbounded store serves: a prompt's blocks enter the store when its
    prefill finishes; a lookup at a request's routing time sees the prefills finished before
    it (at the same instant too if the request was routed after waiting: it was re-offered
    after the completions of that instant). Longest prefix of blocks present, capped at
    ``input - 1`` (a prefill computes at least one token). Written without the simulator's
    KVStore."""
    events = []
    for i, r in enumerate(req.itertuples()):
        events.append((r.prefill_end_s, 1, i))  # insert (its prefill finished)
        late = r.routed_s > r.arrival_s
        events.append((r.routed_s, 2 if late else 0, i))  # lookup after/before inserts
    events.sort(key=lambda e: (e[0], e[1]))
    store: set = set()
    out = np.zeros(len(req), dtype=np.int64)
    inp = req["input_tokens"].to_numpy()
    for _, kind, i in events:
        if kind == 1:
            store.update(hashes[i])
        else:
            k = 0
            for h in hashes[i]:
                if h not in store:
                    break
                k += 1
            out[i] = min(k * block, inp[i] - 1)
    return out


def test_kv_hit_rate_equals_prefix_oracle(mooncake_jsonl):
    wl = W.read(mooncake_jsonl).head(400)
    wl = W.rescale(wl, rate=4.0)
    cfg = small_config(
        kv=KVConfig(store_capacity_blocks=None),
        eplb=EplbConfig(solver="static", initial="history"),
        decode=UnitConfig(
            nodes=4, slots_per_layer=288, max_running_requests=256, balancer="deepseek_decode"
        ),
    )
    res = serving.simulate(cfg, wl, seed=0, progress=False)
    req = res.requests
    assert req["finish_s"].notna().all()
    hashes = [h.tolist() for h in wl.requests["block_hashes"]]
    want = _oracle_cached(req, hashes, wl.block_size)
    np.testing.assert_array_equal(req["cached_tokens"].to_numpy(), want)
    assert res.summary()["kv_hit_rate"] == want.sum() / req["input_tokens"].sum()
    assert 0.05 < res.summary()["kv_hit_rate"] < wl.summary()["prefix_hit_rate"] + 1e-12


def test_policies_static_balanced_oracle_ordered():
    """Balanced routing is a lower bound on the MoE wait; a placement solved on the load beats
    the trivial one."""
    wl = small_workload(n=150, rate=6.0, seed=3)
    out = {}
    for solver, initial in (
        ("static", "trivial"),
        ("static", "history"),
        ("oracle", "trivial"),
        ("balanced", "trivial"),
    ):
        cfg = small_config(
            eplb=EplbConfig(solver=solver, initial=initial, rebalance_interval_s=20, history_s=20)
        )
        res = serving.simulate(cfg, wl, seed=0, progress=False)
        out[(solver, initial)] = res.steps.groupby("phase")["ep_wait_s"].mean()
    assert (out[("balanced", "trivial")] == 0).all()
    assert (out[("static", "history")] < out[("static", "trivial")]).all()
    assert (out[("oracle", "trivial")] < out[("static", "trivial")]).all()


def test_duration_ends_arrivals_and_the_run_drains():
    """``duration_s`` ends arrivals; by default the run then finishes what was admitted (a
    benchmark client waits for its requests); ``drain_s=0`` stops at ``duration_s``."""
    cfg = small_config()
    wl = small_workload(n=400, rate=6.0)
    res = serving.simulate(cfg, wl, seed=0, duration_s=30.0, progress=False, drain_s=0.0)
    assert res.meta["end_s"] == 30.0
    assert (res.requests["arrival_s"] < 30.0).all()
    assert res.requests["finish_s"].isna().any()
    assert (res.steps["start_s"] < 30.0).all()
    s = res.summary()
    assert s["duration_s"] == 30.0 and s["requests_finished"] < s["requests"]
    drained = serving.simulate(cfg, wl, seed=0, duration_s=30.0, progress=False)
    assert len(drained.requests) == len(res.requests)  # the same arrivals
    assert drained.requests["finish_s"].notna().all()  # every one of them finished
    assert 30.0 < drained.meta["end_s"] <= 30.0 + drained.meta["drain_cap_s"]
    d = drained.summary()
    assert d["duration_s"] == 30.0 and d["censored"] == 0  # the window: the arrivals'
    assert d["requests_finished"] == d["requests"] == s["requests"]


def test_stall_migration_stops_serving():
    cfg = small_config(
        eplb=EplbConfig(
            solver="greedy",
            rebalance_interval_s=15,
            history_s=15,
            migration="stall",
            migration_gbps=5.0,
        )
    )
    wl = small_workload(n=200, rate=6.0, seed=4)
    res = serving.simulate(cfg, wl, seed=0, progress=False)
    rb = res.rebalances
    assert (rb["stall_s"] > 0).any()
    np.testing.assert_allclose(rb["stall_s"], rb["copy_s"])
    for row in rb.itertuples():  # no step of that unit starts inside its stall
        st = res.steps[(res.steps["phase"] == row.phase) & (res.steps["unit"] == row.unit)]
        starts = st["start_s"].to_numpy()
        assert not ((starts > row.time_s) & (starts < row.time_s + row.stall_s - 1e-9)).any()
    assert res.requests["finish_s"].notna().all()


def test_multiple_units_share_work():
    base = small_config()
    cfg = base.replace(
        prefill=UnitConfig(**{**base.prefill.__dict__, "count": 2}),
        decode=UnitConfig(**{**base.decode.__dict__, "count": 2}),
    )
    wl = small_workload(n=200, rate=8.0, seed=6)
    res = serving.simulate(cfg, wl, seed=0, progress=False)
    req = res.requests
    assert set(req["prefill_unit"]) == {0, 1} and set(req["decode_unit"]) == {0, 1}
    assert req["finish_s"].notna().all()
    assert set(res.utilisation) == {"prefill0", "prefill1", "decode0", "decode1"}


def test_summary_and_plots(run, tmp_path):
    cfg, wl, res = run
    s = res.summary()
    for key in (
        "ttft_p50_s",
        "ttft_p90_s",
        "ttft_p99_s",
        "tpot_p50_s",
        "tpot_p90_s",
        "tpot_p99_s",
        "input_tok_s_per_node",
        "output_tok_s_per_node",
        "kv_hit_rate",
        "goodput",
        "requests_finished",
        "retries",
    ):
        assert key in s and not (isinstance(s[key], float) and math.isnan(s[key]))
    assert 0 <= s["goodput"] <= 1 and 0 <= s["kv_hit_rate"] < 1
    assert "ttft_p50_s" in res.summary_table()
    written = res.plot(tmp_path / "plots")
    assert len(written) == 4 and all(p.stat().st_size > 1000 for p in written)
    util = res.utilisation["decode0"]
    assert util.shape[1] == 32 and (util.to_numpy() >= 0).all()
    assert (res.utilisation["prefill0"].to_numpy() <= 1 + 1e-9).all()


def test_compare_is_paired():
    cfgs = {
        "static": small_config(eplb=EplbConfig(solver="static", initial="trivial")),
        "balanced": small_config(eplb=EplbConfig(solver="balanced")),
    }
    wl = small_workload(n=120, rate=4.0)
    frame = serving.compare(cfgs, wl, seeds=[0, 1], progress=False)
    assert list(frame["config"]) == ["static", "balanced", "static", "balanced"]
    assert (frame.loc[frame["config"] == "static", "d_ttft_p50_s"] == 0).all()
    r = frame.set_index(["config", "seed"])
    for seed in (0, 1):
        want = r.loc[("balanced", seed), "tpot_p50_s"] / r.loc[("static", seed), "tpot_p50_s"] - 1
        assert r.loc[("balanced", seed), "r_tpot_p50_s"] == pytest.approx(want)
    table = serving.paired_table(frame, ["tpot_p50_s"])
    mean = frame.loc[frame["config"] == "balanced", "r_tpot_p50_s"].mean()
    assert table.loc["balanced", ("r_tpot_p50_s", "mean")] == pytest.approx(mean)
    assert list(table.index) == ["static", "balanced"]


def test_compare_on_dask_equals_the_serial_run():
    """Two worker processes (configs and workloads pickled to them): the same rows as inline."""
    distributed = pytest.importorskip("distributed", reason="dask extra not installed")
    cfgs = {
        "static": small_config(eplb=EplbConfig(solver="static", initial="trivial")),
        "deepseek": small_config(),
    }
    wl = small_workload(n=30, rate=4.0)
    inline = serving.compare(cfgs, wl, seeds=[0], progress=False)
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
        distributed.get_task_stream(client) as stream,
    ):
        on_dask = serving.compare(cfgs, wl, seeds=[0], scheduler=client, progress=False)
    ran = [t for t in stream.data if t["key"].startswith("run_task")]
    assert len(ran) == 2
    cols = [c for c in inline.columns if c != "wall_s"]  # wall seconds differ, nothing else
    pd.testing.assert_frame_equal(inline[cols], on_dask[cols])


@pytest.mark.parametrize(
    "make, match",
    [
        (
            lambda: small_config(prefill=UnitConfig(nodes=1, balancer="no_such_balancer")),
            "balancer",
        ),
        (lambda: small_config(eplb=EplbConfig(solver="no_such_solver")), "eplb.solver"),
        (lambda: small_config(kv=KVConfig(store_capacity_blocks=-1)), "store_capacity_blocks"),
        (lambda: small_config(decode=UnitConfig(nodes=1, ep_size=16)), "ep_size"),
        (
            lambda: small_config(faults=[serving.GpuFailure(5.0, ("decode", 0), gpu=32)]),
            "GPU 32 does not exist",
        ),
        (
            lambda: small_config(faults=[serving.GpuFailure(5.0, ("prefill", 1), gpu=0)]),
            "does not exist",
        ),
        (lambda: small_config(faults=[{"time_s": -1, "unit": ["decode", 0], "gpu": 0}]), "time_s"),
        (lambda: small_config(routing=RoutingConfig(options={"no_such": 1})), "routing.options"),
    ],
)
def test_bad_configs_one_clear_error(make, match):
    with pytest.raises(InputError, match=match):
        cfg = make()
        serving.simulate(cfg, small_workload(n=20), progress=False)


def test_bad_arguments():
    cfg = small_config()
    wl = small_workload(n=20)
    with pytest.raises(InputError, match="duration_s"):
        serving.simulate(cfg, wl, duration_s=-1)
    with pytest.raises(InputError, match="seed"):
        serving.simulate(cfg, wl, seed=-1)
    with pytest.raises(InputError, match="block_size"):
        serving.simulate(cfg.replace(kv=KVConfig(block_size=256)), wl)
    with pytest.raises(InputError, match="could never be served"):
        big = W.synthesize(
            5, rate=1.0, input_mean=2_000_000, input_sigma=0.0, max_input_tokens=3_000_000, seed=0
        )
        serving.simulate(cfg, big, progress=False)
