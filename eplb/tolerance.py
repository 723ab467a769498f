"""The toolkit's solver tolerances, defined once.

- ``REL_TOL``: relative float noise. A value counts as *better* only when it is below
  ``other * (1 - REL_TOL)``; loads summed in another order differ by about this much.
- ``PROOF_TOL``: relative gap accepted as a proof of optimality. A layer is reported
  ``"optimal"`` only when a proven lower bound ``b`` and the placement's exact objective ``v``
  satisfy ``b >= v * (1 - PROOF_TOL)`` (see `proven`). The exact ``S = 2`` method certifies
  to this precision.
"""

from __future__ import annotations

REL_TOL = 1e-12
PROOF_TOL = 1e-9


def better(value, other):
    """``value`` is better (smaller) than ``other`` beyond float noise (works on arrays)."""
    return value < other * (1 - REL_TOL)


def proven(bound: float, value: float) -> bool:
    """``bound`` (a proven lower bound) certifies ``value`` optimal to ``PROOF_TOL``."""
    return bound * (1 + REL_TOL) >= value * (1 - PROOF_TOL) or value <= 0
