"""Where the shared expert runs: one registered `SharedExpert` per policy (`SHARED_EXPERT`):
``local`` (each rank runs its own tokens', on the rank side) and ``waterfill`` (the tokens are
poured onto the less-loaded ranks, `waterfill`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from eplb.registry import Registry

__all__ = ["SHARED_EXPERT", "Local", "SharedExpert"]


@dataclass(frozen=True)
class SharedExpert:
    """A shared-expert dispatch policy. ``pooled``: the shared tokens are split over the ranks
    with the routed picks (`split`, `shipped`); else each rank runs its own tokens' shared
    expert next to its attention."""

    name: ClassVar[str] = ""
    pooled: ClassVar[bool] = False

    def split(self, routed: np.ndarray, own: np.ndarray) -> np.ndarray | None:
        """Token split: ``float64[..., G]`` shared-expert tokens each rank runs, given its
        routed picks ``routed: float[..., G]`` and the shared tokens of each rank's own batch
        ``own: float[G]``; None where each rank runs its own."""
        return None

    def shipped(self, share: np.ndarray, own: np.ndarray, nodes: int):
        """Critical-path traffic of `split`: ``(out, inn, rd_out, rd_in)``, each
        ``float64[..., G]``, shared-expert tokens a rank sends and receives, and the parts
        that cross nodes (all 0 for ``local``)."""
        zero = np.zeros(np.shape(share))
        return zero, zero, zero, zero


@dataclass(frozen=True)
class Local(SharedExpert):
    """``local``: each rank runs its own tokens' shared expert."""

    name = "local"


SHARED_EXPERT: Registry[SharedExpert] = Registry("shared-expert policy")
