"""``craft`` (per-layer replica budgets) against uniform replication at the same slot budget
on the bundled trace: the sum over layers of the max GPU load (the MoE part of a step's
time). Each plan is made on one window's load and evaluated on it and on the next window
(held out); uniform uses the same packer with ``R`` redundant slots in every layer.

Run: ``python benchmarks/bench_craft.py`` (numbers in docs/solvers.md, "craft").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tqdm import tqdm

from eplb import Placement, Topology
from eplb.evaluation.serving.config import ClusterConfig
from eplb.evaluation.serving.config.budget import kv_capacity_for_slots
from eplb.solvers.primitives.replica_budget import (
    balance_memory,
    expert_slots_per_gpu,
    layer_curves,
    split_budget,
)

TRACE = Path(__file__).resolve().parents[1] / "traces" / "data" / "deepseek-v3-calibrated.npz"
REDUNDANT = (8, 16, 32)


def main() -> None:
    counts = np.load(TRACE)["counts"].astype(np.float64)  # [W, L, E]
    # Day-6 prefill (EP32, 9 slots per GPU) and decode (EP144, 2 slots per GPU), 288 slots
    for topo, step in ((Topology(4, 8, 9), 4), (Topology(18, 8, 2), 8)):
        run(counts, topo, step)


def run(counts: np.ndarray, topo: Topology, step: int) -> None:
    """Plan on every ``step``-th window, evaluate on it and on the next."""
    W, L, E = counts.shape
    S, rows = topo.slots_per_gpu, np.arange(L)
    print(f"trace {TRACE.name}: {W} windows, {L} layers, {E} experts; topology {topo}")
    day6 = ClusterConfig.deepseek_day6()
    decode = day6.unit("decode").topology() == topo
    gains = {r: ([], [], [], []) for r in REDUNDANT}  # in-sample, held-out, bound gap, slots
    for w in tqdm(range(0, W - 1, step), desc="windows"):
        plan, test = counts[w], counts[w + 1]
        curves = layer_curves(plan, topo.num_gpus, S)
        for red in REDUNDANT:
            split = split_budget(plan, curves, L * (E + red))
            mine = Placement(balance_memory(curves.phy2log[rows, split["k"]], S), E, topo)
            k_uni = np.full(L, red)
            uni = Placement(balance_memory(curves.phy2log[rows, k_uni], S), E, topo)
            held = uni.gpu_load(test).max(1).sum() / mine.gpu_load(test).max(1).sum()
            gains[red][0].append(split["uniform_objective"] / split["objective"])
            gains[red][1].append(held)
            gains[red][2].append(split["objective"] / split["bound"] - 1)
            gains[red][3].append(expert_slots_per_gpu(mine.phy2log, S))
    print("redundant/layer  gain in-sample (uniform/craft)  gain held-out  gap to bound  "
          "expert slots/GPU (of full)" + ("  Day-6 decode KV tokens/rank (full)" if decode else ""))
    full = L * topo.slots_per_gpu
    for red, (a, b, c, d) in gains.items():
        kv = ""
        if decode:
            kv = f"  {kv_capacity_for_slots(day6, 'decode', max(d), L):,} " \
                f"({kv_capacity_for_slots(day6, 'decode', full, L):,})"
        print(f"{red:15d}  {np.mean(a):29.5f}  {np.mean(b):13.5f}  {np.mean(c):12.2e}  "
              f"{max(d):13d} ({full}){kv}")
    print(f"(planned on windows {list(range(0, W - 1, step))}, held out: the next window)")


if __name__ == "__main__":
    main()
