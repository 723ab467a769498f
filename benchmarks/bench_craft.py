"""``craft`` (per-layer replica budgets) against uniform replication at the same slot budget
on the bundled trace: sum over layers of the max GPU load (the MoE part of a step's time),
planned on the first half of the windows and evaluated on the second half as well.

Run: ``python benchmarks/bench_craft.py`` (numbers in docs/solvers.md, "craft").
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from eplb import Topology, solvers
from eplb.solvers.policies.craft import replica_plan

TRACE = Path(__file__).resolve().parents[1] / "traces" / "data" / "deepseek-v3-calibrated.npz"


def main() -> None:
    counts = np.load(TRACE)["counts"].astype(np.float64)  # [W, L, E]
    W, L, E = counts.shape
    plan_load, test_load = counts[: W // 2].sum(0), counts[W // 2 :].sum(0)
    topo = Topology(4, 8, 9)  # 32 GPUs, 288 physical slots per layer (DeepSeek's EP32 + 32)
    print(f"trace {TRACE.name}: {W} windows, {L} layers, {E} experts; topology {topo}")
    print("redundant/layer  uniform_sum  craft_sum  gain(uniform/craft)  bound_sum  "
          "held-out gain  slots/GPU  seconds")
    for red in (8, 16, 24, 32):
        total = L * (E + red)
        start = time.perf_counter()
        plan = replica_plan(plan_load, topo, total_slots=total)
        secs = time.perf_counter() - start
        uni = solvers.solve("craft", plan_load, topo, total_slots=total)  # same solve, check
        assert np.array_equal(uni.phy2log, plan["phy2log"])
        # held out: the plan's placement and uniform's (same packer, uniform split) on later load
        from eplb.solvers.primitives.replica_budget import balance_memory, layer_curves

        curves = layer_curves(plan_load, topo.num_gpus, topo.slots_per_gpu)
        k_uni = np.full(L, min(red, curves.slots[-1] - E))
        p_uni = balance_memory(curves.phy2log[np.arange(L), k_uni], topo.slots_per_gpu)
        from eplb import Placement

        a = Placement(plan["phy2log"], E, topo).gpu_load(test_load).max(1).sum()
        b = Placement(p_uni, E, topo).gpu_load(test_load).max(1).sum()
        print(
            f"{red:15d}  {plan['uniform_objective']:11.0f}  {plan['objective']:9.0f}  "
            f"{plan['uniform_objective'] / plan['objective']:19.4f}  {plan['bound']:9.0f}  "
            f"{b / a:13.4f}  {plan['expert_slots_per_gpu']:9d}  {secs:7.1f}"
        )


if __name__ == "__main__":
    main()
