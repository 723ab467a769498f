"""The toolkit's tolerances, defined once: ``REL_TOL`` (float noise, `better`), ``PROOF_TOL``
(gap accepted as a proof of optimality, `proven`), ``SUM_TOL`` and ``SHARE_TOL`` (sums that
must agree). All relative. See docs/core.md, section "Tolerances".
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from eplb.errors import InputError

if TYPE_CHECKING:  # for annotations only: the module needs no numpy at run time
    import numpy as np
    from numpy.typing import ArrayLike

REL_TOL = 1e-12  # relative float noise: loads summed in another order differ by about this
PROOF_TOL = 1e-9  # relative gap accepted as a proof of optimality (the exact S = 2 method's)
SUM_TOL = 1e-9  # relative: two sums of the same values over many terms (per rank vs total)
SHARE_TOL = 1e-8  # an expert's replica shares sum to 1 within this


def better(value: ArrayLike, other: ArrayLike) -> bool | np.ndarray:
    """``value`` is better (smaller) than ``other`` beyond float noise: below
    ``other * (1 - REL_TOL)`` (works on arrays: ``bool[...]``)."""
    return value < other * (1 - REL_TOL)


def proven(bound: float, value: float) -> bool:
    """``bound`` (a proven lower bound) certifies ``value`` (the exact objective) optimal to
    ``PROOF_TOL``: ``bound >= value * (1 - PROOF_TOL)``, up to ``REL_TOL`` noise."""
    return bound * (1 + REL_TOL) >= value * (1 - PROOF_TOL) or value <= 0


def check_stop_tol(name: str, value: object, *, flag: str | None = None) -> float:
    """``value`` as the relative tolerance that ends a search (``hi / lo <= 1 + value``): a
    real number in [`REL_TOL`, 1). Below the toolkit's float noise the ends of the search
    cannot be told apart (``1 + 1e-300 == 1.0``: it would never stop). ``flag``: the CLI
    option, named in the error instead of ``name``."""
    shown = flag or name
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) \
            or not 0 < value < 1:
        raise InputError(f"{shown} must be a fraction in (0, 1), got {value!r}")
    if value < REL_TOL:
        raise InputError(f"{shown} {value:g} is below {REL_TOL:g}, the relative difference "
                         "floating point resolves here (1 + it rounds to 1, so the search "
                         f"would never end); use {REL_TOL:g} or more (e.g. 0.01)")
    return float(value)

