"""Benchmark: reference executor dispatch + combine against a warm ``np.take`` of the same rows.

Workload: top-8 routing on 32 simulated ranks (4 nodes x 8 GPUs x 9 slots, 256 experts + 32
redundant), float32, ``even`` dispatch, at hidden 1024 (16,384 tokens) and 7168 (4,096
tokens: about the same bytes). Experts are the identity (the expert output of a pick is its
received row), so only the data movement is timed: ``dispatch`` + ``combine`` from
`eplb.executor.kernels` with a reused ``kernels.Buffer`` (``dispatch_layout`` and combine's
reduction plans, index math a runtime computes once per routing, are reported apart).

Baseline, measured in the same process, interleaved with the kernels (best of ``--repeat``):
one warm ``np.take`` of the same ``M + R`` rows (every receive and RDMA row) from the
activations into a reused buffer. Dispatch writes those rows and combine reads them back, so
dispatch + combine move ``2 (M + R)`` rows where the take moves ``M + R``; the ratio of
bandwidths is ``2 t_take / (t_dispatch + t_combine)`` (1.0 = each phase as fast as one
gather of its rows; target >= 0.70).

Results are checked against the closed form of identity experts, ``out[n] = sum_k w[n, k] *
x[n]``, before any number is printed; ``--loop`` also runs `loop_dispatch_combine`, the same
work one token at a time (receive buffers bit-equal), and prints the speed-up over it.

    python benchmarks/bench_executor.py [--hidden 1024,7168] [--tokens N] [--repeat 7] [--loop]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from eplb import Placement, Topology
from eplb.executor import kernels


def workload(tokens: int, hidden: int, top_k: int, topo: Topology, num_experts: int, seed: int):
    """Random placement (every expert once, then redundant replicas of popular experts), skewed
    routing (Gumbel top-k over Zipf-like expert popularity), tokens sharded evenly by rank."""
    rng = np.random.default_rng(seed)
    P = topo.num_slots
    pop = rng.permutation(num_experts)  # pop[i]: expert of popularity rank i
    phy = np.concatenate([np.arange(num_experts), pop[: P - num_experts]])
    placement = Placement(rng.permutation(phy)[None], num_experts, topo).validate()
    logp = np.empty(num_experts)
    logp[pop] = -0.8 * np.log(np.arange(1, num_experts + 1))
    gumbel = rng.gumbel(size=(tokens, num_experts)) + logp
    topk_ids = np.argsort(-gumbel, axis=1)[:, :top_k]
    w = rng.random((tokens, top_k)).astype(np.float32)
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    token_rank = np.arange(tokens) * topo.num_gpus // tokens
    slots = kernels.route(topk_ids, placement, policy="even", token_rank=token_rank)
    return x, w, slots, token_rank


def vectorised(x, w, slots, token_rank, topo, expert_fn, buffer=None):
    t0 = time.perf_counter()
    layout = kernels.dispatch_layout(slots, token_rank, topo)
    t1 = time.perf_counter()
    recv, _ = kernels.dispatch(x, layout, buffer=buffer)
    t2 = time.perf_counter()
    y = expert_fn(recv, layout)  # not timed
    t3 = time.perf_counter()
    out = kernels.combine(y, w, layout, buffer=buffer)
    t4 = time.perf_counter()
    return out, recv, layout, {"layout": t1 - t0, "dispatch": t2 - t1, "combine": t4 - t3}


def identity_experts(recv, layout):
    """Expert outputs in ``pick_order`` for identity experts: each pick's received row."""
    return recv[layout.pick_row.reshape(-1)[layout.pick_order]]


