"""Issue 22 §1: ``EplbConfig(initial="placement.json")`` simulates the exact file an operator
deploys; the simulator's step loads under it equal `eplb evaluate`'s on the same counts."""

from __future__ import annotations

import numpy as np
import pytest

from eplb import Topology, solvers, traces
from eplb.errors import InputError
from eplb.evaluation import serving
from eplb.evaluation.align import with_layers
from eplb.evaluation.evaluate import evaluate
from eplb.evaluation.serving import workload as W
from eplb.evaluation.serving.config import EplbConfig, UnitConfig
from eplb.evaluation.serving.simulator.loop import Simulation
from eplb.evaluation.serving.steptime import RankBatch
from eplb.io import write_placement
from tests.conftest import BUNDLED

TRACE = BUNDLED / "deepseek-v3-calibrated.npz"


def _config(initial: str):
    base = serving.ClusterConfig.deepseek_day6()
    unit = UnitConfig(nodes=4, slots_per_layer=288, max_running_requests=64,
                      kv_capacity_tokens=base.decode.kv_capacity_tokens,
                      balancer="deepseek_decode")
    pre = UnitConfig(nodes=4, slots_per_layer=288, token_budget=8192,
                     balancer="deepseek_prefill")
    return base.replace(prefill=pre, decode=unit, name="file",
                        eplb=EplbConfig(solver="static", initial=initial))


@pytest.fixture(scope="module")
def solved():
    trace = traces.read(TRACE)
    topo = Topology.parse("4x8", 288)
    placement = with_layers(solvers.solve("greedy", trace.load(), topo, num_groups=8),
                            trace.layer_ids)
    return trace, placement, evaluate(placement, trace).layers["max_over_mean"].to_numpy()


@pytest.mark.parametrize("name", ["p.json", "p.npz", "p.jsonl"])
def test_simulator_step_loads_under_a_placement_file_equal_evaluate(tmp_path, solved, name):
    trace, placement, evaluated = solved
    write_placement(placement, tmp_path / name, layer_ids_are_model_ids=True)
    cfg = _config(str(tmp_path / name))
    wl = W.synthesize(8, rate=1.0, input_mean=200, output_mean=4, seed=0)
    sim = Simulation(cfg, wl, 0, 5.0, False, 1.0)
    sim.eplb.initial_placements()
    unit = sim.units["decode"][0]
    assert np.array_equal(unit.placement.phy2log, placement.phy2log)
    counts = trace.load()
    batch = RankBatch.uniform("decode", unit.G, tokens=64, context=1000)
    st = unit.sm.time(batch, unit.placement, counts)
    np.testing.assert_allclose(st.gpu_load_max / st.gpu_load_mean, evaluated, rtol=1e-9)


def test_initial_file_that_does_not_fit_is_refused(tmp_path):
    trace = traces.read(TRACE)
    p = solvers.solve("greedy", trace.load(), Topology.parse("2x8", 288))
    write_placement(p, tmp_path / "p.json")
    cfg = _config(str(tmp_path / "p.json"))
    wl = W.synthesize(8, rate=1.0, input_mean=200, output_mean=4, seed=0)
    with pytest.raises(InputError, match="eplb.initial"):
        Simulation(cfg, wl, 0, 5.0, False, 1.0).eplb.initial_placements()
    with pytest.raises(InputError, match="eplb.initial"):
        EplbConfig(initial=str(tmp_path / "missing.json")).check()
