"""The speed work of issue 36 changes no result: short simulations, Day-6-like workloads and
`greedy` placements on the bundled traces (and the six SGLang dumps when present) digest to
what the code before it produced (`tests/speed_cases.py`; the digests were written by commit
09e648d)."""

from __future__ import annotations

import json

import pytest

from eplb.evaluation import serving
from eplb.solvers.primitives import jit
from tests import speed_cases

EXPECTED = json.loads(speed_cases.DIGESTS.read_text())


@pytest.mark.parametrize("name", sorted(EXPECTED["sim"]))
def test_simulation_frames_unchanged(name):
    cfg, wl, secs = speed_cases.sim_cases()[name]
    res = serving.simulate(cfg, wl, seed=0, duration_s=secs, progress=False)
    assert speed_cases.sim_digest(res) == EXPECTED["sim"][name]


@pytest.mark.parametrize("name", sorted(EXPECTED["workload"]))
def test_workload_unchanged(name):
    wl = speed_cases.workload_cases()[name]()
    assert speed_cases.digest_frame(wl.requests) == EXPECTED["workload"][name]


@pytest.mark.parametrize("use_jit", [True, False])
def test_greedy_bundled_unchanged(monkeypatch, use_jit):
    if not use_jit:  # the numpy code (no numba, or EPLB_NO_JIT=1)
        monkeypatch.setattr(jit, "_KERNELS", False)
    elif not jit.available():
        pytest.skip("numba not installed (the fast extra)")
    for name, load in speed_cases.greedy_loads(None).items():
        for cfg in speed_cases.GREEDY_CONFIGS:
            assert speed_cases.greedy_digest(load, cfg) == EXPECTED["greedy"][name][cfg], (
                name, cfg)


def test_greedy_sglang_dumps_unchanged(deepseek_jsons):
    shared = deepseek_jsons[0].parents[1]
    loads = speed_cases.greedy_loads(shared)
    for path in deepseek_jsons:
        for cfg in speed_cases.GREEDY_CONFIGS:
            got = speed_cases.greedy_digest(loads[path.name], cfg)
            assert got == EXPECTED["greedy"][path.name][cfg], (path.name, cfg)
