"""Calibration of the step-time model (scripts/calibrate_serving.py), as a test.

Stated bounds (the script's constants): every fitted point within `LOO_TOL` (15%) in sample
and leave-one-out; the prediction row within `PREDICTION_TOL`; the stored fitted constants
within 1% of a fresh fit; `--check` fails when any of these is missed.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "calibrate_serving.py"


@pytest.fixture(scope="module")
def calib():
    sys.path.insert(0, str(SCRIPT.parent))  # as running the script does (its `docblock`)
    spec = importlib.util.spec_from_file_location("calibrate_serving", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["calibrate_serving"] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("calibrate_serving", None)
        sys.path.remove(str(SCRIPT.parent))


@pytest.fixture(scope="module")
def rows(calib):
    return calib.leave_one_out(), calib.other_rows()


def test_stored_constants_are_the_fit(calib):
    fresh = calib.fit()
    for name, drift in calib.drift(calib.FITTED, fresh).items():
        assert drift <= calib.FIT_DRIFT_TOL, (name, drift)


def test_every_fitted_point_within_the_bound_in_and_out_of_sample(calib, rows):
    loo, other = rows
    assert [r["point"] for r in loo] == [p.name for p in calib.POINTS]
    for r in loo:
        # leave-one-out really refits: the constants differ from the stored ones
        assert r["loo_fit"] != calib.FITTED
    assert calib.failures(None, loo, other) == []
    kinds = {r["kind"] for r in other}
    assert kinds == {"prediction", "same"}


def test_pinned_constants_are_read_off_the_kernel_tables(calib):
    """Four constants come from measured kernel rows, not from the end-to-end fit: the stored
    ones equal a fresh derivation (and the prefill attention table too), and the derivation
    does not depend on the SGLang throughputs at all (the fit's only free constant is
    engine_efficiency)."""
    base, pins, table = calib.pinned_fit()
    assert set(pins) == {"gemm_efficiency", "grouped_gemm_efficiency",
                         "prefill_attention_tflops", "layer_overhead_s"}
    for name, p in pins.items():
        assert getattr(calib.FITTED, name) == pytest.approx(p.value, rel=calib.FIT_DRIFT_TOL)
        lo, hi = p.interval
        assert lo <= p.value <= hi
    assert calib.table_drift(table) <= calib.FIT_DRIFT_TOL
    assert base.engine_efficiency == 1.0
    fresh = calib.fit(base=base)
    for name in pins:
        assert getattr(fresh, name) == getattr(base, name)  # the fit leaves them alone


def test_leave_one_out_is_the_worst_over_starts_and_the_interval_brackets_the_fit(calib, rows):
    loo, _ = rows
    for r in loo:
        starts = r["loo_starts"]
        assert [x0 for x0, _, _ in starts] == list(calib.STARTS)
        assert abs(r["loo_error"]) == max(abs(e) for _, _, e in starts)
    lo, hi = calib.fitted_interval(calib.FITTED, step=0.02)
    assert lo < calib.FITTED.engine_efficiency < hi
    # at an edge (just outside) some fitted point leaves the bound
    from dataclasses import replace
    for x in (lo - 2e-3, hi + 2e-3):
        vals = calib.point_values(replace(calib.FITTED, engine_efficiency=x))
        worst = max(abs(v / p.published - 1) for v, p in zip(vals, calib.POINTS, strict=True))
        assert worst > calib.LOO_TOL


def test_check_fails_when_a_leave_one_out_error_exceeds_the_bound(calib, rows, monkeypatch):
    loo, other = rows
    worst = max(abs(r["loo_error"]) for r in loo)
    monkeypatch.setattr(calib, "LOO_TOL", worst / 2)
    bad = calib.failures(None, loo, other)
    assert any("loo error" in msg for msg in bad)
    # and through main(): the same rows, exit status 1
    monkeypatch.setattr(calib, "fit", lambda exclude=None, base=None: calib.FITTED)
    monkeypatch.setattr(calib, "leave_one_out", lambda stored=None: loo)
    args = ["--check", "--skip-day6"]
    assert calib.main(args) == 1
    monkeypatch.setattr(calib, "LOO_TOL", 1.0)
    assert calib.main(args) == 0
