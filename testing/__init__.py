"""Property testing for placement policies, yours and ours (as ``numpy.testing``).

- `assert_valid_placement(p, load=None, *, no_duplicates=False, group_contract=None)`:
  every invariant of a placement, an ``AssertionError`` naming the layer, GPU and expert.
- `check_solver(name_or_fn, **options)`: the invariant suite every solver of the toolkit
  passes (valid placements, deterministic for a seed, never below the lower bound,
  ``previous=`` only relabels, bad input refused with `EplbError`, no other exception on
  valid input), run with hypothesis on small random problems; each failure is reported with
  its shrunk counterexample.
- `eplb.testing.strategies`: the hypothesis strategies behind it (loads with ties, zeros and
  heavy skew, topologies, grouped problems, placements, token-level routing).

Five lines for your own policy::

    from eplb import solvers
    from eplb.testing import check_solver

    @solvers.register("mine")
    def mine(load, topology):        # load: float64[L, E]; return a Placement or phy2log
        ...
    check_solver("mine")             # AssertionError listing each failed property

``hypothesis`` is needed only by `check_solver` and `strategies` (imported when used;
``pip install eplb[testing]``). Unlike the core, this module uses `solvers` (like the CLI):
the core itself never imports it.
"""

from __future__ import annotations

from typing import Any

from eplb.testing.asserts import assert_valid_placement
from eplb.testing.check import CheckReport, check_solver

__all__ = ["CheckReport", "assert_valid_placement", "check_solver", "strategies"]


def __getattr__(name: str) -> Any:
    if name == "strategies":  # lazy: hypothesis is needed only when strategies are used
        import importlib

        return importlib.import_module("eplb.testing.strategies")
    raise AttributeError(f"module 'eplb.testing' has no attribute {name!r}")

