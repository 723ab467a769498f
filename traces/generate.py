"""Generators by name: `generate` runs a `traces.synth` generator from ``KIND`` and plain
parameters (what ``eplb trace synth`` takes), checking the names against its signature."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from eplb.args import check_int
from eplb.errors import InputError
from eplb.traces import synth
from eplb.traces.model import Trace

# generator kind -> function of traces.synth
KINDS: dict[str, Callable[..., Trace]] = {
    "zipf": synth.zipf, "lognormal": synth.lognormal, "uniform": synth.uniform,
    "drift": synth.drift, "bursty": synth.bursty, "calibrated": synth.calibrated,
    "tokens": synth.token_level,
}
_TUPLES = ("skew", "sigma")  # (lo, hi) ranges, given as lists in JSON


def generator(kind: str) -> Callable[..., Trace]:
    """The `traces.synth` function of ``kind`` (`KINDS`)."""
    if not isinstance(kind, str) or kind not in KINDS:
        raise InputError(f"unknown trace kind {str(kind)[:40]!r}; use one of {', '.join(KINDS)}")
    return KINDS[kind]


def parameters(kind: str) -> dict[str, inspect.Parameter]:
    """The parameters ``kind``'s generator takes, by name."""
    return dict(inspect.signature(generator(kind)).parameters)


def generate(kind: str, *, first_layer: int | None = None, **params: Any) -> Trace:
    """A trace from generator ``kind`` (`KINDS`) with ``params`` (its keyword arguments; lists
    for ``skew``/``sigma`` become tuples). ``first_layer``: model layer id of the first layer
    (``layer_ids`` from it on, for the generators that take layer ids). Unknown parameter
    names are an `InputError` listing the generator's."""
    func = generator(kind)
    sig = parameters(kind)
    kw = dict(params)
    if first_layer is not None:
        if "layer_ids" not in sig:
            raise InputError(f"first_layer does not apply to {kind} (its layers are fixed)")
        n = kw.get("num_layers", sig["num_layers"].default if "num_layers" in sig else None)
        if n is None:
            target = kw.get("target")
            if not isinstance(target, Trace):
                raise InputError(f"first_layer with {kind} needs num_layers or a target Trace")
            n = target.num_layers
        first_layer = check_int("first_layer", first_layer, 0, error=InputError)
        n = check_int("num_layers", n, 1, error=InputError)
        kw["layer_ids"] = list(range(first_layer, first_layer + n))
    unknown = sorted(set(kw) - set(sig))
    if unknown:
        opts = sorted(k for k in sig if k not in ("target",))
        raise InputError(f"{kind} does not take {', '.join(unknown)}; its parameters are "
                         f"{', '.join(opts)}")
    for k in _TUPLES:
        if k in kw and isinstance(kw[k], list):
            kw[k] = tuple(kw[k])
    return func(**kw)
