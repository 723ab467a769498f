"""The compiled kernels when numba is installed (the ``fast`` extra), else None: `kernels`.
Each kernel gives exactly what the numpy code it stands in for gives (tests compare them), so
results never depend on whether numba is there; ``EPLB_NO_JIT=1`` keeps the numpy code.
docs/solvers.md, "Speed against the serving engines' policies"."""

from __future__ import annotations

import os

_KERNELS = None  # the kernels module, or False when numba is missing or switched off


def kernels():
    """`solvers.primitives.numba_kernels`, or None (no numba, or ``EPLB_NO_JIT`` set)."""
    global _KERNELS
    if _KERNELS is None:
        if os.environ.get("EPLB_NO_JIT", "") not in ("", "0"):
            return None
        try:
            from eplb.solvers.primitives import numba_kernels
        except ImportError:  # numba is not installed
            _KERNELS = False
        else:
            _KERNELS = numba_kernels
    return _KERNELS or None


def available() -> bool:
    """Whether the compiled kernels run."""
    return kernels() is not None
