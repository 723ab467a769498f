"""Benchmark: the ``lp`` dispatch policy's per-batch solve against a generic LP (scipy HiGHS).

Workload: the bundled DeepSeek-V3-calibrated trace (58 MoE layers x 256 experts), 4 nodes x 8
GPUs x 9 slots (32 redundant), placements solved on window 0 by ``greedy`` and by ``robust``
with ``layout="ring"`` (the layout made for ``lp``); one batch per layer of ``--tokens``
tokens (default 16,384) x top-8 drawn from window 1's shares (Gumbel top-k: distinct experts
per token), sources spread evenly over the 32 GPUs.

Timed per layer (best of ``--repeat`` runs, interleaved):

- ``split``: `eplb.dispatch.minmax.split`, what ``lp`` solves per batch: the exact min-max
  integer split (Newton on max-flow cuts, OR-Tools) and which source node's picks take which
  replica (node-local first);
- ``highs``: scipy's HiGHS on the LP of the same min-max split (no locality stage, so it does
  less); the baseline, measured in the same process. Its optimum rounded up must equal
  ``split``'s (checked on every layer before anything is printed);
- ``route lp``: the whole ``lp`` routing of the batch (`eplb.dispatch.route`: pick
  counts, `split`, the per-source plan, a slot for each of the ``tokens x 8`` picks), and
  ``route even`` for reference.

Prints per-layer median and worst milliseconds, the sum over all 58 layers (one batch through
the whole model: a layer's batch is known only once its gate has run, so layers are solved one
after another; the sum is the overhead per forward step on one core), and the ratio to
``split``. Target (issue 14): one batch of 16,384 tokens x top-8 on 32 GPUs in <= 20 ms.

    python benchmarks/bench_dispatch.py [--tokens 16384] [--repeat 5] [--layers 58]
"""

from __future__ import annotations

import argparse
import time
from functools import partial
from pathlib import Path

import numpy as np

from eplb import Topology, solvers, traces
from eplb.dispatch import minmax, route

BUNDLED = Path(__file__).resolve().parents[1] / "traces" / "data" / "deepseek-v3-calibrated.npz"


def batch(share: np.ndarray, tokens: int, top_k: int, rng: np.random.Generator) -> np.ndarray:
    """``int64[tokens, top_k]`` distinct experts per token, Gumbel top-k over ``log share``."""
    score = np.log(np.maximum(share, 1e-300)) + rng.gumbel(size=(tokens, share.size))
    return np.argpartition(-score, top_k - 1, axis=1)[:, :top_k]


def instance(placement, layer: int, ids: np.ndarray, rank: np.ndarray):
    """The split problem ``lp`` solves for this batch (as `routing._plan` builds it)."""
    topo = placement.topology
    G, E, S, N = topo.num_gpus, placement.num_experts, topo.slots_per_gpu, topo.num_nodes
    held = np.zeros((E, G), dtype=bool)
    held[placement.phy2log[layer], np.arange(topo.num_slots) // S] = True
    amounts = np.zeros((G, E), dtype=np.int64)
    np.add.at(amounts, (np.repeat(rank, ids.shape[1]), ids.ravel()), 1)
    ngpu = held.sum(1)
    flex, single = np.nonzero(ngpu >= 2)[0], np.nonzero(ngpu == 1)[0]
    fixed = np.bincount(held[single].argmax(1), amounts[:, single].sum(0), minlength=G)
    arc_j, arc_g = np.nonzero(held[flex])
    per_node = np.zeros((N, flex.size), dtype=np.int64)
    np.add.at(per_node, topo.node_of_gpu, amounts[:, flex])
    return amounts[:, flex].sum(0), fixed.astype(np.int64), arc_j, arc_g, per_node.T


def best_of(fn, repeat: int) -> tuple[float, object]:
    best, out = np.inf, None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--layers", type=int, default=58)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    trace = traces.read(BUNDLED)
    trace = trace.select(layers=trace.layer_ids[: args.layers])
    topo = Topology(4, 8, 9)
    G, K = topo.num_gpus, 8
    rng = np.random.default_rng(args.seed)
    share = trace.counts[1] / trace.counts[1].sum(-1, keepdims=True)
    ids = [batch(share[layer], args.tokens, K, rng) for layer in range(trace.num_layers)]
    rank = np.arange(args.tokens) * G // args.tokens
    placements = {
        "greedy": solvers.solve("greedy", trace.load(0), topo),
        "robust ring": solvers.solve("robust", trace.counts[:1], topo, layout="ring"),
    }
    print(f"{args.tokens} tokens x top-{K} per layer, {G} GPUs ({topo.num_nodes} x "
          f"{topo.gpus_per_node}), {topo.num_slots} slots, {trace.num_layers} layers; "
          f"best of {args.repeat} runs")
    print(f"{'placement':<12} {'what':<10} {'median ms':>10} {'worst ms':>9} "
          f"{'all layers ms':>14} {'vs split':>9}")
    for name, p in placements.items():
        times = {k: [] for k in ("split", "highs", "route lp", "route even")}
        for layer in range(trace.num_layers):
            demand, fixed, aj, ag, per_node = instance(p, layer, ids[layer], rank)
            t_split, (T, _) = best_of(partial(minmax.split, demand, fixed, aj, ag,
                                              source_nodes=per_node,
                                              gpu_node=topo.node_of_gpu), args.repeat)
            t_lp, (t_opt, _) = best_of(partial(minmax.split_lp, demand, fixed, aj, ag),
                                       args.repeat)
            if int(np.ceil(t_opt - 1e-6)) != T:
                raise SystemExit(f"layer {layer}: split {T} != HiGHS {t_opt}")
            t_route, slots = best_of(partial(route, ids[layer], p, layer_index=layer,
                                             policy="lp", token_rank=rank), args.repeat)
            if np.bincount(slots.ravel() // topo.slots_per_gpu, minlength=G).max() != T:
                raise SystemExit(f"layer {layer}: routed max differs from the split's {T}")
            t_even, _ = best_of(partial(route, ids[layer], p, layer_index=layer, policy="even"),
                                args.repeat)
            for k, v in (("split", t_split), ("highs", t_lp), ("route lp", t_route),
                         ("route even", t_even)):
                times[k].append(v * 1e3)
        base = np.sum(times["split"])
        for k, v in times.items():
            v = np.array(v)
            print(f"{name:<12} {k:<10} {np.median(v):>10.2f} {v.max():>9.2f} {v.sum():>14.1f} "
                  f"{v.sum() / base:>8.1f}x")


if __name__ == "__main__":
    main()
