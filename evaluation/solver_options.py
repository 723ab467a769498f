"""Options for several solvers at once: ``{"budget": 5, "greedy.rdma_weight": 0.1}`` split into
each solver's own options (what ``eplb compare --option`` takes)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from eplb import solvers
from eplb.errors import InputError
from eplb.solvers.legacy import LEGACY


def option_names(solver: str) -> dict[str, Any]:
    """``{option: default}`` of ``solver`` (`solvers.options`), plus the older spellings
    `solvers.legacy` still maps (default ``None``)."""
    opts = dict(solvers.options(solver))
    for key in LEGACY.get(solver, ()):
        opts.setdefault(key, None)
    return opts


def split_options(options: Mapping[str, Any], names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``{solver: {option: value}}`` for the solvers ``names``: a key ``"SOLVER.KEY"`` goes to
    that solver; a plain key goes to every solver that has that option (`option_names`), and
    one no solver has is refused. Values are checked (`solvers.resolve`); `InputError` names
    the key."""
    names = list(names)
    if not names:
        raise InputError("give at least one solver")
    out: dict[str, dict[str, Any]] = {n: {} for n in names}
    for key, value in options.items():
        solver, dot, opt = key.partition(".")
        if dot:
            if solver not in out:
                raise InputError(f"option {key}: solver {solver!r} is not among the solvers "
                                 f"({', '.join(names)})")
            out[solver][opt] = value
            solvers.resolve(solver, {opt: value})
        else:
            takers = [n for n in names if key in option_names(n)]
            if not takers:
                solvers.resolve(names[0], {key: value})  # raises, listing the options
            for n in takers:  # an option some solvers lack applies to the ones that have it
                solvers.resolve(n, {key: value})
                out[n][key] = value
    return out
