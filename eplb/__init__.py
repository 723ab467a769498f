"""eplb: expert-parallel load balancing for MoE inference (core types only).

Solvers live in `eplb.solvers`, traces in `eplb.traces`, evaluation in `eplb.evaluation`; the
core never imports them. See docs/core.md.
"""

from eplb.errors import (
    EplbError,
    InfeasibleError,
    InputError,
    PlacementError,
    PolicyError,
    SolverTimeout,
    TopologyError,
    TraceError,
)
from eplb.placement import Placement
from eplb.topology import Topology

__version__ = "0.1.0"

__all__ = [
    "EplbError",
    "InfeasibleError",
    "InputError",
    "Placement",
    "PlacementError",
    "PolicyError",
    "SolverTimeout",
    "Topology",
    "TopologyError",
    "TraceError",
    "__version__",
]
