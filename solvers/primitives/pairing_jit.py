"""`improve_counts` compiled (`jit`: numba, the ``fast`` extra): the same
count local search as `pairing.improve_counts`, row by row in one compiled loop, with the same
moves, the same floating-point values and the same tie rules, so the same counts (tests compare
the two; the kernel is `numba_kernels.search`). docs/solvers.md, "Two slots per GPU".

Per step and row (as the numpy search): receivers are the critical pair's experts, the
``receivers`` experts with the largest replicas and the ``light_receivers`` with the smallest
next replica (first columns of stable sorts, a receiver listed twice counted once); donors the
experts with two or more replicas, in index order; a move is skipped by the same tests (its
smallest replica and the donor's new one already reach the objective; the count test against
the critical pair) and otherwise priced exactly on the moved sorted list, read rank by rank
through `pairing.rebuilt_objectives`' map (stopping at a pair that already loses). The first
move (receiver-major, donor-minor) with the smallest objective wins; rows marked ``distinct``
skip moves whose two middle replicas are equal. Rows with the same ``load_id`` and the same
counts share one evaluation (the numpy search does the same)."""

from __future__ import annotations

import numpy as np

from eplb.solvers.primitives import jit
from eplb.tolerance import REL_TOL


def improve_counts_jit(load, counts, cap, budget, receivers, light_receivers, present, distinct,
                       load_id) -> np.ndarray:
    """`pairing.improve_counts` (same arguments, validated and broadcast there) compiled."""
    out = np.ascontiguousarray(counts, dtype=np.int64).copy()
    jit.kernels().search(
        np.ascontiguousarray(load, dtype=np.float64),
        out,
        np.ascontiguousarray(cap, dtype=np.int64),
        np.ascontiguousarray(present, dtype=np.bool_),
        np.ascontiguousarray(distinct, dtype=np.bool_),
        np.ascontiguousarray(load_id, dtype=np.int64),
        int(budget),
        int(receivers),
        int(light_receivers),
        1.0 - REL_TOL,
    )
    return out
