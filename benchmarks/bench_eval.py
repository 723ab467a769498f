"""Benchmark: evaluation speed against baselines run in the same process.

1. Per-window scoring: `evaluation.metrics.score_windows` on 1,000 windows x 58 layers x 256
   experts (4 x 8 GPUs, 288 slots, one deepseek placement) vs a loop over windows calling
   ``Placement.gpu_load`` and the per-layer ratios (the obvious implementation). Target: < 1 s.
2. Token-level traffic: `evaluation.traffic.simulate` on 100,000 tokens x 58 layers x top-8 vs
   (a) routing alone (`eplb.dispatch.route` for every layer: the floor any exact count
   pays) and (b) a per-token Python loop doing the same accounting, timed on a few hundred
   tokens and scaled linearly. Target: a few seconds.
3. Counts-mode traffic (expectations) for the same load, 4x8 and 18x8 GPUs, both
   co-occurrence models.

Outputs are cross-checked before any time is printed (loop vs vectorised on the same tokens).

    python benchmarks/bench_eval.py [--windows 1000] [--tokens 100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from eplb import Topology, solvers
from eplb.dispatch import route
from eplb.evaluation.metrics import score_windows
from eplb.evaluation.traffic import simulate


def best(fn, repeat: int) -> tuple[float, object]:
    out, times = None, []
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def zipf_counts(T, L, E, tokens, K, rng):
    s = rng.uniform(0.6, 1.1, L)
    ranks = np.argsort(rng.random((L, E)), axis=1) + 1.0
    p = ranks ** -s[:, None]
    p /= p.sum(1, keepdims=True)
    drift = rng.gamma(20, 1 / 20, (T, L, E))  # window-to-window noise around the profile
    q = p[None] * drift
    q /= q.sum(-1, keepdims=True)
    return q * tokens * K, p


def loop_scores(placement, counts):
    rows = []
    for t in range(counts.shape[0]):
        gpu = placement.gpu_load(counts[t])
        mx, mean = gpu.max(1), gpu.mean(1)
        rows.append(np.stack([mx, mean, mean / mx, mx / mean]))
    return np.stack(rows)


def loop_traffic(placement, slots, rank, layer):
    """Per-token accounting for one layer (dispatch copies), straight from the brief."""
    topo = placement.topology
    per, S = topo.gpus_per_node, topo.slots_per_gpu
    nv = rd = 0
    for n in range(slots.shape[0]):
        s = int(rank[n])
        a = s // per
        dests = {int(p) // S for p in slots[n, layer]}
        for g in dests:
            if g != s and g // per == a:
                nv += 1
        for b in {g // per for g in dests} - {a}:
            rd += 1
            peer = b * per + s % per
            nv += sum(1 for g in dests if g // per == b and g != peer)
    return nv, rd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=1000)
    ap.add_argument("--tokens", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    L, E, K = 58, 256, 8
    topo = Topology.parse("4x8", 288)
    counts, p = zipf_counts(args.windows, L, E, 4096, K, rng)
    placement = solvers.solve("deepseek", counts.sum(0), topo, num_groups=8)

    # 1. per-window scoring
    t_vec, frame = best(lambda: score_windows(placement, counts), args.repeat)
    t_loop, ref = best(lambda: loop_scores(placement, counts), 1)
    np.testing.assert_allclose(frame["gpu_max"].to_numpy(), ref[:, 0].ravel())
    np.testing.assert_allclose(frame["balancedness"].to_numpy(), ref[:, 2].ravel())
    print(f"score_windows {args.windows} windows x {L} layers x {E} experts on {topo}: "
          f"{t_vec:.3f} s (loop over windows {t_loop:.3f} s, x{t_loop / t_vec:.1f})")

    # 2. token-level traffic
    N = args.tokens
    ids = np.empty((N, L, K), dtype=np.int16)
    for layer in range(L):
        keys = np.log(p[layer]) + rng.gumbel(size=(N, E))
        ids[:, layer] = np.argpartition(-keys, K, axis=1)[:, :K]
    rank = rng.integers(0, topo.num_gpus, N).astype(np.int32)
    for policy in ("even", "local_first"):
        t_sim, rep = best(lambda pol=policy: simulate(placement, topk_ids=ids, token_rank=rank,
                                                      policy=pol), args.repeat)
        t_route, _ = best(lambda pol=policy: [route(ids[:, i], placement, layer_index=i,
                                                    policy=pol, token_rank=rank)
                                              for i in range(L)], args.repeat)
        few = 300
        t0 = time.perf_counter()
        nv, rd = loop_traffic(placement, rep.slots[:few], rank[:few], 0)
        t_few = time.perf_counter() - t0
        check = simulate(placement, topk_ids=ids[:few], token_rank=rank[:few], policy=policy)
        assert (nv, rd) == (check.nvlink_transfers[0], check.rdma_transfers[0])
        t_loop_all = t_few / few * N * L
        print(f"traffic tokens {N} x {L} layers x top-{K} ({policy}) on {topo}: {t_sim:.2f} s "
              f"(route alone {t_route:.2f} s = {t_route / t_sim:.0%} of it; per-token loop "
              f"~{t_loop_all:.0f} s scaled from {few} tokens, x{t_loop_all / t_sim:.0f})")

    # 3. counts-mode traffic
    load = counts.sum(0)
    for spec in ("4x8", "18x8"):
        topo2 = Topology.parse(spec, 288)
        pl = solvers.solve("deepseek", load, topo2, num_groups=8)
        for policy in ("even", "local_first"):
            for groups in (None, 8):
                t_cnt, _ = best(lambda pl=pl, pol=policy, g=groups: simulate(
                    pl, load=load, policy=pol, num_groups=g, topk_groups=4), args.repeat)
                model = "group-limited 4 of 8" if groups else "independent"
                print(f"traffic counts mode {L} layers x {E} experts ({policy}, {model}) on "
                      f"{topo2}: {t_cnt * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
