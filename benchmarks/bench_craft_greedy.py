"""``craft`` against ``greedy`` on the same slots, on the real dumps (issue 36, target 5).

For every real dump (the six DeepSeek-V3 SGLang count files and the Qwen1.5-MoE per-rank
folder in ``$EPLB_DATA`` or ``../shared/traces``, plus the bundled calibrated trace) and every
topology of the peers benchmark (4x8:288, 18x8:288, 8x8:320), in one process:

- every slot used (``craft`` at its default ``redundancy=1``) against ``greedy``: the layers
  where ``craft``'s max GPU load is above ``greedy``'s (beyond ``1e-12`` relative), the worst
  per-layer ratio and the ratio of the sums over layers (greedy / craft: above 1 is craft
  better);
- equal memory: ``craft`` with ``max_gpu_slots = L * S'`` (every GPU keeps at most ``S'``
  experts per layer on average) against ``greedy`` on ``S'`` slots per GPU, for each ``S'``
  from the fewest that hold the experts to ``S - 1``: the ratio of the sums;
- fewer slots (``--budgets``, redundant slots per layer on average): ``craft`` at ``L * (E +
  N)`` used slots against ``greedy`` with every slot (``greedy / craft``: how much of greedy's
  balance craft keeps with fewer slots) and against uniform replication with craft's packer
  at the same budget (``uniform / craft``, the ratio docs/solvers.md's craft table reports).

Target: no layer worse with every slot used, every sum ratio ``<= 1`` at equal memory.
Run: ``python benchmarks/bench_craft_greedy.py`` (numbers in docs/solvers.md, "craft").
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from eplb import Topology, solvers, traces
from eplb.data_dirs import traces_dir

ROOT = Path(__file__).resolve().parents[1]
SHARED = traces_dir()  # $EPLB_DATA or ../shared/traces (docs/data.md)
TOPOLOGIES = {"4x8:288": Topology(4, 8, 9), "18x8:288": Topology(18, 8, 2),
              "8x8:320": Topology(8, 8, 5)}


def dumps() -> dict[str, np.ndarray]:
    """``name -> load: float64[L, E]`` of every real dump found (MoE layers only)."""
    out = {}
    for f in sorted((SHARED / "deepseek-v3-sglang").glob("*.json")):
        out[f.stem] = traces.read(f).load()
    qwen = SHARED / "qwen1.5-moe-harmoeny"
    if qwen.is_dir():
        out["qwen1.5-moe"] = traces.read(qwen).load()
    out["calibrated (bundled)"] = traces.read(ROOT / "traces" / "data" /
                                              "deepseek-v3-calibrated.npz").load()
    return {k: v[v.sum(1) > 0] for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", help="topology names (default: all)")
    ap.add_argument("--budgets", default="8,16",
                    help="redundant slots per layer on average for the fewer-slots rows")
    args = ap.parse_args()
    budgets = [int(x) for x in args.budgets.split(",") if x]
    loads = dumps()
    print(f"{len(loads)} dumps: {', '.join(loads)}")
    print("full: every slot used; worse: layers where craft's max GPU load > greedy's; "
          "sum: greedy / craft summed over layers (>= 1: craft no worse); memory S': "
          "craft with max_gpu_slots = L*S' vs greedy on S' slots per GPU (sum ratio); "
          "time: craft / greedy seconds")
    worst_layers, worst_mem = 0, np.inf
    for tname, topo in TOPOLOGIES.items():
        if args.only and tname not in args.only:
            continue
        print(f"\n{tname} ({topo})")
        for name, load in loads.items():
            L, E = load.shape
            S, G = topo.slots_per_gpu, topo.num_gpus
            t0 = time.process_time()
            g = solvers.solve("greedy", load, topo).gpu_load(load).max(1)
            t1 = time.process_time()
            c = solvers.solve("craft", load, topo).gpu_load(load).max(1)
            t2 = time.process_time()
            worse = c > g * (1 + 1e-12)
            worst_layers = max(worst_layers, int(worse.sum()))
            mem = []
            for s in range(max(1, -(-E // G)), S):
                small = Topology(topo.num_nodes, topo.gpus_per_node, s)
                gs = solvers.solve("greedy", load, small).gpu_load(load).max(1).sum()
                cs = solvers.solve("craft", load, topo, max_gpu_slots=L * s)
                ratio = gs / cs.gpu_load(load).max(1).sum()
                worst_mem = min(worst_mem, ratio)
                mem.append(f"S'={s}: {ratio:.5f}")
            fewer = []
            for n in budgets:
                if E + n >= topo.num_slots:
                    continue
                p = solvers.solve("craft", load, topo, total_slots=L * (E + n))
                cs = p.gpu_load(load).max(1).sum()
                fewer.append(f"N={n}: {g.sum() / cs:.5f} / "
                             f"{p.meta['solver']['uniform_objective_sum'] / cs:.5f}")
            print(f"  {name:24s} worse {int(worse.sum()):2d}/{L}  worst layer "
                  f"{(c / g).max():.5f}  sum {g.sum() / c.sum():.5f}  "
                  f"time {(t2 - t1) / max(t1 - t0, 1e-9):5.1f}x  "
                  f"memory {'; '.join(mem) or '-'}  "
                  f"fewer slots (greedy all / craft, uniform / craft) {'; '.join(fewer) or '-'}")
    print(f"\nmost layers worse on one dump: {worst_layers}; smallest equal-memory sum ratio: "
          f"{worst_mem:.5f} (target: 0 layers, >= 1)")


if __name__ == "__main__":
    main()
