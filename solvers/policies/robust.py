"""``robust``: places for the next windows from the load history ``float64[W, L, E]``.

Registered with ``windows=True``. Per layer: a forecast (the exponential moving average that
predicted the history best), replica counts for ``forecast + volatility * spread``, then
packing (optionally against the history windows as scenarios), a ring layout for ``lp``
dispatch, or repair of ``previous`` toward the forecast. docs/solvers.md, "robust".
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from eplb.errors import InputError
from eplb.placement import Placement
from eplb.solvers.primitives import scenario_packing
from eplb.solvers.primitives.even_split import pack_even, row_caps
from eplb.solvers.primitives.forecast import forecast, normalise
from eplb.solvers.primitives.incremental import incremental
from eplb.solvers.primitives.layout import duplicates
from eplb.solvers.primitives.replication import waterfill
from eplb.solvers.primitives.ring_layout import ring_layout
from eplb.solvers.primitives.validation import NonNegFloat, NonNegInt
from eplb.solvers.registry import register
from eplb.topology import Topology


@register("robust", windows=True)
def robust(
    load: np.ndarray,
    topology: Topology,
    *,
    previous: Placement | None = None,
    volatility: NonNegFloat = 1.0,
    scenarios: Literal["none", "mean", "worst"] = "none",
    layout: Literal["packed", "ring"] = "packed",
    tolerance: NonNegFloat | None = None,
    budget: NonNegInt = 10_000,
) -> Placement:
    """Place for the window after ``load: float64[W, L, E]`` (module docstring).

    ``volatility``: weight of each expert's spread over the windows in its replica count (0:
    counts from the forecast alone). ``scenarios``: ``none`` packs the forecast; ``mean`` /
    ``worst`` pack against the history windows. ``layout``: ``packed`` (greedy packing) or
    ``ring`` (replicated experts chained through every GPU, for ``lp`` dispatch; layers where
    the ring does not fit keep the packing, listed in ``meta["solver"]["packed_layers"]``).
    ``tolerance`` (with ``previous``): repair the live placement until its max GPU load on
    the forecast is within this relative slack of the fresh robust placement's. ``budget``:
    swap iterations.
    """
    W, L, E = load.shape
    G, S, P = topology.num_gpus, topology.slots_per_gpu, topology.num_slots
    if layout == "ring" and (scenarios != "none" or tolerance is not None):
        raise InputError(
            "layout='ring' places the forecast itself: leave scenarios='none' and "
            "tolerance unset (a repair or a scenario packing would break the ring)"
        )
    fc = forecast(load)
    counts = waterfill(
        fc.load + volatility * fc.spread, P, row_caps(np.ones((L, E), dtype=bool), G, S)
    )
    info: dict = {
        "policy": "robust",
        "layout": layout,
        "windows": int(W),
        "alpha": fc.alpha.tolist(),
    }
    packed = np.ones(L, dtype=bool)
    if layout == "ring":
        phy2log, ok = ring_layout(fc.load, counts, G, S)
        packed = ~ok
        info["packed_layers"] = np.nonzero(packed)[0].tolist()
    if packed.any():
        rows = np.nonzero(packed)[0]
        alt = pack_even(fc.load[rows], G, S, counts=counts[rows], budget=budget).phy2log()
        if layout == "ring":
            phy2log[rows] = alt
        else:
            phy2log = alt
    if scenarios != "none":
        scen = normalise(load).transpose(1, 0, 2)  # [L, W, E]
        alt = scenario_packing.pack(scen, counts, G, S, how=scenarios, budget=min(budget, 1000))
        new = scenario_packing.objective(scen, alt, S, scenarios)
        old = scenario_packing.objective(scen, phy2log, S, scenarios)
        better = new < old * (1 - 1e-12)
        phy2log = np.where(better[:, None], alt, phy2log)
        info["scenario_layers"] = np.nonzero(better)[0].tolist()
    if previous is not None and tolerance is not None:
        repaired = incremental(
            fc.load,
            topology,
            previous,
            Placement(phy2log, E, topology),
            tolerance=tolerance,
            migration_budget=None,
            max_steps=budget,
        )
        phy2log = repaired.phy2log
        info.update(relabeled=True, incremental=repaired.meta["solver"]["incremental"])
    info["duplicates"] = int(duplicates(phy2log, S).sum())
    return Placement(phy2log, E, topology, meta={"solver": info})
