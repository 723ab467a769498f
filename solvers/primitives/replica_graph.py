"""LPLB-style replica graphs: each GPU's hot experts get their redundant copy on fixed partner
GPUs given by a graph (cube, hypercube, torus), so that per-batch ``lp`` dispatch can move load
along the graph's edges. The design follows DeepSeek's LPLB (github.com/deepseek-ai/LPLB:
experts reordered by EPLB, replicas built from a static topology, token shares solved per
batch by a linear program). docs/solvers.md, "lplb".
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from eplb.topology import Topology

Graph = Literal["cube", "hypercube", "torus"]


def partners(graph: Graph, topology: Topology) -> list[list[int]]:
    """Partner GPUs of every GPU, ``out[g]`` sorted; raises nothing (see `graph_misfit`).

    ``hypercube``: ``g ^ 2**i`` for each bit (``cube``: the 8-GPU case). ``torus``: the
    ``num_nodes x gpus_per_node`` grid with wrap-around, neighbours along both axes."""
    G = topology.num_gpus
    if graph in ("cube", "hypercube"):
        bits = max(G.bit_length() - 1, 0)
        return [sorted(g ^ (1 << i) for i in range(bits)) for g in range(G)]
    N, M = topology.num_nodes, topology.gpus_per_node
    out = []
    for g in range(G):
        n, i = divmod(g, M)
        near = {n * M + (i + 1) % M, n * M + (i - 1) % M}
        near |= {((n + 1) % N) * M + i, ((n - 1) % N) * M + i}
        near.discard(g)
        out.append(sorted(near))
    return out


def graph_misfit(num_experts: int, topology: Topology, graph: Graph) -> str | None:
    """Why ``graph`` cannot hold ``num_experts`` experts on ``topology`` (None: it fits).

    Needs ``E % G == 0`` (``E / G`` originals per GPU) and the spare slots ``S - E / G`` a
    positive multiple of the graph degree ``d``, at most ``E / G`` (each original copied once)."""
    G, S, E = topology.num_gpus, topology.slots_per_gpu, num_experts
    if graph == "cube" and G != 8:
        return f"graph='cube' needs 8 GPUs, the topology has {G} (use 'hypercube' or 'torus')"
    if graph == "hypercube" and (G < 2 or G & (G - 1)):
        return (
            f"graph='hypercube' needs a power-of-two GPU count >= 2, the topology has {G} "
            "(use 'torus', or 2, 4, 8, 16... GPUs)"
        )
    if graph == "torus" and G < 2:
        return "graph='torus' needs at least 2 GPUs (use more GPUs or another solver)"
    if E % G:
        return (
            f"the replica graph needs experts divisible by GPUs: {E} experts on {G} GPUs "
            "(use a GPU count that divides the experts)"
        )
    spare, d = S - E // G, len(partners(graph, topology)[0])
    if spare < d or spare % d or spare > E // G:
        fix = (f"e.g. {E // G + d} slots per GPU, {(E // G + d) * G} slots in all"
               if d <= E // G else "another graph or solver")
        return (
            f"graph={graph!r} (degree {d}) needs spare slots per GPU (slots_per_gpu - "
            f"experts/GPU = {spare}) a multiple of {d} between {d} and {E // G} ({fix})"
        )
    return None


def graph_layout(load: np.ndarray, topology: Topology, graph: Graph) -> np.ndarray:
    """``phy2log: int64[L, P]`` for ``load: float[L, E]`` on a fitting ``graph``.

    Per layer: originals packed ``E / G`` per GPU by LPT (EPLB's reordering without
    redundancy), then each GPU's hottest originals copied, ``spare / d`` per edge, to each
    partner in order. Slots of a GPU: its originals, then the copies it receives."""
    L, E = load.shape
    G, S = topology.num_gpus, topology.slots_per_gpu
    k = E // G
    near = partners(graph, topology)
    per_edge = (S - k) // len(near[0])
    out = np.empty((L, G, S), dtype=np.int64)
    for layer in range(L):
        row = load[layer]
        own = [[] for _ in range(G)]
        tot = np.zeros(G)
        for e in np.argsort(-row, kind="stable"):
            g = int(np.where([len(o) < k for o in own], tot, np.inf).argmin())
            own[g].append(int(e))
            tot[g] += row[e]
        got = [[] for _ in range(G)]
        for g in range(G):
            hot = iter(own[g])  # already heaviest first
            for h in near[g]:
                for _ in range(per_edge):
                    got[h].append(next(hot))
        for g in range(G):
            out[layer, g] = own[g] + got[g]
    return out.reshape(L, G * S)
