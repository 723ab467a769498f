"""Exports and empty slots (issue 20, part 5): a replica budget (``craft``) leaves slots empty
(``-1``) on live GPUs. SGLang's ``physical_to_logical_map``, TensorRT-LLM's and vLLM's
``initial_global_assignments`` hold one expert id per slot and have no value for "no expert"
(SGLang files a -1 under the last expert: ``logical_to_all_physical_map[layer][-1]``), so those
exports refuse by field name and write nothing; the native JSON and NPZ keep them exactly."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from eplb import EplbError, Topology, solvers
from eplb.io import read_placement, write_placement
from tests.conftest import BUNDLED

TOPO = Topology(2, 4, 3)
RUNTIME = [("sglang", "p.sg.json", "physical_to_logical_map"),
           ("trtllm", "p.yaml", "initial_global_assignments"),
           ("vllm", "p.jsonl", "initial_global_assignments")]


@pytest.fixture(scope="module")
def budgeted():
    load = np.random.default_rng(0).gamma(0.3, 100.0, (4, 16))
    p = solvers.solve("craft", load, TOPO, redundancy=0.25, budget=0, layer_ids=[3, 4, 5, 6])
    assert (p.phy2log == -1).any() and not TOPO.failed_gpus
    return p


@pytest.mark.parametrize(("fmt", "name", "field"), RUNTIME)
def test_runtime_exports_refuse_empty_slots(budgeted, tmp_path, fmt, name, field):
    with pytest.raises(EplbError, match=f"{field} cannot express an empty slot") as info:
        write_placement(budgeted, tmp_path / name, fmt)
    assert "--solver greedy" in str(info.value)
    assert not (tmp_path / name).exists()


@pytest.mark.parametrize(("fmt", "name", "field"), RUNTIME)
def test_runtime_exports_of_full_placements_still_write(budgeted, tmp_path, fmt, name, field):
    full = solvers.solve("greedy", np.ones((4, 16)), TOPO, layer_ids=[3, 4, 5, 6])
    assert write_placement(full, tmp_path / name, fmt) == fmt
    assert read_placement(tmp_path / name, fmt, topology=TOPO, num_experts=16).num_slots == 24


@pytest.mark.parametrize("name", ["p.json", "p.npz"])
def test_native_formats_keep_empty_slots(budgeted, tmp_path, name):
    write_placement(budgeted, tmp_path / name)
    back = read_placement(tmp_path / name)
    assert np.array_equal(back.phy2log, budgeted.phy2log)
    assert back.equals(budgeted)


def test_cli_refuses_a_craft_export(tmp_path):
    out = tmp_path / "loc.json"
    r = subprocess.run(
        [sys.executable, "-m", "eplb.cli", "solve", str(BUNDLED / "deepseek-v3-calibrated.npz"),
         "--topology", "1x8", "--slots", "264", "--solver", "craft", "--option", "budget=0",
         "--option", "redundancy=0.5", "--format", "sglang", "-o", str(out)],
        capture_output=True, text=True,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("eplb: error:") and "physical_to_logical_map" in r.stderr
    assert not out.exists()
