"""Benchmark: serving parts (KV store, per-rank prefix lookup, DP balancers) at simulator sizes,
each against a naive baseline run in the same process.

1. `KVStore`: replay a workload (the Mooncake trace when ``../shared/requests`` is present,
   else a synthetic one) as lookup + insert per request, unbounded and with an LRU capacity
   that evicts; lookups/s and blocks/s. Baseline: the same LRU with nodes keyed by the tuple of
   the whole prefix (``O(b^2)`` hashing per prompt; what one writes without relying on
   prefix-chained hashes). Results are cross-checked (same matched blocks).
2. `RankCaches.match` (every rank's cached prefix in one walk, what ``cache_aware`` needs per
   request) at 32 and 144 ranks vs calling each rank's ``KVStore.match``.
3. Balancers: requests/s assigned in batches of 64 by every registered policy, prefill at 32
   ranks (token budget 16,384) and decode at 144 ranks (KV capacity, 128 requests per rank),
   vs a pure-Python least-tokens loop over ranks (the obvious implementation).

4. Balance quality (not speed): max rank load over the lower bound ``max(largest request,
   total / R)`` on skewed lognormal batches (the cases `tests/test_serving_balancers.py`
   asserts on), for prefill attention cost / computed tokens and decode KV blocks / requests.

    python benchmarks/bench_serving_parts.py [--requests 4000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

from eplb.data_dirs import requests_dir  # noqa: E402
from eplb.evaluation.serving import balancers as B  # noqa: E402
from eplb.evaluation.serving import workload as W  # noqa: E402
from eplb.evaluation.serving.balancers import RankState, RequestBatch  # noqa: E402
from eplb.evaluation.serving.kvcache import KVStore, RankCaches  # noqa: E402

MOONCAKE = requests_dir() / "mooncake_conversation.jsonl"
if not MOONCAKE.exists():
    MOONCAKE = Path("/work/shared/requests/mooncake_conversation.jsonl")


def best(fn, repeat: int):
    out, times = None, []
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


class TupleStore:
    """What one writes without trusting chained hashes: radix nodes keyed by the tuple of the
    whole prefix (``O(b^2)`` hashing per prompt), the same leaf-first LRU order (OrderedDict)."""

    def __init__(self, cap):
        self.cap, self.d = cap, OrderedDict()

    def match(self, hs):
        d, k = self.d, 0
        while k < len(hs) and tuple(hs[: k + 1]) in d:
            k += 1
        if self.cap is not None:
            for i in range(k - 1, -1, -1):
                d.move_to_end(tuple(hs[: i + 1]))
        return k

    def insert(self, hs):
        d = self.d
        hs = hs if self.cap is None else hs[: self.cap]
        keys = [tuple(hs[: i + 1]) for i in range(len(hs))]
        new = 0
        for q in keys:
            if q in d:
                d.move_to_end(q)
            else:
                new += 1
        while self.cap is not None and len(d) + new > self.cap:
            d.popitem(last=False)
        for q in reversed(keys):
            d[q] = None
            d.move_to_end(q)


def replay(store, hashes):
    out = []
    for hs in hashes:
        out.append(store.match(hs))
        store.insert(hs)
    return out


def bench_store(hashes, repeat):
    blocks = sum(len(h) for h in hashes)
    total_unique = len({x for h in hashes for x in h})
    print(
        f"\n1. KVStore replay: {len(hashes):,} requests, {blocks:,} blocks "
        f"({total_unique:,} distinct), lookup + insert per request"
    )
    print(
        f"{'capacity':<22}{'lookups/s':>12}{'blocks/s':>14}{'hit blocks':>12}"
        f"{'tuple-key lookups/s':>21}{'speed-up':>10}"
    )
    for cap in (None, total_unique // 10, 2000):
        sec, got = best(lambda c=cap: replay(KVStore(c), hashes), repeat)
        nsec, ngot = best(lambda c=cap: replay(TupleStore(c), hashes), repeat)
        assert ngot == got, "tuple-keyed store and KVStore disagree"
        rate, nrate = len(hashes) / sec, len(hashes) / nsec
        label = "unbounded" if cap is None else f"{cap:,} blocks (LRU)"
        print(
            f"{label:<22}{rate:>12,.0f}{blocks / sec:>14,.0f}{sum(got) / blocks:>12.3f}"
            f"{nrate:>21,.0f}{rate / nrate:>9.1f}x"
        )


def bench_rank_caches(hashes, repeat):
    print("\n2. RankCaches.match (all ranks at once) vs a loop over the ranks' KVStore.match")
    print(f"{'ranks':<8}{'index lookups/s':>17}{'loop lookups/s':>16}{'speed-up':>10}")
    rng = np.random.default_rng(0)
    probes = hashes[-2000:]
    for R in (32, 144):
        rc = RankCaches(R, 20_000)
        for h in hashes[:-2000]:
            rc.insert(int(rng.integers(R)), h)
        got = [rc.match(h).tolist() for h in probes[:200]]
        want = [[s.match(h, touch=False) for s in rc.stores] for h in probes[:200]]
        assert got == want
        sec, _ = best(lambda rc=rc: [rc.match(h) for h in probes], repeat)
        lsec, _ = best(
            lambda rc=rc: [[s.match(h, touch=False) for s in rc.stores] for h in probes], 1
        )
        print(f"{R:<8}{len(probes) / sec:>17,.0f}{len(probes) / lsec:>16,.0f}{lsec / sec:>9.1f}x")


def naive_least_tokens(batch, state):
    """Per request, a Python loop over ranks checking capacity and picking the least tokens."""
    R = state.num_ranks
    q = state.queued_tokens.tolist()
    tok = (state.queued_tokens + state.running_tokens).tolist()
    kv, n = state.kv_blocks_used.tolist(), state.num_requests.tolist()
    dq, dr, dkv, _ = (x.tolist() for x in state.increments(batch))
    out = []
    for i in range(len(batch)):
        best_r, best_v = -1, float("inf")
        for r in range(R):
            if not state.alive[r] or n[r] + 1 > state.max_requests[r]:
                continue
            if kv[r] + dkv[i] > state.kv_blocks_capacity[r]:
                continue
            if state.phase == "prefill" and q[r] and q[r] + dq[i] > state.token_budget[r]:
                continue
            if tok[r] < best_v:
                best_r, best_v = r, tok[r]
        out.append(best_r)
        if best_r >= 0:
            q[best_r] += dq[i]
            tok[best_r] += dq[i] + dr[i]
            kv[best_r] += dkv[i]
            n[best_r] += 1
    return np.array(out)


def bench_balancers(wl, repeat, batch_size=64):
    df = wl.requests
    n = (len(df) // batch_size) * batch_size
    rng = np.random.default_rng(1)
    inp = np.minimum(df["input_tokens"].to_numpy()[:n], 16384)
    cached = (inp * rng.random(n) * 0.5).astype(np.int64)
    hashes = list(df["block_hashes"].to_numpy()[:n]) if wl.has_hashes else None
    batch = RequestBatch(inp, cached, df["output_tokens"].to_numpy()[:n], block_hashes=hashes)
    batches = [batch.take(slice(i, i + batch_size)) for i in range(0, n, batch_size)]
    configs = {
        "prefill, 32 ranks": dict(num_ranks=32, phase="prefill", token_budget=16384),
        "decode, 144 ranks": dict(
            num_ranks=144, phase="decode", max_requests=128, kv_blocks_capacity=4000
        ),
    }
    print(
        f"\n3. Balancers: {n:,} requests in batches of {batch_size}; each batch offered to "
        "a fresh copy of a half-loaded state (committed)"
    )
    for label, cfg in configs.items():
        base = RankState(**cfg, caches=RankCaches(cfg["num_ranks"], 20_000))
        warm = RequestBatch(np.full(cfg["num_ranks"] * 2, 2000))
        B.assign("round_robin", warm, base)

        def fresh(base=base):
            s = base.copy()
            s.caches = base.caches
            return s

        nsec, _ = best(lambda: [naive_least_tokens(b, fresh()) for b in batches], 1)
        check = [B.get("least_tokens")(b, fresh()) for b in batches[:5]]
        assert all(
            np.array_equal(c, naive_least_tokens(b, fresh()))
            for c, b in zip(check, batches[:5], strict=True)
        )
        print(f"\n{label}: naive least-tokens loop {n / nsec:,.0f} requests/s")
        print(f"{'policy':<18}{'requests/s':>12}{'us/request':>12}{'vs naive':>10}")
        for name in B.available():
            sec, _ = best(
                lambda name=name: [
                    B.assign(name, b, fresh(), seed=[1, i]) for i, b in enumerate(batches)
                ],
                repeat,
            )
            print(f"{name:<18}{n / sec:>12,.0f}{sec / n * 1e6:>12.1f}{nsec / sec:>9.1f}x")


def over_bound(load, sizes, R):
    return float(load.max() / max(sizes.max(), sizes.sum() / R))


def bench_quality():
    print("\n4. Balance quality: busiest rank / lower bound max(largest request, total / R)")
    print(f"{'case':<40}{'policy':<18}{'seed 0':>14}{'seed 1':>14}{'seed 2':>14}")
    cases = {}
    for seed in range(3):
        rng = np.random.default_rng(seed)
        inp = np.clip(np.rint(rng.lognormal(7.5, 1.2, size=512)), 1, 100_000).astype(np.int64)
        cached = (inp * rng.random(512) * (rng.random(512) < 0.5)).astype(np.int64)
        pre = RequestBatch(inp, cached)
        rng = np.random.default_rng(seed)
        kv = np.clip(np.rint(rng.lognormal(8.0, 1.0, size=600)), 1, 200_000).astype(np.int64)
        dec = RequestBatch(kv, kv_tokens=kv)
        for name in ("round_robin", "least_tokens", "deepseek_prefill"):
            st = RankState(16, "prefill")
            B.assign(name, pre, st)
            cases.setdefault(("prefill 512 req / 16 ranks: attn, tok", name), []).append(
                f"{over_bound(st.attention_cost, pre.attention_cost, 16):.3f}, "
                f"{over_bound(st.queued_tokens, pre.uncached_tokens, 16):.3f}"
            )
        for name in ("round_robin", "least_requests", "deepseek_decode"):
            st = RankState(24, "decode", block_size=64)
            B.assign(name, dec, st, seed=3)
            cases.setdefault(("decode 600 req / 24 ranks: kv, req", name), []).append(
                f"{over_bound(st.kv_blocks_used, -(-kv // 64), 24):.3f}, "
                f"{st.num_requests.max() / 25:.3f}"
            )
    for (case, name), vals in cases.items():
        print(f"{case:<40}{name:<18}" + "".join(f"{v:>14}" for v in vals))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--requests", type=int, default=4000, help="requests replayed / assigned (default 4000)"
    )
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if MOONCAKE.exists():
        wl = W.read(MOONCAKE).head(args.requests)
        print(f"workload: first {len(wl):,} requests of {MOONCAKE.name}")
    else:
        wl = W.synthesize(args.requests, rate=4, hit_rate=0.4, input_mean=8000, seed=0)
        print(f"workload: synthetic ({wl}); the Mooncake trace was not found")
    hashes = [h.tolist() for h in wl.requests["block_hashes"]]
    bench_store(hashes, args.repeat)
    bench_rank_caches(hashes, args.repeat)
    bench_balancers(wl, args.repeat)
    bench_quality()
    return 0


if __name__ == "__main__":
    sys.exit(main())
