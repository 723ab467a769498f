"""How often ``greedy_weighted`` reaches ``total / G`` on tiny problems with ``P - E >= G - 1``
spare slots (the chain layout's claim in docs/solvers.md), split by ``S <= 2`` (no chain layout)
and ``S >= 3``, with the brute-force weighted optimum (`eplb.testing.brute_force`) to tell the
heuristic's misses from problems where ``total / G`` is out of reach.

Run: ``python scripts/measure_chain_claim.py [--n 400] [--seed 0]``.
"""

from __future__ import annotations

import argparse
from math import comb

import numpy as np

from eplb import Topology, solvers
from eplb.testing import brute_force as bf


def cases(rng: np.random.Generator, n: int):
    """Tiny ``(w: float64[E], N, gpn, S)`` with ``P - E >= G - 1`` and a small table count."""
    out = []
    while len(out) < n:
        N = int(rng.integers(1, 3))
        gpn = int(rng.integers(1, 4))
        G = N * gpn
        S = int(rng.integers(1, 5))
        P = G * S
        if G < 2 or P - (G - 1) < 2:
            continue
        E = int(rng.integers(2, P - (G - 1) + 1))
        K = comb(E + S - 1, S)  # GPU contents; tables enumerated: comb(K + gpn - 1, gpn) ** N
        if E > 5 or comb(K + gpn - 1, gpn) ** N > 20_000:
            continue
        kind = rng.integers(3)
        if kind == 0:
            w = rng.integers(1, 60, E).astype(float)
        elif kind == 1:
            w = rng.lognormal(0, 1.5, E)
        else:
            w = rng.integers(1, 10, E).astype(float)
            w[rng.integers(E)] *= 20
        out.append((w, N, gpn, S))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=400, help="random problems")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rows = {"S <= 2": [], "S >= 3": []}
    for w, N, gpn, S in cases(np.random.default_rng(args.seed), args.n):
        G = N * gpn
        target = w.sum() / G
        p = solvers.solve("greedy_weighted", w[None], Topology(N, gpn, S))
        got = float(p.gpu_load(w[None]).max())
        opt = bf.optimum(w, N, gpn, S, weighted=True)
        rows["S <= 2" if S <= 2 else "S >= 3"].append((got / target, opt / target, got / opt))
    print(
        "slots per GPU | problems | greedy_weighted reaches total/G | optimum reaches "
        "total/G | greedy_weighted optimal | worst greedy_weighted / total/G | worst "
        "greedy_weighted / optimum"
    )
    for key, r in rows.items():
        a = np.array(r)
        tol = 1 + 1e-9
        print(
            f"{key} | {len(a)} | {(a[:, 0] <= tol).sum()} | {(a[:, 1] <= tol).sum()} | "
            f"{(a[:, 2] <= tol).sum()} | {a[:, 0].max():.3f} | {a[:, 2].max():.3f}"
        )


if __name__ == "__main__":
    main()
