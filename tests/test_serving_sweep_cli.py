"""`eplb simulate` comparisons, sweeps, capacity and --print-config; config overrides; the
rate sweep's rows."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from eplb.errors import InputError
from eplb.evaluation import serving
from eplb.evaluation.serving import sweep
from eplb.evaluation.serving.config import overrides
from tests._cli import run_cli
from tests.test_serving_capacity import tiny


def eplb(*args) -> SimpleNamespace:
    """The CLI in this process (its subprocess start-up is tested in test_serving_sim_cli)."""
    code, out, err = run_cli(*args)
    return SimpleNamespace(returncode=code, stdout=out, stderr=err)


SYNTH = "synth:n=40,rate=8,input_mean=1500,output_mean=12,hit_rate=0.3,open_sessions=16,seed=3"


@pytest.fixture(scope="module")
def toml(tmp_path_factory):
    path = tmp_path_factory.mktemp("cfg") / "tiny.toml"
    tiny().write_toml(path)
    return path


def test_overrides_apply_and_fail_clearly():
    cfg = tiny()
    out = overrides.apply(cfg, ["eplb.solver=greedy", "decode.count=2", "slo.ttft_s=1.5",
                                "name=x"])
    assert (out.eplb.solver, out.decode.count, out.slo.ttft_s, out.name) == (
        "greedy", 2, 1.5, "x")
    assert overrides.apply(cfg, []) is cfg
    with pytest.raises(InputError, match="eplb.solverr"):
        overrides.apply(cfg, ["eplb.solverr=greedy"])
    with pytest.raises(InputError, match="not KEY=VALUE"):
        overrides.apply(cfg, ["eplb.solver"])
    assert overrides.parse_variant("g:eplb.solver=greedy,eplb.options={a = 1, b = 2}") == (
        "g", ["eplb.solver=greedy", "eplb.options={a = 1, b = 2}"])


def test_rate_sweep_rows_and_served_fraction():
    wl = serving.workload.synthesize(30, rate=8.0, input_mean=1500, output_mean=12,
                                     hit_rate=0.3, open_sessions=16, seed=3)
    frame = sweep.rate_sweep([tiny()], wl, [4.0, 40.0], seeds=[0], progress=False)
    assert list(frame["offered_rate"]) == [4.0, 40.0]
    assert frame["served_fraction"].between(0, 1).all()
    assert frame["goodput"].between(0, 1).all()
    # the same trace offered faster: TTFT (censored, client-side) never falls
    assert frame["ttft_p50_s"].iloc[0] <= frame["ttft_p50_s"].iloc[1]
    assert "offered (req/s)" in sweep.sweep_table(frame)


def test_sweep_table_prints_the_comparison_interval_with_two_seeds():
    import math

    from scipy import stats

    from eplb.evaluation.serving import metrics
    from eplb.evaluation.serving.intervals import proportion_ci

    def frame(seeds):
        rows = [{"config": "a", "offered_rate": r, "seed": s,
                 **{c: 1.0 + r + 0.25 * s * (i + 1) for i, c in enumerate(metrics.SWEEP)},
                 # fractions of 100 requests, overloaded at seed 1 only
                 "goodput": 0.9 + 0.05 * s, "served_fraction": 1.0, "overloaded": float(s),
                 "bottleneck": "prefill" if s else "", "requests": 100.0,
                 "requests_decided": 100.0}
                for r in (4.0, 40.0) for s in seeds]
        return pd.DataFrame(rows)

    one = sweep.sweep_table(frame([0]))
    assert "±" not in one and not one.startswith("mean")
    two = sweep.sweep_table(frame([0, 1]))
    head, _, table = two.partition("\n\n")
    assert head.startswith("mean ± h over 2 seeds") and "95% confidence interval" in head
    assert "Wilson" in head
    line = table.splitlines()[2]  # rate 4: first column's values 5.0 and 5.25
    half = stats.t.ppf(0.975, 1) * pd.Series([5.0, 5.25]).std(ddof=1) / math.sqrt(2)
    assert line.split()[2:5] == ["5.125", "±", f"{half:.4g}"]
    assert line.count("±") == len(metrics.SWEEP) - len(metrics.FRACTIONS) - 1
    # fractions: pooled with Wilson's interval, never past 1 (served 200 of 200)
    p, lo, hi = proportion_ci([0.9, 0.95], [100, 100])
    assert f"0.925 [{lo:.4g}, {hi:.4g}]" in line and 0 < lo < 0.925 < hi < 1
    assert "1 [" in line and ", 1]" in line
    assert "1/2 (prefill)" in line  # overloaded at one seed of two, at prefill
    # a metric no seed has a value for prints as - with no interval
    f = frame([0, 1])
    f["goodput"] = float("nan")
    assert "- [-, -]" in sweep.sweep_table(f)
    f["tpot_p50_s"] = float("nan")
    assert "- ± -" in sweep.sweep_table(f)


def test_print_config_round_trips(tmp_path):
    r = eplb("simulate", "--print-config", "deepseek_day6", "--set", "decode.count=3")
    assert r.returncode == 0, r.stderr
    path = tmp_path / "c.toml"
    path.write_text(r.stdout)
    cfg = serving.ClusterConfig.load(path)
    assert cfg == serving.ClusterConfig.deepseek_day6().replace(
        decode=cfg.decode) and cfg.decode.count == 3


def test_compare_table_with_variants_and_seeds(toml, tmp_path):
    out = tmp_path / "cmp"
    r = eplb("simulate", toml, "--workload", SYNTH, "--variant",
             "trivial:eplb.solver=static,eplb.initial=trivial", "--variant",
             "bal:eplb.solver=balanced", "--seeds", "0,1", "--mode", "counterfactual",
             "--baseline", "trivial", "--no-progress", "-o", out)
    assert r.returncode == 0, r.stderr
    assert "95% CI" in r.stdout and "d vs trivial" in r.stdout
    frame = pd.read_csv(out / "results.csv")
    assert list(dict.fromkeys(frame["config"])) == ["trivial", "tiny", "bal"]
    assert (frame.loc[frame["config"] == "bal", "d_decode_step_s"] < 0).all()


def test_sweep_and_capacity_from_the_cli(toml, tmp_path):
    out = tmp_path / "sw"
    r = eplb("simulate", toml, "--workload", SYNTH, "--rates", "4,40", "--no-progress",
             "-o", out)
    assert r.returncode == 0, r.stderr
    assert (out / "rate_sweep.png").stat().st_size > 0
    assert len(pd.read_csv(out / "results.csv")) == 2
    assert "±" not in r.stdout  # one seed: the values alone
    assert "different slice" not in r.stdout  # no --duration: the same requests at each rate
    r = eplb("simulate", toml, "--workload", SYNTH, "--rates", "4,40", "--duration", "5",
             "--no-progress", "--no-plots")
    assert r.returncode == 0 and "measures a different slice" in r.stdout, r.stderr
    r = eplb("simulate", toml, "--workload", SYNTH, "--rates", "4,40", "--seeds", "0,1",
             "--no-progress", "--no-plots")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("mean ± h over 2 seeds: h is the half width of the 95% ")
    m = serving.metrics
    assert r.stdout.count("±") == 1 + 2 * (len(m.SWEEP) - len(m.FRACTIONS) - 1)
    r = eplb("simulate", toml, "--workload", SYNTH, "--capacity", "--rel-tol", "0.3",
             "--set", "slo.ttft_s=1.0",
             "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "goodput_hi (fraction)" in r.stdout and "rate (req/s)" in r.stdout  # units
    assert r.stdout.startswith("every config with --set slo.ttft_s=1.0\n")  # names unchanged


@pytest.mark.parametrize("args, match", [
    (["--set", "eplb.nope=1"], "eplb.nope"),
    (["--variant", "x"], "NAME:KEY=VALUE"),
    (["--rates", "1,x"], "--rates"),
    (["--seeds", "0,-1"], "--seeds"),
    (["--baseline", "zz", "--seeds", "0,1"], "--baseline"),
])
def test_bad_study_input_is_one_error_line(toml, args, match):
    r = eplb("simulate", toml, "--workload", SYNTH, *args)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("eplb: error:") and match in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_no_folder_left_on_failure(toml, tmp_path):
    out = tmp_path / "never"
    r = eplb("simulate", toml, "--workload", SYNTH, "--rates", "4", "--set",
             "slo.ttft_s=-1", "-o", out)
    assert r.returncode == 2 and not out.exists()


def test_comparison_text_rounds_float_noise_and_counts_rebalances():
    """Seconds below a picosecond (a difference of float sums) print as 0, and each config's
    scheduled rebalances are listed, so identical rows of a run that never rebalanced say why."""
    frame = pd.DataFrame({
        "config": ["a", "a", "b", "b"], "seed": [0, 1, 0, 1],
        "decode_comm_exposed_s": [-1.4e-18, 2.0e-19, 3.0e-3, 3.1e-3],
        "rebalances": [0.0, 0.0, 2.0, 2.0],
    })
    text = sweep.comparison_text(frame, ["decode_comm_exposed_s"])
    assert "e-18" not in text and "e-19" not in text and "0.003" in text
    assert "scheduled rebalances per run (mean over seeds): a 0, b 2" in text
    assert "initial placement throughout" in text
