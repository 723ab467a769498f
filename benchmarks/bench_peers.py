"""Speed of eplb's `deepseek` and `greedy` against the EPLB policies serving engines run today,
side by side in one process (issue 22, section 3): vLLM's default policy and SGLang's
``deepseek`` and ``deepseek_vec``, as re-stated in `benchmarks/peers` (they need torch).

58 layers x 256 experts, 8 expert groups, one thread (torch and numpy's BLAS/OpenMP pools),
best of ``--repeat`` (5) milliseconds per solve through the public `solvers.solve`, on 4x8
GPUs / 288 slots (hierarchical), 18x8 / 288 (global: 8 groups on 18 nodes) and 8x8 / 320
(hierarchical). ``--clock cpu`` (the default) times this process's CPU, which on a shared
machine leaves out the waits for other processes; ``--clock wall`` the elapsed time. Before
timing, every port is checked against eplb's `deepseek` on the same input: the share of
layers with identical replica counts, and the worst per-layer ratio of max GPU load (1.0000 =
the same balance; ``deepseek_vec`` deals replicas to GPUs in snake order, not by balanced
packing, so its loads may differ).

Run: ``python benchmarks/bench_peers.py [--load FILE ...] [--repeat 5] [--skip-slow]
[--clock cpu|wall] [--write-doc]`` (``--write-doc`` puts the tables into docs/solvers.md)
(default loads: the bundled zipf-58x256 and, where ../shared/traces is present, the SGLang
DeepSeek-V3 prefill_in1024 and decode_in2000out100 dumps). ``--skip-slow`` leaves out SGLang's
``deepseek`` (seconds per solve: 0-d tensor arithmetic in a Python loop).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"  # before numpy and torch load their thread pools

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from eplb import Placement, Topology, solvers, traces  # noqa: E402
from eplb.data_dirs import traces_dir  # noqa: E402
from eplb.solvers.primitives.layout import max_load  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "scripts"))
from docblock import update_doc  # noqa: E402
from peers import sglang_deepseek, sglang_deepseek_vec, vllm_default  # noqa: E402

DOC = REPO / "docs" / "solvers.md"
SHARED = traces_dir() / "deepseek-v3-sglang"
BUNDLED = REPO / "traces" / "data" / "zipf-58x256.npz"
CONFIGS = [("4x8:288", Topology(4, 8, 9)), ("18x8:288", Topology(18, 8, 2)),
           ("8x8:320", Topology(8, 8, 5))]
GROUPS = 8
PEERS = {"vllm": vllm_default, "sgl_deepseek": sglang_deepseek, "sgl_vec": sglang_deepseek_vec}


CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}


def best_ms(fn, repeat: int, clock=time.process_time) -> float:
    """Best of ``repeat`` milliseconds of ``fn()`` on ``clock`` after one warm-up call."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        t = clock()
        fn()
        best = min(best, clock() - t)
    return best * 1e3


def peer_call(mod, load: np.ndarray, topo: Topology):
    return lambda: mod.rebalance(load, topo.num_slots, GROUPS, topo.num_nodes, topo.num_gpus)


def check(load: np.ndarray, topo: Topology, peers: dict) -> list[str]:
    """Per port: share of layers with eplb deepseek's replica counts, worst max-load ratio."""
    ref = solvers.solve("deepseek", load, topo, num_groups=GROUPS)
    ref_max = max_load(load, ref.phy2log, topo.slots_per_gpu)
    out = []
    for name, mod in peers.items():
        p = Placement(peer_call(mod, load, topo)(), load.shape[1], topo).validate()
        same = float((p.logcnt == ref.logcnt).all(1).mean())
        ratio = float((max_load(load, p.phy2log, topo.slots_per_gpu) / ref_max).max())
        out.append(f"{name}: counts same {same:.0%} of layers, max load x{ratio:.4f}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--load", type=Path, nargs="*")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--skip-slow", action="store_true")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                    help="cpu: this process's CPU time (default; one thread, so on a shared "
                    "machine it leaves out the waits for other processes), wall: elapsed time")
    ap.add_argument("--write-doc", action="store_true",
                    help=f"also write the tables into {DOC.relative_to(REPO)} between its "
                    "bench_peers markers")
    args = ap.parse_args()
    clock = CLOCKS[args.clock]
    md = [f"`python benchmarks/bench_peers.py --skip-slow --repeat {args.repeat} --clock "
          f"{args.clock} --write-doc`: best of {args.repeat} {args.clock} milliseconds per "
          f"solve, one thread, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f} at the start."]
    torch.set_num_threads(1)
    loads = args.load or [BUNDLED] + [
        f for f in (SHARED / "prefill_in1024.json", SHARED / "decode_in2000out100.json")
        if f.exists()
    ]
    peers = {k: v for k, v in PEERS.items() if not (args.skip_slow and k == "sgl_deepseek")}
    cols = ["deepseek", "greedy", *peers]
    for path in loads:
        load = traces.read(path).load()
        print(f"\n{path.name}: {load.shape[0]} layers x {load.shape[1]} experts, "
              f"{GROUPS} groups, 1 thread, best of {args.repeat} ({args.clock} ms), load average "
              f"{os.getloadavg()[0]:.1f}")
        print(f"{'config':<10}" + "".join(f"{c:>14}" for c in cols)
              + f"{'ds/fastest':>12}{'gr/vllm':>9}{'gr/vec':>8}")
        md += ["", f"{path.name} ({args.clock} ms):", "",
               "| config | " + " | ".join(cols) + " | deepseek / fastest port | greedy / vllm "
               "| greedy / sgl_vec |", "|---" * (len(cols) + 4) + "|"]
        notes = []
        for label, topo in CONFIGS:
            notes += [f"  {label} {n}" for n in check(load, topo, peers)]
            ms = {
                "deepseek": best_ms(
                    lambda t=topo, ld=load: solvers.solve("deepseek", ld, t, num_groups=GROUPS),
                    args.repeat, clock),
                "greedy": best_ms(
                    lambda t=topo, ld=load: solvers.solve("greedy", ld, t, num_groups=GROUPS),
                    args.repeat, clock),
            }
            for name, mod in peers.items():
                ms[name] = best_ms(peer_call(mod, load, topo), args.repeat, clock)
            fastest = min(ms[k] for k in peers)
            ratios = (ms["deepseek"] / fastest, ms["greedy"] / ms["vllm"],
                      ms["greedy"] / ms["sgl_vec"])
            print(f"{label:<10}" + "".join(f"{ms[c]:>14.1f}" for c in cols)
                  + f"{ratios[0]:>12.2f}{ratios[1]:>9.2f}{ratios[2]:>8.2f}")
            md.append(f"| {label} | " + " | ".join(f"{ms[c]:.1f}" for c in cols) + " | "
                      + " | ".join(f"{r:.2f}" for r in ratios) + " |")
        print("checks against eplb deepseek:")
        print("\n".join(notes))
    if args.write_doc:
        update_doc(DOC, {"bench_peers": "\n".join(md)}, check=False,
                   script="../benchmarks/bench_peers.py --write-doc")
        print(f"\nwrote the tables into {DOC.relative_to(REPO)}")


if __name__ == "__main__":
    main()
