"""The EP balancer matters by the amount the model says, on real DeepSeek-V3 counts
(../shared/traces/deepseek-v3-sglang; skipped when absent).

- Making a placement worse one swap at a time (the hottest GPU takes a heavier slot) raises
  its max GPU receive load in every layer; the step time never falls.
- A balanced (DeepSeek EPLB) and an adversarial placement differ by exactly the MoE +
  all-to-all + EP-wait time the model predicts, and by what an independent per-layer loop
  (`Placement.slot_load`, DeepGEMM's table, `evaluation.traffic.simulate`) computes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from eplb import solvers, traces
from eplb.evaluation.serving import RankBatch, StepModel
from eplb.evaluation.serving.config import hardware as hw
from eplb.evaluation.serving.config.hardware import COMBINE_BYTES, DISPATCH_BYTES
from eplb.evaluation.traffic import simulate
from eplb.placement import Placement
from eplb.topology import Topology

TOPO = Topology(4, 8, 9)  # SGLang's and DeepSeek's prefill unit: EP32, 288 slots
REL = 1e-9
EP_PARTS = ("moe", "comm_exposed", "ep_wait")
DP_PARTS = ("attention", "shared_expert", "dp_wait", "dense_layers", "lm_head", "overhead")


def real_load(files: list[Path], phase: str = "prefill") -> np.ndarray:
    pick = [f for f in files if f.name.startswith(phase)] or files
    named = [f for f in pick if "2048" in f.name or "2000" in f.name]
    return traces.read((named or pick)[0]).load()


def worse(placement: Placement, load: np.ndarray) -> Placement:
    """Per layer, swap the hottest GPU's lightest slot with the heaviest slot elsewhere."""
    S = TOPO.slots_per_gpu
    phy = placement.phy2log.copy()
    slot = placement.slot_load(load)
    g = placement.gpu_load(load).argmax(1)
    for layer in range(phy.shape[0]):
        mine = np.arange(g[layer] * S, (g[layer] + 1) * S)
        light = mine[slot[layer, mine].argmin()]
        others = np.setdiff1d(np.arange(phy.shape[1]), mine)
        heavy = others[slot[layer, others].argmax()]
        phy[layer, [light, heavy]] = phy[layer, [heavy, light]]
    return Placement(phy, placement.num_experts, TOPO).validate()


def adversarial(load: np.ndarray) -> Placement:
    """Hottest experts packed together, the 32 coldest duplicated."""
    hot = np.argsort(-load, axis=1, kind="stable")
    return Placement(np.concatenate([hot, hot[:, -32:]], axis=1), 256, TOPO).validate()


def test_step_time_monotone_in_max_gpu_receive_load(deepseek_jsons):
    for phase in ("prefill", "decode"):
        load = real_load(deepseek_jsons, phase)
        sm = StepModel(phase, TOPO, hardware=hw.h100)
        batch = RankBatch.uniform(
            phase,
            32,
            tokens=16384 if phase == "prefill" else 256,
            context=4096 if phase == "prefill" else 2048,
        )
        placement = solvers.solve("deepseek", load, TOPO, num_groups=8)
        prev_load = prev = None
        for _ in range(8):
            res = sm.time(batch, placement, load)
            gmax = res.gpu_load_max
            if prev is not None:
                assert np.all(gmax > prev_load)  # every layer's hottest GPU got hotter
                assert np.all(res.layer_s >= prev.layer_s * (1 - REL))
                assert res.total_s >= prev.total_s * (1 - REL)
                assert res.breakdown["ep_wait"] >= prev.breakdown["ep_wait"] * (1 - REL)
            prev_load, prev = gmax, res
            placement = worse(placement, load)
        assert prev.total_s > sm.time(batch).total_s


def _oracle_layers(
    sm: StepModel, placement: Placement, load: np.ndarray, tokens: float
) -> np.ndarray:
    """Independent per-layer loop: MoE-layer seconds of a uniform prefill batch."""
    fit, mb = sm.hardware.fit, 2
    f = sm.hardware.sms / (sm.hardware.sms - sm.hardware.comm_sms)
    a1, a2, sh = (
        x[0] for x in sm.rank.stages(RankBatch.uniform("prefill", 32, tokens=tokens, context=4096))
    )
    A = f * (a1 + a2 + sh + fit.layer_overhead_s)
    rows = sorted(hw.DEEPGEMM_GROUPED)
    xs = [np.log2(r[0]) for r in rows]
    picks = load / load.sum(1, keepdims=True) * (8 * 32 * tokens / mb)
    slot = placement.slot_load(picks)
    rep = simulate(
        placement,
        load=picks,
        hidden=7168,
        dispatch_bytes=DISPATCH_BYTES,
        combine_bytes=COMBINE_BYTES,
        top_k=8,
        num_groups=8,
        topk_groups=4,
        keep_slots=False,
    )
    out = []
    for layer in range(load.shape[0]):
        gpu_s = np.zeros(32)
        for p in range(288):
            m = slot[layer, p]
            if m <= 0:
                continue
            mm = max(m, 64.0)
            gu = np.interp(np.log2(mm), xs, [r[1] for r in rows]) * 1e12 * fit.grouped_scale
            dn = np.interp(np.log2(mm), xs, [r[2] for r in rows]) * 1e12 * fit.grouped_scale
            gpu_s[p // 9] += mm * (2 * 2 * 2048 * 7168 / gu + 2 * 7168 * 2048 / dn)
        M = f * gpu_s.max()
        nv = max(rep.nvlink_out[layer].max(), rep.nvlink_in[layer].max())
        rd = max(rep.rdma_out[layer].max(), rep.rdma_in[layer].max())
        d = max(nv / sm.comm.bw_nv[0], rd / sm.comm.bw_rd[0])
        scale = COMBINE_BYTES / DISPATCH_BYTES
        c = max(nv * scale / sm.comm.bw_nv[1], rd * scale / sm.comm.bw_rd[1])
        out.append(max(A, d) + max(M, d) + max(M, c) + max(A, c))
    return np.array(out)


def test_balanced_vs_adversarial_differ_by_predicted_moe_and_comm(deepseek_jsons):
    load = real_load(deepseek_jsons, "prefill")
    sm = StepModel("prefill", TOPO, hardware=hw.h100)
    tokens = 16384.0
    batch = RankBatch.uniform("prefill", 32, tokens=tokens, context=4096)
    good = solvers.solve("deepseek", load, TOPO, num_groups=8)
    bad = adversarial(load)
    rg, rb = sm.time(batch, good, load), sm.time(batch, bad, load)
    assert rb.total_s > 1.2 * rg.total_s  # packing the hot experts together costs a lot
    for key in DP_PARTS:  # the rank side does not see the placement
        assert rb.breakdown[key] == pytest.approx(rg.breakdown[key], rel=REL, abs=1e-12)
    predicted = sum(rb.breakdown[k] - rg.breakdown[k] for k in EP_PARTS)
    assert rb.total_s - rg.total_s == pytest.approx(predicted, rel=REL)
    # the same difference from an independent per-layer loop
    og, ob = _oracle_layers(sm, good, load, tokens), _oracle_layers(sm, bad, load, tokens)
    np.testing.assert_allclose(rg.layer_s, og, rtol=REL)
    np.testing.assert_allclose(rb.layer_s, ob, rtol=REL)
    assert rb.total_s - rg.total_s == pytest.approx(ob.sum() - og.sum(), rel=REL)
