"""``lplb``: LPLB replica graphs (cube / hypercube / torus) as a placement layout."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eplb.errors import InfeasibleError
from eplb.solvers import solve
from eplb.solvers.primitives.replica_graph import graph_misfit, partners
from eplb.testing import check_solver
from eplb.topology import Topology


def test_cube_partners_are_the_three_bit_flips():
    near = partners("cube", Topology(1, 8, 4))
    assert near[0] == [1, 2, 4] and near[5] == [1, 4, 7]
    assert all(g in near[h] for g in range(8) for h in near[g])  # undirected


def test_torus_partners_wrap_both_axes():
    near = partners("torus", Topology(3, 4, 8))
    assert near[0] == [1, 3, 4, 8]  # ring in node 0, then nodes 1 and 2 at local index 0
    assert all(len(n) == 4 and g in sum((near[h] for h in n), []) for g, n in enumerate(near))


@settings(max_examples=20, deadline=None)
@given(
    st.sampled_from([("cube", 1, 8), ("hypercube", 2, 2), ("hypercube", 2, 8), ("torus", 3, 3)]),
    st.integers(1, 3),
    st.integers(0, 2**16),
)
def test_copies_sit_on_graph_partners(case, mult, seed):
    graph, N, M = case
    topo0 = Topology(N, M, 1)
    d = len(partners(graph, topo0)[0])
    k = d * mult  # originals per GPU; spare = d * (mult?) <= k
    topo = Topology(N, M, k + d * int(np.random.default_rng(seed).integers(1, mult + 1)))
    G, S = topo.num_gpus, topo.slots_per_gpu
    E = G * k
    assert graph_misfit(E, topo, graph) is None
    load = np.random.default_rng(seed).random((2, E)) ** 3 * 100
    p = solve("lplb", load, topo, graph=graph).validate()
    near = partners(graph, topo)
    for layer in range(2):
        slots = p.phy2log[layer].reshape(G, S)
        home = {int(e): g for g in range(G) for e in slots[g, :k]}
        assert sorted(home) == list(range(E))  # every expert once among the originals
        for h in range(G):
            assert len(set(slots[h].tolist())) == S  # never two copies on one GPU
            for e in slots[h, k:]:
                assert home[int(e)] in near[h]  # a copy sits on a partner of its home GPU
                # the copied experts are the hottest of their home GPU
                own = slots[home[int(e)], :k]
                n_copied = (S - k) // len(near[h]) * len(near[h])
                assert load[layer, e] >= np.sort(load[layer, own])[::-1][n_copied - 1]


@pytest.mark.parametrize(
    ("graph", "topo", "E", "match"),
    [
        ("hypercube", Topology(1, 6, 6), 24, "power-of-two"),
        ("cube", Topology(2, 2, 6), 16, "8 GPUs"),
        ("cube", Topology(1, 8, 6), 32, "multiple of 3"),
        ("torus", Topology(2, 4, 5), 30, "divisible"),
    ],
)
def test_refuses_topologies_that_do_not_fit_the_graph(graph, topo, E, match):
    with pytest.raises(InfeasibleError, match=match):
        solve("lplb", np.ones((1, E)), topo, graph=graph)


@pytest.mark.parametrize("graph", ["torus"])  # hypercube shares the layout code
def test_check_solver(graph):
    def refuse(load, topo, groups):
        return graph_misfit(load.shape[1], topo, graph) is not None

    def fn(load, topology, **kw):
        return solve("lplb", load, topology, graph=graph)

    report = check_solver(fn, max_examples=5, may_refuse=refuse, guarantees=("no_duplicates",))
    assert report.refusals["examples"] > report.refusals["refused"]  # some problems ran
