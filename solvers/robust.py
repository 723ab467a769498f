"""``robust``: drift-robust rebalancing, placing for the next window from several recent ones.

Takes the load history ``float64[W, L, E]`` (registered with ``windows=True``; `solve` passes a
`traces.Trace`'s windows and `evaluation.replay` the history windows of each rebalance).

1. **Forecast** (`solvers.forecast`): per layer, the exponential moving average whose weight
   predicted the history best one window ahead (the last window for drifting experts, a long
   average for noisy but stationary ones).
2. **Replica counts** by water-filling on ``forecast + volatility * spread`` (``spread``: each
   expert's standard deviation over the windows), so experts whose load swings get more
   replicas; capped at ``G`` replicas as in ``greedy``.
3. **Packing** the forecast with those counts: the even-split greedy pipeline (LPT, swap
   search; sorted pairing for two slots per GPU) with ``scenarios="none"``; with ``"mean"`` or
   ``"worst"`` the packing minimises the mean (or the largest) over the normalised history
   windows of the largest GPU load instead (`solvers.scenario_packing`), the first packing being
   kept on layers where it scores better on that objective. ``layout="ring"`` places the
   replicated experts in a ring through all GPUs instead (`solvers.ring_layout`), so that
   ``lp`` dispatch, which splits each batch over an expert's replicas, can move load between
   any two GPUs (the co-designed placement for ``lp``; worse than packing under ``even``).
4. With ``previous`` and ``tolerance``, the live placement is repaired toward the forecast
   (`solvers.incremental`, as ``repair`` does) instead of re-placed: far fewer replicas move.

What this buys, and what no forecast can: see docs/solvers.md ("Drift-robust rebalancing").
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from eplb.errors import InputError
from eplb.placement import Placement
from eplb.solvers import scenario_packing
from eplb.solvers.even_split import pack_even, row_caps
from eplb.solvers.forecast import forecast, normalise
from eplb.solvers.incremental import incremental
from eplb.solvers.layout import duplicates
from eplb.solvers.registry import register
from eplb.solvers.replication import waterfill
from eplb.solvers.ring_layout import ring_layout
from eplb.solvers.validation import NonNegFloat, NonNegInt
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
