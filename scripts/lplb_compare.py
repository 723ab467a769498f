"""LPLB's replica graph vs free replication (``greedy``), both served with per-batch ``lp``
dispatch: max GPU load / mean GPU load on batches the placement has not seen.

Synthetic loads: per layer a lognormal expert popularity (sigma 1.0) fixed over time, each
batch a multinomial draw of ``tokens`` routed tokens. Run: ``python scripts/lplb_compare.py``.
"""

from __future__ import annotations

import numpy as np

from eplb.dispatch.lp_shares import lp_shares
from eplb.solvers import solve
from eplb.topology import Topology


def imbalance(placement, load: np.ndarray, shares: np.ndarray) -> float:
    """Mean over layers of max / mean GPU load for ``load: float[L, E]``."""
    topo = placement.topology
    phy = placement.phy2log
    tok = np.take_along_axis(load, phy, 1) * shares  # [L, P]
    gpu = tok.reshape(load.shape[0], topo.num_gpus, -1).sum(2)
    return float((gpu.max(1) / gpu.mean(1)).mean())


def main(seed: int = 0, layers: int = 4, batches: int = 20, tokens: int = 8192) -> None:
    rng = np.random.default_rng(seed)
    cases = [("hypercube", Topology(1, 8, 11), 64), ("torus", Topology(2, 4, 11), 64)]
    for graph, topo, E in cases:
        pop = rng.lognormal(0.0, 1.0, size=(layers, E))
        pop /= pop.sum(1, keepdims=True)
        hist = np.stack([rng.multinomial(tokens * 8, p) for p in pop]).astype(float)
        placements = {
            f"lplb/{graph}": solve("lplb", hist, topo, graph=graph),
            "greedy": solve("greedy", hist, topo),
        }
        res = {k: [] for k in placements}
        for _ in range(batches):
            batch = np.stack([rng.multinomial(tokens, p) for p in pop]).astype(float)
            for k, p in placements.items():
                res[k].append(imbalance(p, batch, lp_shares(p, batch)))
        line = ", ".join(f"{k}: {np.mean(v):.4f}" for k, v in res.items())
        print(
            f"{topo.num_gpus} GPUs x {topo.slots_per_gpu} slots, {E} experts, lp dispatch, "
            f"max/mean GPU load over {batches} batches: {line}"
        )


if __name__ == "__main__":
    main()
