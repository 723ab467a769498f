"""ClusterConfig: presets, TOML round trip, one clear InputError per bad field; steady_state."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import tomllib
from hypothesis import given
from hypothesis import strategies as st

from eplb.errors import InputError
from eplb.evaluation.serving import (
    ClusterConfig,
    EplbConfig,
    KVConfig,
    RankBatch,
    StepModel,
    UnitConfig,
    steady_state,
    step_time,
)
from eplb.evaluation.serving.config import kv_capacity_tokens
from eplb.evaluation.serving.config.hardware import h800
from eplb.evaluation.serving.config.model import deepseek_v3
from eplb.evaluation.serving.steptime import BREAKDOWN

PRESETS = [ClusterConfig.deepseek_day6, ClusterConfig.sglang_96xh100, ClusterConfig]


@pytest.mark.parametrize("make", PRESETS)
def test_toml_round_trip(make, tmp_path):
    cfg = make()
    text = cfg.to_toml()
    assert ClusterConfig.from_dict(tomllib.loads(text)) == cfg
    path = cfg.write_toml(tmp_path / "cluster.toml")
    assert ClusterConfig.from_toml(path) == cfg


@given(
    nodes=st.integers(1, 20),
    per_gpu=st.integers(1, 12),
    budget=st.one_of(st.none(), st.integers(1, 65536)),
    interval=st.floats(1.0, 1e5, allow_nan=False),
    solver=st.sampled_from(["deepseek", "greedy", "static", "oracle"]),
    balancer=st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12),
    options=st.dictionaries(
        st.sampled_from(["alpha", "threshold", "name"]),
        st.one_of(st.integers(-5, 5), st.floats(0, 1), st.text(max_size=5)),
        max_size=3,
    ),
)
def test_toml_round_trip_any_valid_config(
    nodes, per_gpu, budget, interval, solver, balancer, options
):
    g = nodes * 8
    per_gpu = max(per_gpu, -(-256 // g))
    unit = UnitConfig(
        nodes=nodes,
        slots_per_layer=g * per_gpu,
        token_budget=budget,
        balancer=balancer,
        balancer_options=options,
    )
    cfg = ClusterConfig(
        prefill=unit,
        eplb=EplbConfig(solver=solver, rebalance_interval_s=interval),
        faults=({"time_s": 1.5, "unit": ["decode", 0], "gpu": 3},),
    )
    assert ClusterConfig.from_dict(tomllib.loads(cfg.to_toml())) == cfg


def test_presets_match_published_shapes():
    ds = ClusterConfig.deepseek_day6()
    assert (ds.hardware, ds.prefill.num_gpus, ds.decode.num_gpus) == ("h800", 32, 144)
    assert ds.prefill.slots_per_layer == ds.decode.slots_per_layer == 256 + 32
    assert (ds.prefill.slots_per_gpu, ds.decode.slots_per_gpu) == (9, 2)
    sg = ClusterConfig.sglang_96xh100()
    assert (sg.hardware, sg.prefill.num_gpus, sg.decode.num_gpus) == ("h100", 32, 72)
    assert (sg.prefill.slots_per_gpu, sg.decode.slots_per_gpu) == (9, 4)
    # the profile's 128 requests x 4K and Day-6's ~88 streams x 4,989 tokens fit one rank
    assert ds.decode.kv_capacity_tokens > max(128 * 4096, 88 * 4989)
    assert kv_capacity_tokens(deepseek_v3, h800, 2) == ds.decode.kv_capacity_tokens


def _with(cfg: ClusterConfig, path: str, value):
    block, _, key = path.partition(".")
    if not key:
        return {**cfg.to_dict(), block: value}
    data = cfg.to_dict()
    data[block] = {**data[block], key: value}
    return data


BAD = [
    ("hardware", "h900", "hardware: unknown hardware 'h900'; use one of h800, h100, h200, h20,"),
    ("model", "llama", "model: unknown model 'llama'"),
    ("decode.kv_capacity_tokens", -5, "decode.kv_capacity_tokens must be positive, got -5"),
    ("kv.store_capacity_blocks", -1, "kv.store_capacity_blocks must be >= 0, got -1"),
    ("prefill.ep_size", 64, "prefill.ep_size 64 needs 8 nodes of 8 GPUs but the unit has 4"),
    (
        "decode.slots_per_layer",
        287,
        "decode.slots_per_layer 287 is not a multiple of 144 GPUs; use 288",
    ),
    ("prefill.slots_per_layer", 224, "prefill.slots_per_layer 224 cannot hold the 256 experts"),
    ("prefill.nodes", "4", "prefill.nodes must be an integer, got '4'"),
    ("prefill.nodes", 0, "prefill.nodes must be positive, got 0"),
    ("prefill.micro_batches", 3, "prefill.micro_batches must be 1 or 2"),
    ("decode.mtp_acceptance", 1.5, "decode.mtp_acceptance must be <= 1"),
    ("prefill.mtp_draft_tokens", 1, "prefill.mtp_draft_tokens applies to decode units only"),
    ("eplb.solver", "magic", "eplb.solver 'magic' is unknown; use one of biased, craft, deepseek"),
    ("eplb.migration", "later", "eplb.migration must be one of stall, overlap"),
    ("eplb.rebalance_interval_s", 0, "eplb.rebalance_interval_s must be > 0"),
    ("kv.transfer_gbps", -1.0, "kv.transfer_gbps must be > 0"),
    ("slo.tpot_s", 0.0, "slo.tpot_s must be > 0"),
    ("routing.source", "trace", "routing.path is required when routing.source is 'trace'"),
    ("dispatch", "nearest", "dispatch must be one of even, random, local_first, weighted"),
    ("prefill.nodez", 4, "unknown key prefill.nodez; known keys:"),
    ("faults", "gpu 5", "faults must be a list of tables"),
]


@pytest.mark.parametrize("path,value,message", BAD, ids=[b[0] for b in BAD])
def test_bad_config_gives_one_clear_error(path, value, message):
    base = ClusterConfig.deepseek_day6()
    with pytest.raises(InputError) as info:
        ClusterConfig.from_dict(_with(base, path, value))
    assert message in str(info.value)


def test_bad_toml_files(tmp_path):
    broken = tmp_path / "broken.toml"
    broken.write_text("[prefill\nnodes = 4\n")
    with pytest.raises(InputError, match="is not valid TOML"):
        ClusterConfig.from_toml(broken)
    with pytest.raises(InputError, match="cannot read cluster config"):
        ClusterConfig.from_toml(tmp_path / "missing.toml")
    unknown = tmp_path / "unknown.toml"
    unknown.write_text('hardware = "h800"\ncolour = "blue"\n')
    with pytest.raises(InputError, match="unknown key 'colour'"):
        ClusterConfig.from_toml(unknown)


def test_dataclass_construction_is_validated_too():
    with pytest.raises(InputError, match="decode.slots_per_layer 300 is not a multiple"):
        ClusterConfig(decode=UnitConfig(nodes=18, slots_per_layer=300))
    with pytest.raises(InputError, match="kv.block_size must be positive"):
        ClusterConfig(kv=KVConfig(block_size=0))


# ----------------------------------------------------------------------- steady_state
@pytest.mark.parametrize("make", PRESETS[:2])
@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_steady_state_reports_a_consistent_step(make, phase):
    cfg = make()
    out = steady_state(cfg, phase)
    assert tuple(out["breakdown"]) == BREAKDOWN
    assert sum(out["breakdown"].values()) == pytest.approx(out["step_s"], rel=1e-9)
    unit = cfg.unit(phase)
    if phase == "prefill":
        assert out["tok_s_per_node"] == pytest.approx(
            unit.gpus_per_node * unit.token_budget / out["step_s"], rel=1e-12
        )
    else:
        per_step = unit.max_running_requests * (1 + unit.mtp_draft_tokens * unit.mtp_acceptance)
        assert out["tok_s_per_node"] == pytest.approx(
            unit.gpus_per_node * per_step / out["step_s"], rel=1e-12
        )
        assert out["tpot_s"] == pytest.approx(
            out["step_s"] / (per_step / unit.max_running_requests)
        )
    # the same step through step_time(config=...)
    batch = (
        RankBatch.uniform("prefill", unit.num_gpus, tokens=unit.token_budget, context=4096)
        if phase == "prefill"
        else RankBatch.uniform(
            "decode",
            unit.num_gpus,
            tokens=unit.max_running_requests,
            context=4096,
            query_tokens=1 + unit.mtp_draft_tokens,
        )
    )
    assert step_time(phase, batch, config=cfg).total_s == pytest.approx(out["step_s"], rel=1e-12)


def test_steady_state_grows_with_batch_and_context_and_takes_a_placement():
    cfg = ClusterConfig.sglang_96xh100()
    a = steady_state(cfg, "decode", batch=64, kv_tokens=1024)
    b = steady_state(cfg, "decode", batch=128, kv_tokens=1024)
    c = steady_state(cfg, "decode", batch=128, kv_tokens=4096)
    assert a["step_s"] < b["step_s"] < c["step_s"]
    assert a["tok_s_per_node"] < b["tok_s_per_node"]
    p1 = steady_state(cfg, "prefill", input_tokens=1024)
    p4 = steady_state(cfg, "prefill", input_tokens=4096)
    assert p4["step_s"] > p1["step_s"]
    cached = steady_state(cfg, "prefill", input_tokens=1024, kv_tokens=3072)
    assert cached["step_s"] > p1["step_s"]
    assert cached["input_tok_s_per_node"] == pytest.approx(4 * cached["tok_s_per_node"])
    rng = np.random.default_rng(0)
    topo = cfg.topology("decode")
    rows = [rng.permutation(np.r_[np.arange(256), np.arange(32)]) for _ in range(58)]
    from eplb.placement import Placement

    placement = Placement(np.array(rows), 256, topo).validate()
    load = rng.gamma(0.3, 1.0, (58, 256))
    placed = steady_state(cfg, "decode", batch=128, kv_tokens=1024, placement=placement, load=load)
    assert placed["step_s"] > b["step_s"] and placed["breakdown"]["ep_wait"] > 0
    assert placed["gpu_load_max_over_mean"] > 1


def test_steady_state_bad_arguments():
    cfg = ClusterConfig.deepseek_day6()
    for kwargs, msg in [
        (dict(phase="decode", input_tokens=10), "decode takes kv_tokens="),
        (dict(phase="decode", batch=0), "batch must be a positive integer"),
        (dict(phase="prefill", input_tokens=-1), "input_tokens must be a positive"),
        (dict(phase="prefill", load=np.ones((58, 256))), "load needs a placement"),
        (dict(phase="train"), "phase must be"),
    ]:
        with pytest.raises(InputError, match=msg):
            steady_state(cfg, **kwargs)
    with pytest.raises(InputError, match="config must be a ClusterConfig"):
        steady_state({"hardware": "h800"}, "prefill")


def test_unit_topology_and_step_model_from_config():
    cfg = ClusterConfig.deepseek_day6()
    topo = cfg.topology("decode")
    assert (topo.num_nodes, topo.gpus_per_node, topo.slots_per_gpu) == (18, 8, 2)
    sm = StepModel("decode", topo, model=cfg.model_spec, hardware=cfg.hardware_spec)
    batch = RankBatch.uniform("decode", 144, tokens=64, context=2048)
    assert (
        sm.time(batch).total_s
        == step_time("decode", batch, config=cfg, micro_batches=2, dispatch="even").total_s
    )
    assert replace(cfg.decode, count=3).count == 3


def test_docs_state_the_initial_placement_default(tmp_path):
    """docs/serving.md names ``eplb.initial``'s default, and what it says about a fresh block
    against one replaced from the Day-6 preset (which sets ``history``) holds."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "serving.md").read_text("utf-8")
    default = EplbConfig().initial
    assert f"`eplb.initial`: `{default}` (the default;" in doc
    assert f"`EplbConfig.initial` (`{default}`, the default |" in doc
    day6 = ClusterConfig.deepseek_day6().eplb
    assert replace(day6, solver="greedy").initial == "history" != default
    assert EplbConfig(solver="greedy").initial == default
    path = tmp_path / "c.toml"
    path.write_text('[eplb]\nsolver = "greedy"\n')
    assert ClusterConfig.from_toml(path).eplb.initial == default
