"""Placement files: every format round-trips; exports match what runtimes read; bad files fail."""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from eplb import InputError, Placement, PlacementError, Topology, solvers
from eplb.io import read_placement, sglang_map, write_placement


def _solved(weighted: bool = False) -> Placement:
    rng = np.random.default_rng(0)
    load = rng.integers(0, 100, size=(3, 12)).astype(float)
    p = solvers.solve("deepseek", load, Topology(2, 2, 4), num_groups=4)
    p = Placement(p.phy2log, 12, p.topology, None, p.meta, layer_ids=[3, 4, 6])
    if weighted:
        rng = np.random.default_rng(1)
        raw = rng.random(p.phy2log.shape)
        sums = np.zeros((3, 12))
        for layer in range(3):
            np.add.at(sums[layer], p.phy2log[layer], raw[layer])
        share = raw / np.take_along_axis(sums, p.phy2log, 1)
        p = Placement(p.phy2log, 12, p.topology, share, p.meta, p.layer_ids)
    return p.validate()


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("suffix", [".json", ".npz"])
def test_native_round_trip_is_lossless(tmp_path, suffix, weighted):
    p = _solved(weighted).with_meta(source={"path": "x.json", "sha256": "ab"}, metrics={"m": 1.5})
    path = tmp_path / f"p{suffix}"
    write_placement(p, path)
    q = read_placement(path)
    assert q.equals(p)
    assert q.meta == json.loads(json.dumps(p.meta))
    if weighted:
        assert np.array_equal(q.replica_share, p.replica_share)  # bit-exact floats


def test_sglang_export_has_only_the_map_and_all_model_layers(tmp_path):
    p = _solved()
    path = tmp_path / "sg.json"
    write_placement(p, path, "sglang", num_model_layers=8)
    doc = json.loads(path.read_text())
    assert list(doc) == ["physical_to_logical_map"]
    rows = np.array(doc["physical_to_logical_map"])
    assert rows.shape == (8, 16)
    np.testing.assert_array_equal(rows[[3, 4, 6]], p.phy2log)
    np.testing.assert_array_equal(rows[0], np.arange(16) % 12)  # dense layers: default map
    q = read_placement(path, topology=p.topology)  # sniffed as sglang
    np.testing.assert_array_equal(q.phy2log[[3, 4, 6]], p.phy2log)
    np.testing.assert_array_equal(sglang_map(p), rows[:7])


def test_trtllm_yaml(tmp_path):
    p = _solved()
    path = tmp_path / "lb.yaml"
    write_placement(p, path)
    doc = yaml.safe_load(path.read_text())
    assert doc["num_slots"] == 16
    assert sorted(doc["initial_global_assignments"]) == [3, 4, 6]
    assert doc["initial_global_assignments"][4] == p.phy2log[1].tolist()
    q = read_placement(path, topology=p.topology, num_experts=12)
    assert q.equals(Placement(p.phy2log, 12, p.topology, layer_ids=p.layer_ids))


def test_exports_refuse_shares(tmp_path):
    p = _solved(weighted=True)
    for fmt in ("sglang", "trtllm"):
        with pytest.raises(InputError, match="replica_share"):
            write_placement(p, tmp_path / "x.json", fmt)
        assert not (tmp_path / "x.json").exists()


@given(st.integers(0, 2**32 - 1))
def test_round_trip_random_placements(tmp_path_factory, seed):
    rng = np.random.default_rng(seed)
    topo = Topology(int(rng.integers(1, 3)), int(rng.integers(1, 4)), int(rng.integers(1, 4)))
    P = topo.num_slots
    E = int(rng.integers(1, P + 1))
    rows = [
        rng.permutation(np.concatenate([np.arange(E), rng.integers(0, E, P - E)]))
        for _ in range(int(rng.integers(1, 4)))
    ]
    p = Placement(np.array(rows), E, topo, meta={"solver": {"name": "random", "seed": seed}})
    d = tmp_path_factory.mktemp("rt")
    for name in ("p.json", "p.npz", "p.yaml"):
        write_placement(p, d / name, layer_ids_are_model_ids=True)
        q = read_placement(d / name, topology=topo, num_experts=E)
        assert q.equals(p)


def test_bad_files(tmp_path):
    (tmp_path / "empty.json").write_text("")
    with pytest.raises(PlacementError, match="empty"):
        read_placement(tmp_path / "empty.json")
    (tmp_path / "bad.json").write_text('{"format": "eplb.placement", "version": 1}')
    with pytest.raises(PlacementError, match="missing field 'phy2log'"):
        read_placement(tmp_path / "bad.json")
    (tmp_path / "ragged.json").write_text('{"physical_to_logical_map": [[0, 1], [0]]}')
    with pytest.raises(PlacementError, match="ragged"):
        read_placement(tmp_path / "ragged.json", topology=Topology(1, 1, 2))
    with pytest.raises(InputError, match="does not record the topology"):
        read_placement(tmp_path / "ragged.json")
    with pytest.raises(InputError, match="does not exist"):
        read_placement(tmp_path / "missing.json")
    with pytest.raises(InputError, match="cannot tell the placement format"):
        read_placement(tmp_path / "x.txt")
    good = tmp_path / "good.npz"
    write_placement(_solved(), good)
    trunc = tmp_path / "trunc.npz"
    trunc.write_bytes(good.read_bytes()[:200])
    with pytest.raises(PlacementError, match="truncated"):
        read_placement(trunc)
    pickled = tmp_path / "pickled.npz"
    buf = io.BytesIO()
    np.save(buf, np.array([{"evil": 1}], dtype=object), allow_pickle=True)
    with zipfile.ZipFile(good) as z, zipfile.ZipFile(pickled, "w") as out:
        for name in z.namelist():
            out.writestr(name, buf.getvalue() if name == "header.npy" else z.read(name))
    with pytest.raises(PlacementError, match="pickled objects, which are refused"):
        read_placement(pickled)
    # invalid content is caught by validate(), named with the file
    p = _solved()
    path = tmp_path / "inv.json"
    write_placement(p, path)
    doc = json.loads(path.read_text())
    doc["phy2log"][1][0] = 99
    path.write_text(json.dumps(doc))
    with pytest.raises(PlacementError, match="inv.json: layer 1 slot 0 holds expert 99"):
        read_placement(path)


def test_atomic_write_leaves_nothing_on_failure(tmp_path, monkeypatch):
    p = _solved()
    target = tmp_path / "p.json"
    write_placement(p, target)
    before = target.read_bytes()

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr("eplb.io.dumps_native", boom)
    with pytest.raises(RuntimeError):
        write_placement(p, target)
    assert target.read_bytes() == before
    assert sorted(x.name for x in tmp_path.iterdir()) == ["p.json"]
