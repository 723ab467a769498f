"""The spec dataclasses of the sweeps (issue 32 part 5): `CompareSpec` (what `compare` runs) and
`SweepSpec` (what `rate_sweep` runs) are checked once when built, and a spec and the keywords it
replaces give the same table."""

from __future__ import annotations

import pandas as pd
import pytest

from eplb import InputError, TopologyError
from eplb.evaluation.compare import CompareSpec, compare
from eplb.evaluation.serving import sweep, workload
from eplb.evaluation.serving.sweep import SweepSpec
from tests.test_eval_compare import STABLE, small_traces
from tests.test_serving_capacity import tiny


def test_compare_spec_and_its_keywords_give_the_same_table():
    traces = small_traces()
    spec = CompareSpec(solvers=("deepseek",), topologies="2x2:16,1x4+4", holdout=0.34, seed=3)
    by_spec = compare(traces, spec, progress=False).summary[STABLE]
    by_keywords = compare(traces, solvers=["deepseek"], topologies="2x2:16,1x4+4",
                          holdout=0.34, seed=3, progress=False).summary[STABLE]
    pd.testing.assert_frame_equal(by_spec, by_keywords)
    assert [t.text for t in spec.specs] == ["2x2:16", "1x4+4"]


def test_compare_spec_is_checked_when_built():
    with pytest.raises(InputError, match="unknown dispatch policy"):
        CompareSpec(policy="nope")
    with pytest.raises(InputError, match="holdout"):
        CompareSpec(holdout=1.0)
    with pytest.raises(TopologyError, match="is not NxG:SLOTS"):
        CompareSpec(topologies="four")
    with pytest.raises(InputError, match="solvers must be a list"):
        CompareSpec(solvers="deepseek")
    with pytest.raises(InputError, match="unknown solver"):
        CompareSpec(solvers=("nope",)).solver_names()


def test_compare_takes_a_spec_or_keywords_not_both():
    traces = small_traces()
    with pytest.raises(InputError, match="not both"):
        compare(traces, CompareSpec(), seed=1)
    with pytest.raises(InputError, match="no keyword 'sead'"):
        compare(traces, sead=1)
    with pytest.raises(InputError, match="CompareSpec"):
        compare(traces, {"seed": 1})


def test_sweep_spec_and_its_keywords_give_the_same_rows():
    wl = workload.synthesize(20, rate=8.0, input_mean=1500, output_mean=12, hit_rate=0.3,
                             open_sessions=16, seed=3)
    spec = SweepSpec((4.0, 40.0), seeds=(0, 1))
    cols = ["config", "offered_rate", "seed", "served_fraction", "ttft_p50_s"]
    by_spec = sweep.rate_sweep([tiny()], wl, spec, progress=False)[cols]
    by_keywords = sweep.rate_sweep([tiny()], wl, [4.0, 40.0], seeds=[0, 1], progress=False)[cols]
    pd.testing.assert_frame_equal(by_spec, by_keywords)
    assert by_spec["offered_rate"].tolist() == [4.0, 4.0, 40.0, 40.0]
    with pytest.raises(InputError, match="not both"):
        sweep.rate_sweep([tiny()], wl, spec, seeds=[2], progress=False)


def test_sweep_spec_is_checked_when_built():
    with pytest.raises(InputError, match="rates must be req/s > 0"):
        SweepSpec((4.0, -1.0))
    with pytest.raises(InputError, match="at least one rate"):
        SweepSpec(())
    with pytest.raises(InputError, match="at least one seed"):
        SweepSpec((4.0,), seeds=())
    with pytest.raises(InputError, match="seeds must be integers"):
        SweepSpec((4.0,), seeds=("a",))
    assert SweepSpec([1, 2.5]).rates == (1.0, 2.5)
