"""Replicas moved between two placements of one problem: what a rebalance costs.

`replicas_moved(old, new)` is the core's (`eplb.moves`, the one meaning shared with the executor,
``replay``, the serving simulator and ``advise``): per layer, the replicas a GPU receives over a
link because it held no copy of that expert before; reordering slots inside a GPU, or another
copy of an expert the GPU already holds, is not a move. Keeping moves low:
`solvers.primitives.relabel`.
"""

from __future__ import annotations

from eplb.moves import replicas_moved

__all__ = ["replicas_moved"]
