"""Issue 22 §1: user policies from the CLI, by ``--plugin MODULE`` and by an installed
package's ``eplb.solvers`` entry point (a tmp ``.dist-info`` on the path stands in for
``pip install``: importlib.metadata finds both the same way)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from tests.conftest import BUNDLED, REPO

POLICY = textwrap.dedent('''
    import numpy as np

    def round_robin(load, topology):
        """slot p holds expert p mod E"""
        E = load.shape[1]
        return np.tile(np.arange(topology.num_slots) % E, (load.shape[0], 1))
''')


def _run(tmp_path, *args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    return subprocess.run([sys.executable, "-m", "eplb.cli", *args], capture_output=True,
                          text=True, env=env, cwd=tmp_path)


def _solve(tmp_path, solver, *extra):
    out = tmp_path / f"{solver}.json"
    r = _run(tmp_path, "solve", str(BUNDLED / "deepseek-v3-calibrated.npz"), "--topology",
             "4x8", "--slots", "288", "--solver", solver, "-o", str(out), *extra)
    return r, out


def test_plugin_module_registers_a_policy(tmp_path):
    (tmp_path / "mypolicies.py").write_text(
        POLICY + "\nfrom eplb.solvers import register\nregister('rr_mod')(round_robin)\n")
    r, _ = _solve(tmp_path, "rr_mod")
    assert r.returncode == 2 and "unknown solver 'rr_mod'" in r.stderr
    r, out = _solve(tmp_path, "rr_mod", "--plugin", "mypolicies")
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["solver"]["name"] == "rr_mod"
    assert doc["phy2log"][0][:3] == [0, 1, 2] and doc["phy2log"][0][256] == 0
    r, _ = _solve(tmp_path, "rr_mod", "--plugin", "no_such_module_xyz")
    assert r.returncode == 2 and "no_such_module_xyz" in r.stderr and "Traceback" not in r.stderr


def test_entry_point_package_is_found_without_flags(tmp_path):
    pkg = tmp_path / "tinyplug"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(POLICY)
    info = tmp_path / "tinyplug-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tinyplug\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[eplb.solvers]\nrr_ep = tinyplug:round_robin\n")
    r, out = _solve(tmp_path, "rr_ep")
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["solver"]["name"] == "rr_ep"
    r = _run(tmp_path, "solve", "--help")
    assert "rr_ep" in r.stdout
