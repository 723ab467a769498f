"""Dispatch policies: which replica serves each pick of an expert, defined once for the
executor, the traffic model, the step-time model and ``advise``.

`DISPATCH` holds one `Dispatch` per routed-expert policy, in the order the docs list them:
``even``, ``random``, ``local_first``, ``weighted``, ``lp`` (per-pick rules: `POLICIES`) and
``duplicate`` (copies per micro-batch on top of ``even``); `SHARED_EXPERT` holds the shared
expert's: ``local``, ``waterfill``. Each knows its token split, its expected shares, its
critical-path cost and its memory (`base`). Primitives they share: `tables`, `expect`,
`minmax`, `lp_shares`, `waterfill.waterline`. Rules: docs/core.md, "Dispatch policies".
"""

from eplb.dispatch.base import DISPATCH, Dispatch, check_policy, get, route
from eplb.dispatch.duplicate import Duplicate
from eplb.dispatch.local_first import LocalFirst
from eplb.dispatch.lp import Lp, lp_plan
from eplb.dispatch.shared import SHARED_EXPERT, Local, SharedExpert
from eplb.dispatch.split import Even, Random, Weighted
from eplb.dispatch.tables import dispatch_table, gpu_slots
from eplb.dispatch.waterfill import Waterfill

for _policy in (Even(), Random(), LocalFirst(), Weighted(), Lp(), Duplicate()):
    DISPATCH.add(_policy.name, _policy)
for _shared in (Local(), Waterfill()):
    SHARED_EXPERT.add(_shared.name, _shared)
del _policy, _shared

# the per-pick policies (the executor's and the traffic model's), in the order the docs list them
POLICIES = tuple(name for name in DISPATCH.names() if DISPATCH[name].per_pick)

__all__ = [
    "DISPATCH",
    "POLICIES",
    "SHARED_EXPERT",
    "Dispatch",
    "Duplicate",
    "Even",
    "Local",
    "LocalFirst",
    "Lp",
    "Random",
    "SharedExpert",
    "Waterfill",
    "Weighted",
    "check_policy",
    "dispatch_table",
    "get",
    "gpu_slots",
    "lp_plan",
    "route",
]
