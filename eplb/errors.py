"""The one exception family users catch: every bad input or failed solve raises an `EplbError`.

Messages name the field, the bad value and the fix, e.g.
``slots 287 is not a multiple of 32 GPUs; use 288``. The CLI prints the message and exits 2.
"""

from __future__ import annotations


class EplbError(Exception):
    """Base class of every error the toolkit raises on purpose."""


class InputError(EplbError, ValueError):
    """An argument or file content is malformed or out of range."""


class TraceError(InputError):
    """A trace or load file cannot be read or holds invalid counts."""


class TopologyError(InputError):
    """Nodes, GPUs, slots or bandwidths are inconsistent."""


class PlacementError(InputError):
    """A placement table violates an invariant (names the layer and slot)."""


class InfeasibleError(EplbError):
    """The request has no valid placement (e.g. fewer slots than experts)."""


class SolverTimeout(EplbError):
    """A solver hit its time limit before finding any valid placement (or a third-party
    policy ran past it and was stopped)."""


class PolicyError(EplbError):
    """A third-party policy (a plugin or an installed package's entry point) failed: it
    raised, or returned something that is not a valid placement; names the policy and its
    origin."""


__all__ = [
    "EplbError",
    "InfeasibleError",
    "InputError",
    "PlacementError",
    "PolicyError",
    "SolverTimeout",
    "TopologyError",
    "TraceError",
]