def loop_dispatch_combine(x, w, slots, token_rank, topo, y, pick_pos):
    """Straightforward per-token implementation of the same dispatch and combine.

    ``y: float[N*K, H]`` expert outputs, pick ``(n, k)`` at row ``pick_pos[n*K + k]``.
    Returns ``(out [N, H], recv: list of per-rank [rows, H] buffers)``.
    """
    N, K = slots.shape
    H = x.shape[1]
    S, gpn, G = topo.slots_per_gpu, topo.gpus_per_node, topo.num_gpus
    recv = [[] for _ in range(G)]
    # dispatch: per token, its distinct destination GPUs in ascending order
    for n in range(N):
        s = int(token_rank[n])
        dests = sorted({int(p) // S for p in slots[n]})
        rdma = {}  # remote node -> row held by the rail peer (one RDMA copy per node)
        for g in dests:
            if g // gpn == s // gpn:
                recv[g].append((n, x[n].copy()))  # local or NVLink from the source
            else:
                b = g // gpn
                if b not in rdma:
                    rdma[b] = x[n].copy()  # RDMA to the rail peer
                recv[g].append((n, rdma[b].copy()))  # rail peer's copy, or NVLink forward
    # combine: per token, per destination partial sums, per remote node sums, then total
    out = np.zeros((N, H), dtype=x.dtype)
    for n in range(N):
        s = int(token_rank[n])
        partial = {}
        for k in range(K):
            g = int(slots[n, k]) // S
            contrib = w[n, k] * y[pick_pos[n * K + k]]
            partial[g] = contrib if g not in partial else partial[g] + contrib
        node_sum = {}
        for g, v in partial.items():
            b = g // gpn
            if b == s // gpn:
                out[n] += v
            else:
                node_sum[b] = v if b not in node_sum else node_sum[b] + v
        for v in node_sum.values():
            out[n] += v
    buffers = [np.array([r for _, r in rows]).reshape(-1, H) for rows in recv]
    order = [np.array([t for t, _ in rows], dtype=np.int64) for rows in recv]
    return out, buffers, order


def loop_layout(slots, token_rank, topo):
    """Per-token Python version of the index part alone (`kernels.dispatch_layout`): receive
    rows per rank, per-node RDMA rows, each pick's receive row. Returns (per-rank token lists,
    per-node token lists, pick rows as global receive-row indices)."""
    N, K = slots.shape
    S, gpn, G = topo.slots_per_gpu, topo.gpus_per_node, topo.num_gpus
    per_rank = [[] for _ in range(G)]
    per_node = [[] for _ in range(topo.num_nodes)]
    where = {}
    for n in range(N):
        s = int(token_rank[n])
        dests = sorted({int(p) // S for p in slots[n]})
        for g in dests:
            where[n, g] = len(per_rank[g])
            per_rank[g].append(n)
        for b in sorted({g // gpn for g in dests} - {s // gpn}):
            per_node[b].append(n)
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in per_rank])])
    pick_row = np.array([[offsets[int(p) // S] + where[n, int(p) // S] for p in slots[n]]
                         for n in range(N)])
    return per_rank, per_node, pick_row


def measure(tokens: int, hidden: int, top_k: int, repeat: int, seed: int, loop: bool) -> dict:
    topo = Topology(4, 8, 9)
    N, H, K = tokens, hidden, top_k
    x, w, slots, token_rank = workload(N, H, K, topo, 256, seed)
    buffer = kernels.Buffer()
    t0 = time.perf_counter()
    layout = kernels.dispatch_layout(slots, token_rank, topo)
    _ = layout.combine_plan  # combine's reduction plans: index math, once per routing
    t_layout = time.perf_counter() - t0
    M, R = layout.num_recv, layout.num_rdma
    recv, _ = kernels.dispatch(x, layout, buffer=buffer)
    y = identity_experts(recv, layout)  # fresh array: the buffer's recv is reused below
    kernels.combine(y, w, layout, buffer=buffer)  # warm: the buffer's pages are touched
    rows = np.concatenate([layout.rdma_token, layout.recv_token])  # the same M + R rows of x
    taken = np.empty((M + R, H), dtype=x.dtype)
    best = {"take": np.inf, "dispatch": np.inf, "combine": np.inf}
    for _ in range(repeat):  # interleaved, so background load hits all three alike
        t0 = time.perf_counter()
        np.take(x, rows, axis=0, out=taken, mode="clip")
        t1 = time.perf_counter()
        kernels.dispatch(x, layout, buffer=buffer)
        t2 = time.perf_counter()
        out = kernels.combine(y, w, layout, buffer=buffer)
        t3 = time.perf_counter()
        for key, val in (("take", t1 - t0), ("dispatch", t2 - t1), ("combine", t3 - t2)):
            best[key] = min(best[key], val)
    closed = w.sum(1, keepdims=True) * x
    np.testing.assert_allclose(out, closed, rtol=1e-5, atol=1e-5)
    res = {"N": N, "H": H, "M": M, "R": R, "layout": t_layout, **best}
    res["ratio"] = 2 * best["take"] / (best["dispatch"] + best["combine"])
    if loop:
        pick_pos = np.empty(N * K, dtype=np.int64)
        pick_pos[layout.pick_order] = np.arange(N * K)
        t0 = time.perf_counter()
        ref, buffers, order = loop_dispatch_combine(x, w, slots, token_rank, topo, y, pick_pos)
        res["loop"] = time.perf_counter() - t0
        np.testing.assert_allclose(ref, closed, rtol=1e-5, atol=1e-5)
        recv, _ = kernels.dispatch(x, layout, buffer=buffer)
        for g in range(topo.num_gpus):
            a, b = layout.rank_offsets[g], layout.rank_offsets[g + 1]
            assert np.array_equal(layout.recv_token[a:b], order[g])
            assert np.array_equal(recv[a:b], buffers[g])
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", default="1024,7168", help="hidden sizes (default 1024,7168)")
    ap.add_argument("--tokens", type=int,
                    help="tokens (default 16384 at hidden 1024, scaled to the same bytes)")
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--loop", action="store_true", help="also time the per-token Python loop")
    args = ap.parse_args()
    print("dispatch + combine vs one warm np.take of the same M + R rows (best of "
          f"{args.repeat}, interleaved); 32 ranks (4x8x9), top-{args.top_k}, float32")
    print(f"\n{'hidden':>6} {'tokens':>7} {'M':>7} {'R':>6} {'take ms':>8} {'disp ms':>8} "
          f"{'comb ms':>8} {'take GB/s':>9} {'d+c GB/s':>9} {'ratio':>6}  layout ms")
    for H in (int(h) for h in args.hidden.split(",")):
        N = args.tokens or max(1024, 16384 * 1024 // H)
        r = measure(N, H, args.top_k, args.repeat, args.seed, args.loop)
        row = H * 4
        bw_take = (r["M"] + r["R"]) * row / r["take"] / 1e9
        bw_dc = 2 * (r["M"] + r["R"]) * row / (r["dispatch"] + r["combine"]) / 1e9
        print(f"{H:>6} {N:>7} {r['M']:>7} {r['R']:>6} {r['take'] * 1e3:>8.1f} "
              f"{r['dispatch'] * 1e3:>8.1f} {r['combine'] * 1e3:>8.1f} {bw_take:>9.2f} "
              f"{bw_dc:>9.2f} {r['ratio']:>6.2f}  {r['layout'] * 1e3:.1f}")
        if "loop" in r:
            print(f"{'':>6} per-token loop {r['loop']:.2f} s: dispatch + combine "
                  f"{r['loop'] / (r['dispatch'] + r['combine']):.1f}x faster (receive buffers "
                  "bit-equal)")
    print("\nratio = 2 t_take / (t_dispatch + t_combine): dispatch + combine move every "
          "receive/RDMA row twice (written, read back), the take once; target >= 0.70")


if __name__ == "__main__":
    main()
