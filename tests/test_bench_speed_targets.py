"""`benchmarks/bench_speed_targets.py` extrapolates CPU per simulated second to an hour: its
runs must stop when their arrivals stop. Since `duration_s` drains what was admitted (up to
600 s more), a run of `seconds` arrivals simulated far longer, and the fleet hour and the
sub-clusters' hour were overstated by that drain times `3600 / seconds`."""

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_speed_targets.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_speed_targets_under_test", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_sub_cluster_run_covers_only_its_arrival_seconds():
    bench = _bench()
    seconds = 1.0
    out = bench.sub_cluster_task({"prefill": 1, "decode": 1, "rate": bench.fleet_rate(1),
                                  "seconds": seconds, "seed": 0})
    assert out["requests"] > 0
    assert out["end_s"] == seconds  # no drain after the arrivals
