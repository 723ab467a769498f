"""``lplb``: DeepSeek LPLB's replica graph (github.com/deepseek-ai/LPLB) as a placement, to be
served with ``dispatch="lp"``: originals balanced by LPT, each GPU's hottest experts copied to
fixed partner GPUs along a cube / hypercube / torus graph
(`solvers.primitives.replica_graph`). docs/solvers.md, "lplb".
"""

from __future__ import annotations

import numpy as np

from eplb.errors import InfeasibleError
from eplb.placement import Placement
from eplb.solvers.primitives.layout import duplicates
from eplb.solvers.primitives.replica_graph import Graph, graph_layout, graph_misfit
from eplb.solvers.registry import register
from eplb.topology import Topology


@register("lplb", guarantees=("no_duplicates",))
def lplb(load: np.ndarray, topology: Topology, *, graph: Graph = "hypercube") -> Placement:
    """LPLB placement of ``load: float64[L, E]`` on ``graph`` (module docstring); an
    ``InfeasibleError`` names the misfit where the topology does not fit the graph.

    After GPU failures `solve` gives it the survivors' topology (one node of the surviving
    GPUs when a node is partly failed), which a graph rarely fits (``E % G`` and the spare
    slots per GPU): lplb then refuses, the error naming the survivors; place with another
    solver (``greedy``) while GPUs are down."""
    why = graph_misfit(load.shape[1], topology, graph)
    if why is not None:
        raise InfeasibleError(why)
    phy2log = graph_layout(load, topology, graph)
    info = {
        "policy": "lplb",
        "graph": graph,
        "duplicates": int(duplicates(phy2log, topology.slots_per_gpu).sum()),
    }
    return Placement(phy2log, load.shape[1], topology, meta={"solver": info})
