"""Scale invariance of every registered policy: solve random small problems at load x 1 and at
load x {1e-9, 1e-3, 1e3, 1e9} and count, per policy, the problems whose placement or balance
(max GPU load / scale) differ. Usage: ``python scripts/check_scale_invariance.py [--n 30]``.
Integer and all-equal loads have ties, which scaled floats may break the other way (a
heuristic may then end elsewhere); on tie-free (lognormal) loads any balance difference beyond
1e-9 relative is a scale dependence.
"""

from __future__ import annotations

import argparse

import numpy as np

from eplb import Placement, Topology, solvers
from eplb.errors import InfeasibleError, InputError

FACTORS = (1e-9, 1e-3, 1e3, 1e9)
OPTIONS = {
    "ilp": {"deterministic_time": 0.5, "workers": 1},
    "ilp_weighted": {"workers": 1, "time_limit": 5.0},
    "greedy_traffic": {"rdma_weight": 2.0},
}
NEEDS_PREVIOUS = {"repair"}


def problem(rng: np.random.Generator):
    """A random small problem: ``(load: float64[L, E], topology, num_groups)``."""
    N = int(rng.integers(1, 3))
    gpn = int(rng.integers(1, 4))
    if N * gpn < 2:
        gpn = 2
    S = int(rng.integers(2, 4))
    P = N * gpn * S
    E = int(rng.integers(max(2, N), P + 1))
    groups = [g for g in range(N, E + 1) if E % g == 0 and g % N == 0]
    num_groups = int(rng.choice(groups)) if groups else None
    L = int(rng.integers(1, 3))
    kind = rng.integers(3)
    if kind == 0:
        load = rng.integers(0, 50, size=(L, E)).astype(float)
    elif kind == 1:
        load = rng.lognormal(0, 1.5, size=(L, E))
    else:
        load = np.full((L, E), 7.0)
    return load, Topology(N, gpn, S), num_groups, kind == 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=30, help="random problems per policy")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policies", nargs="*", help="policies to check (default: all)")
    ap.add_argument("--verbose", action="store_true", help="print every failing problem")
    args = ap.parse_args()
    rows = []
    for name in args.policies or solvers.available():
        rng = np.random.default_rng(args.seed)
        opts = OPTIONS.get(name, {})
        bal = bal_free = same = tried = 0
        worst = 0.0
        for _ in range(args.n):
            load, topo, groups, tie_free = problem(rng)
            prev = None
            if name in NEEDS_PREVIOUS:
                prev = solvers.solve("greedy", load[::-1].copy(), topo)
            try:
                ref = solvers.solve(name, load, topo, num_groups=groups, previous=prev, **opts)
            except (InfeasibleError, InputError):  # not a problem this policy takes
                continue
            tried += 1
            ref_max = ref.gpu_load(load).max(1)
            for f in FACTORS:
                p: Placement = solvers.solve(
                    name, load * f, topo, num_groups=groups, previous=prev, **opts
                )
                got = p.gpu_load(load * f).max(1) / f
                err = float(np.max(np.abs(got - ref_max) / np.maximum(ref_max, 1e-300)))
                worst = max(worst, err)
                bal += err > 1e-9
                bal_free += err > 1e-9 and tie_free
                if err > 1e-9 and args.verbose:
                    print(f"{name} x{f:g}: {err:.2e} load={load.tolist()} {topo} groups={groups}")
                same += np.array_equal(p.phy2log, ref.phy2log)
        rows.append((name, tried, len(FACTORS) * tried, same, bal, bal_free, worst))
    print(
        "policy | problems | scaled solves | same placement | balance differs (all) | "
        "balance differs (tie-free lognormal loads) | worst rel diff of max GPU load"
    )
    for r in rows:
        print(" | ".join(str(x) for x in r[:-1]) + f" | {r[-1]:.2e}")


if __name__ == "__main__":
    main()
