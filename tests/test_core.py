"""Core types: Topology parsing and graph, Placement tables and every invariant of validate()."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from eplb import EplbError, Placement, PlacementError, Topology, TopologyError


def test_topology_sizes_and_maps():
    t = Topology(2, 4, 3)
    assert (t.num_gpus, t.num_slots) == (8, 24)
    assert t.gpu_of_slot.tolist() == [g for g in range(8) for _ in range(3)]
    assert t.node_of_gpu.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert t.node_of_slot[11] == 0 and t.node_of_slot[12] == 1
    assert Topology.from_dict(t.to_dict()) == t


def test_topology_parse():
    assert Topology.parse("4x8", slots=288) == Topology(4, 8, 9)
    assert Topology.parse("18x8x2") == Topology(18, 8, 2)
    with pytest.raises(TopologyError, match="slots 287 is not a multiple of 32 GPUs; use 288"):
        Topology.parse("4x8", slots=287)
    with pytest.raises(TopologyError, match="not NODESxGPUS"):
        Topology.parse("four by eight", slots=288)
    with pytest.raises(TopologyError, match="gives no slot count"):
        Topology.parse("4x8")
    with pytest.raises(TopologyError, match="positive bandwidth"):
        Topology(1, 2, 2, rdma_gbps=0)
    with pytest.raises(TopologyError, match="num_nodes must be >= 1"):
        Topology(0, 2, 2)
    with pytest.raises(EplbError):
        Topology(1.5, 2, 2)


def test_topology_graph_links():
    t = Topology(3, 4, 2, nvlink_gbps=100, rdma_gbps=25)
    g = t.graph()
    assert g.number_of_nodes() == 12
    nv = [e for e in g.edges(data=True) if e[2]["kind"] == "nvlink"]
    rd = [e for e in g.edges(data=True) if e[2]["kind"] == "rdma"]
    assert len(nv) == 3 * 6  # K4 per node
    assert len(rd) == 4 * 3  # one triangle per rail
    assert all(t.node_of_gpu[a] == t.node_of_gpu[b] and d["gbps"] == 100 for a, b, d in nv)
    assert all(a % 4 == b % 4 and t.node_of_gpu[a] != t.node_of_gpu[b] for a, b, _ in rd)


def _placement(rows, E=4, topo=None, share=None):
    return Placement(np.array(rows), E, topo or Topology(1, 2, 3), share)


def test_derived_tables():
    p = _placement([[0, 1, 0, 2, 3, 0]])
    assert p.logcnt.tolist() == [[3, 1, 1, 1]]
    assert p.log2phy.tolist() == [[[0, 2, 5], [1, -1, -1], [3, -1, -1], [4, -1, -1]]]
    assert p.replica_rank.tolist() == [[0, 0, 1, 0, 0, 2]]
    load = np.array([[30.0, 10, 20, 40]])
    assert p.slot_load(load).tolist() == [[10, 10, 10, 20, 40, 10]]
    assert p.gpu_load(load).tolist() == [[30, 70]]
    assert p.node_load(load).tolist() == [[100]]
    p.validate()


def test_weighted_gpu_load():
    share = np.array([[0.5, 1, 0.25, 1, 1, 0.25]])
    p = _placement([[0, 1, 0, 2, 3, 0]], share=share).validate()
    load = np.array([[40.0, 10, 20, 40]])
    assert p.gpu_load(load).tolist() == [[20 + 10 + 10, 20 + 40 + 10]]


@pytest.mark.parametrize(
    ("rows", "E", "share", "match"),
    [
        ([[0, 1, 0, 2, 3]], 4, None, "5 slots per layer but topology 1x2x3 has 6"),
        ([[0, 1, 0, 2, 3, 4]], 4, None, "layer 0 slot 5 holds expert 4, outside 0..3"),
        ([[0, 1, 0, 2, 3, -2]], 4, None, "slot 5 holds expert -2"),
        ([[0, 1, -1, 2, -1, -1]], 4, None, "layer 0 expert 3 has no replica"),
        ([[0, 1, 0, 2, 2, 0]], 4, None, "layer 0 expert 3 has no replica"),
        ([[0, 1, 2, 3, 0, 1], [0, 0, 1, 1, 2, 2]], 4, None, "layer 1 expert 3 has no replica"),
        ([[0, 1, 0, 2, 3, 0]], 4, np.full((1, 5), 0.5), "replica_share has shape"),
        ([[0, 1, 0, 2, 3, 0]], 4, np.array([[0.5, 1, 0.5, 1, 1, 0.5]]), "expert 0 sums to 1.5"),
        ([[0, 1, 0, 2, 3, 0]], 4, np.array([[1.5, 1, -0.5, 1, 1, 0]]), r"replica_share\[0, 2\]"),
        ([[0, 1, 0, 2, 3, 0]], 4, np.array([[np.nan, 1, 0.5, 1, 1, 0.5]]), "shares must be >= 0"),
    ],
)
def test_validate_names_the_violation(rows, E, share, match):
    with pytest.raises(PlacementError, match=match):
        _placement(rows, E, share=share).validate()


def test_construction_errors():
    with pytest.raises(PlacementError, match="2-D"):
        Placement(np.zeros(6, dtype=int), 4, Topology(1, 2, 3))
    with pytest.raises(PlacementError, match="integer expert ids"):
        Placement(np.full((1, 6), 0.5), 4, Topology(1, 2, 3))
    with pytest.raises(PlacementError, match="layer_ids"):
        Placement(np.zeros((2, 6), dtype=int), 1, Topology(1, 2, 3), layer_ids=[1, 2, 3])
    with pytest.raises(PlacementError, match="load has shape"):
        _placement([[0, 1, 0, 2, 3, 0]]).gpu_load(np.ones((1, 5)))


def test_placement_is_frozen():
    p = _placement([[0, 1, 0, 2, 3, 0]])
    with pytest.raises(ValueError):
        p.phy2log[0, 0] = 3
    with pytest.raises(AttributeError):
        p.num_experts = 5


@st.composite
def random_placements(draw):
    nodes, gpn, S = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    topo = Topology(nodes, gpn, S)
    P = topo.num_slots
    E = draw(st.integers(1, P))
    L = draw(st.integers(1, 3))
    rows = []
    for _ in range(L):
        extra = draw(st.lists(st.integers(0, E - 1), min_size=P - E, max_size=P - E))
        row = np.array(list(range(E)) + extra)
        perm = draw(st.permutations(range(P)))
        rows.append(row[list(perm)])
    return Placement(np.array(rows), E, topo)


@given(random_placements())
def test_derived_tables_agree_with_phy2log(p):
    p.validate()
    L, P = p.phy2log.shape
    for layer in range(L):
        for e in range(p.num_experts):
            slots = [s for s in range(P) if p.phy2log[layer, s] == e]
            assert p.logcnt[layer, e] == len(slots)
            assert [s for s in p.log2phy[layer, e] if s >= 0] == slots
            assert [p.replica_rank[layer, s] for s in slots] == list(range(len(slots)))
    np.testing.assert_allclose(
        np.bincount(p.phy2log[0], weights=p.share[0], minlength=p.num_experts), 1.0
    )


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda m: m.__setitem__((0, 0, 0), -1), "counts disagree"),
        (lambda m: m.__setitem__((0, 1), m[0, 1, ::-1].copy()), "padding before"),
        (lambda m: m.__setitem__((0, 0, 0), m[0, 1, 0]), "another expert"),
        (lambda m: m.__setitem__((0, 0, slice(0, 2)), m[0, 0, 1::-1].copy()), "ascending"),
    ],
)
def test_validate_checks_the_derived_log2phy(corrupt, message):
    """`validate` re-checks ``log2phy`` against ``phy2log`` (a corrupted cached map is named):
    replica counts, padding, the expert in each slot, ascending slot order."""
    topo = Topology(1, 2, 3)
    p = Placement(np.array([[0, 1, 0, 2, 0, 3], [3, 2, 1, 0, 1, 2]]), 4, topo)
    m = np.array(p.validate().log2phy)  # expert 0 of layer 0: slots 0, 2, 4; R = 3
    corrupt(m)
    p.__dict__["log2phy"] = m
    with pytest.raises(PlacementError, match=message):
        p.validate()
