"""Benchmark: `steady_state` / `StepModel.time` against a per-layer Python-loop baseline.

For the two presets (DeepSeek Day-6 on H800: prefill EP32 with 16,384 tokens per rank at 4K
prompts, decode EP144 with 128 requests per rank at 4K context; SGLang 96 x H100: prefill EP32,
decode EP72 with 256 requests at 2K), times

1. ``steady_state(config, phase)`` with balanced routing (target: <= 50 ms each);
2. ``steady_state(config, phase, placement=..., load=...)`` with a `deepseek` placement of a
   calibrated DeepSeek-V3 load (`traces.synth.calibrated`) and that load routed through it;
3. the obvious implementation of the same placed step: a Python loop over the 58 MoE layers
   that, per layer, loops over ranks and GPUs (per-slot grouped-GEMM seconds, picks per GPU)
   and calls `evaluation.traffic.simulate` on a one-layer placement for the all-to-all bytes.

The loop's total is checked against the vectorised one (relative 1e-9) before any time is
printed; the ratio is loop seconds / vectorised seconds.

    python benchmarks/bench_serving_steptime.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import numpy as np

from eplb import solvers
from eplb.evaluation.serving import ClusterConfig, RankBatch, StepModel, steady_state
from eplb.evaluation.serving.config.hardware import COMBINE_BYTES, DISPATCH_BYTES
from eplb.evaluation.serving.results.steady import DEFAULT_INPUT_TOKENS
from eplb.evaluation.traffic import simulate
from eplb.placement import Placement
from eplb.traces import synth


def best(fn, repeat: int) -> tuple[float, object]:
    out, times = None, []
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def loop_step(sm: StepModel, batch: RankBatch, placement: Placement, load: np.ndarray) -> float:
    """Seconds of one step, layer by layer, rank by rank, GPU by GPU (uniform sources)."""
    m, topo, hw = sm.model, sm.topology, sm.hardware
    G, S, K, mb = topo.num_gpus, topo.slots_per_gpu, m.top_k, sm.micro_batches
    o = hw.fit.layer_overhead_s
    src = batch.tokens / mb
    a1 = [float(sm.rank.mla.seconds(src[r])) for r in range(G)]
    a2 = list(sm.rank.stages(batch)[1])
    sh = [m.shared_experts * float(sm.rank.ffn.seconds(src[r])) for r in range(G)]
    total = 0.0
    for layer in range(m.moe_layers):
        row = load[layer] / load[layer].sum() * K * src.sum()
        one = Placement(placement.phy2log[layer : layer + 1], m.num_experts, topo)
        slot = one.slot_load(row[None])[0]
        gpu_s, recv = [], []
        for g in range(G):
            gpu_s.append(sum(float(sm.gpu.expert.seconds(slot[g * S + s])) for s in range(S)))
            recv.append(sum(slot[g * S + s] for s in range(S)))
        if sm.phase == "decode":
            picks = max(max(K * src), max(recv))
            d, c = picks * sm.comm.ll[0], picks * sm.comm.ll[1]
        else:
            rep = simulate(
                one,
                load=row[None],
                hidden=m.hidden,
                dispatch_bytes=DISPATCH_BYTES,
                combine_bytes=COMBINE_BYTES,
                top_k=K,
                num_groups=m.num_groups,
                topk_groups=m.topk_groups,
                keep_slots=False,
            )
            per = m.hidden * DISPATCH_BYTES
            nv = max(rep.nvlink_out[0].max(), rep.nvlink_in[0].max()) / per * m.hidden
            rd = max(rep.rdma_out[0].max(), rep.rdma_in[0].max()) / per * m.hidden
            d = max(nv * DISPATCH_BYTES / sm.comm.bw_nv[0], rd * DISPATCH_BYTES / sm.comm.bw_rd[0])
            c = max(nv * COMBINE_BYTES / sm.comm.bw_nv[1], rd * COMBINE_BYTES / sm.comm.bw_rd[1])
        layer_s = sm.assembly.layer(
            np.array(a1),
            np.array(a2),
            np.array(sh),
            o,
            np.array([gpu_s]),
            np.array([d]),
            np.array([c]),
        )
        total += float(layer_s[0])
    dense = [
        m.dense_layers * mb * (a1[r] + a2[r] + float(sm.rank.dense_ffn.seconds(src[r])) + o)
        for r in range(G)
    ]
    head = sm.rank.head(batch.logits)
    return total + max(dense) + float(head.max()) + hw.fit.step_overhead_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    load = synth.calibrated(windows=1, tokens=16384 * 32, seed=0).load()  # [58, 256]
    print(
        f"{'preset':16s} {'phase':8s} {'balanced':>10s} {'placed':>10s} {'loop':>10s} "
        f"{'loop/placed':>11s}  step (balanced -> placed)"
    )
    for cfg in (ClusterConfig.deepseek_day6(), ClusterConfig.sglang_96xh100()):
        for phase in ("prefill", "decode"):
            unit = cfg.unit(phase)
            topo = cfg.topology(phase)
            placement = solvers.solve("deepseek", load, topo, num_groups=8)
            t_bal, bal = best(partial(steady_state, cfg, phase), args.repeat)
            t_pl, placed = best(
                partial(steady_state, cfg, phase, placement=placement, load=load), args.repeat
            )
            sm = StepModel(
                phase,
                topo,
                model=cfg.model_spec,
                hardware=cfg.hardware_spec,
                dispatch=cfg.dispatch,
                micro_batches=unit.micro_batches,
            )
            if phase == "prefill":
                batch = RankBatch.uniform(
                    "prefill", unit.num_gpus, tokens=unit.token_budget, context=DEFAULT_INPUT_TOKENS
                )
            else:
                batch = RankBatch.uniform(
                    "decode",
                    unit.num_gpus,
                    tokens=unit.max_running_requests,
                    context=4096,
                    query_tokens=1 + unit.mtp_draft_tokens,
                )
            t_loop, loop_total = best(
                partial(loop_step, sm, batch, placement, load), max(1, args.repeat // 2)
            )
            if not np.isclose(loop_total, placed["step_s"], rtol=1e-9):
                raise SystemExit(
                    f"loop {loop_total} != vectorised {placed['step_s']} ({cfg.name} {phase})"
                )
            print(
                f"{cfg.name:16s} {phase:8s} {t_bal * 1e3:8.2f}ms {t_pl * 1e3:8.2f}ms "
                f"{t_loop * 1e3:8.1f}ms {t_loop / t_pl:10.0f}x  "
                f"{bal['step_s'] * 1e3:.1f} -> {placed['step_s'] * 1e3:.1f} ms"
            )


if __name__ == "__main__":
    main()
