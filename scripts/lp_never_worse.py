"""Is ``lp`` dispatch with no overhead ever slower than ``even`` split, step by step? (issue 21
target "never worse before overheads"). Writes the table in docs/serving.md ("When lp with no
overhead is slower than even").

Per setting (DeepSeek's Day-6 units on H800; SGLang's blog setting, 2 x 8 GPUs with the h100
preset and 32 redundant experts) and tokens (prefill) or requests (decode) per rank: `deepseek`
placement on the phase's SGLang count file, steps whose picks are drawn from it (multinomial,
top-8 x tokens per layer, as the paper's E8), each timed by `StepModel.time_routed` under
``even`` and under ``lp`` with ``lp_overhead_s=0``, uniform batches. Counted: steps where lp is
slower, the worst step's gain, the same with the expert GEMM made linear in picks (each group's
seconds = picks x the real curve's seconds per pick at 512 picks), and steps where lp's busiest
GPU holds more picks than even's (the LP's own guarantee: must be 0). Then the mechanism on the
worst step's worst layer: the GPU that sets lp's expert time, its picks per slot (group) under
both splits and their seconds on the real curve.

Run: ``python scripts/lp_never_worse.py`` (``--check``: fail when docs/serving.md differs from
this run; ``--steps N``: steps per point, default 4).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from docblock import update_doc

from eplb import solvers, traces
from eplb.data_dirs import traces_dir
from eplb.evaluation import serving
from eplb.evaluation.serving import RankBatch, StepModel
from eplb.evaluation.serving.config.hardware import get_hardware
from eplb.evaluation.serving.steptime.curves import LinearCurve
from eplb.topology import Topology

ROOT = Path(__file__).resolve().parent.parent
DUMPS = traces_dir() / "deepseek-v3-sglang"
DOC = ROOT / "docs" / "serving.md"
TOKENS = {"decode": (4, 32, 128, 256), "prefill": (256, 512, 1024, 4096)}
STEM = {"decode": "decode_in1000out1000", "prefill": "prefill_in1024"}


def settings() -> list[tuple[str, str, Topology, str]]:
    day6 = serving.ClusterConfig.deepseek_day6()
    rows = [("Day-6", ph, day6.topology(ph), "h800") for ph in ("prefill", "decode")]
    rows += [("SGLang 2x8 +32", ph, Topology(2, 8, (256 + 32) // 16), "h100")
             for ph in ("prefill", "decode")]
    return rows


def _models(phase, topo, hw, linear: bool):
    ev = StepModel(phase, topo, hardware=hw)
    lp = StepModel(phase, topo, hardware=hw, dispatch="lp", lp_overhead_s=0.0)
    if linear:
        c = float(ev.gpu.expert.seconds(512.0)) / 512.0
        ev.gpu.expert = lp.gpu.expert = LinearCurve(c)
    return ev, lp


def study(steps: int = 4, seed: int = 0) -> tuple[list[dict], dict]:
    """Rows of the table, and the worst step's numbers (see the module docstring)."""
    rows, worst = [], {"gain": 0.0}
    for label, phase, topo, hw_name in settings():
        load = traces.read(DUMPS / f"{STEM[phase]}.json").load()
        prob = load / load.sum(1, keepdims=True)
        p = solvers.solve("deepseek", load, topo, num_groups=8)
        hw = get_hardware(hw_name)
        real, lin = _models(phase, topo, hw, False), _models(phase, topo, hw, True)
        r_real = [sm.prepare(p, load) for sm in real]
        r_lin = [sm.prepare(p, load) for sm in lin]
        rng = np.random.default_rng(seed)
        G, K = topo.num_gpus, real[0].model.top_k
        for tok in TOKENS[phase]:
            batch = RankBatch.uniform(phase, G, tokens=tok,
                                      context=1024 if phase == "prefill" else 2000)
            slower = slower_lin = above = 0
            gains = []
            for _ in range(steps):
                d = rng.multinomial(int(K * tok * G), prob).astype(float)
                a, b = (sm.time_routed(batch, r, d, picks=True)
                        for sm, r in zip(real, r_real, strict=True))
                al, bl = (sm.time_routed(batch, r, d, picks=True)
                          for sm, r in zip(lin, r_lin, strict=True))
                g = 100.0 * (a.total_s / b.total_s - 1.0)
                gains.append(g)
                slower += b.total_s > a.total_s * (1 + 1e-12)
                slower_lin += bl.total_s > al.total_s * (1 + 1e-12)
                above += bool((b.gpu_load_max > a.gpu_load_max * (1 + 1e-9)).any())
                if g < worst["gain"]:
                    worst = {"gain": g, "label": label, "phase": phase, "tokens": tok,
                             "even": a, "lp": b, "model": real[1], "routed": r_real[1],
                             "even_model": real[0], "even_routed": r_real[0], "load": d,
                             "batch": batch, "placement": p}
            rows.append({"setting": label, "phase": phase, "per_rank": tok, "steps": steps,
                         "slower": slower, "worst_pct": min(gains), "slower_lin": slower_lin,
                         "above": above})
    return rows, worst


def mechanism(w: dict) -> str:
    """The worst step's worst layer: the GPU setting lp's expert time, its groups' picks."""
    lp, ev = w["model"], w["even_model"]
    a, b = w["even"], w["lp"]
    layer = int(np.argmax(b.layer_s - a.layer_s))
    mb = lp.micro_batches
    slots = {}
    for name, sm, r in (("even", ev, w["even_routed"]), ("lp", lp, w["routed"])):
        slots[name] = sm.routing.slot_picks(r, w["load"], 1.0 / mb)[layer]
    S = lp.topology.slots_per_gpu
    curve = lp.gpu.expert
    sec = {k: curve.seconds(v).reshape(-1, S).sum(1) for k, v in slots.items()}
    picks = {k: v.reshape(-1, S).sum(1) for k, v in slots.items()}
    g = int(np.argmax(sec["lp"]))

    def groups(v):
        return ", ".join(f"{x:.0f}" for x in v.reshape(-1, S)[g] if x > 0)

    pts = ", ".join(f"{1e6 * float(curve.seconds(float(m))):.1f} us at {m}"
                    for m in (64, 128, 256, 512))
    return (
        f"Worst step: {w['label']} {w['phase']}, {w['tokens']} per rank, lp "
        f"{1e3 * b.total_s:.3f} ms against even {1e3 * a.total_s:.3f} ms "
        f"({w['gain']:+.3f}%). Its worst layer ({layer}), one micro-batch: the busiest GPU "
        f"holds {picks['lp'].max():.0f} picks under lp against {picks['even'].max():.0f} under "
        f"even, but its expert time is {1e6 * sec['lp'].max():.1f} us against "
        f"{1e6 * sec['even'].max():.1f} us. The GPU that sets lp's time (GPU {g}) runs groups "
        f"of {groups(slots['lp'])} picks ({picks['lp'][g]:.0f}, {1e6 * sec['lp'][g]:.1f} us) "
        f"where even gave it {groups(slots['even'])} ({picks['even'][g]:.0f}, "
        f"{1e6 * sec['even'][g]:.1f} us). The grouped-GEMM curve per expert: {pts} picks."
    )


def table(steps: int) -> str:
    rows, worst = study(steps)
    head = ("| setting | phase | per rank | steps | lp slower | worst step gain (%) | "
            "lp slower, linear GEMM | busiest GPU above even |\n|---|---|---:|---:|---:|---:|"
            "---:|---:|")
    body = [f"| {r['setting']} | {r['phase']} | {r['per_rank']} | {r['steps']} | {r['slower']} "
            f"| {r['worst_pct']:+.3f} | {r['slower_lin']} | {r['above']} |" for r in rows]
    return "\n".join([head, *body, "", mechanism(worst)])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="fail if docs/serving.md is stale")
    ap.add_argument("--steps", type=int, default=4, help="steps per point (default 4)")
    args = ap.parse_args(argv)
    if args.steps < 1:
        print("lp_never_worse: error: --steps must be >= 1", file=sys.stderr)
        return 2
    body = table(args.steps)
    print(body)
    return update_doc(DOC, {"lp-never-worse": body}, check=args.check, script="lp_never_worse.py")


if __name__ == "__main__":
    sys.exit(main())
