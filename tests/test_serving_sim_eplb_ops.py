"""EPLB as operators run it: an emergency patch after a GPU failure re-homes only the orphaned
experts (one move each, every expert served) and the next scheduled rebalance re-balances
fully; rebalances predicted to gain under ``eplb.min_gain`` are skipped and counted; the
faults' stalls and the summary agree; no rebalance at the end; plots stop at the end."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eplb.errors import InfeasibleError, InputError
from eplb.evaluation import serving
from eplb.evaluation.serving.config import EplbConfig
from eplb.evaluation.serving.results import plots
from eplb.evaluation.serving.simulator.planner import emptied, patch_orphans
from eplb.placement import Placement
from eplb.testing import strategies as S
from tests.test_serving_sim import small_config, small_workload

T_FAIL = 12.0


@st.composite
def failed_placements(draw):
    """``(degraded, load)``: a random placement with some GPUs failed (`emptied`), optionally
    with replica shares, and a load."""
    topo = draw(S.topologies(max_nodes=2, max_gpus_per_node=4, max_slots=4, min_slots=2))
    G = topo.num_gpus
    E = draw(st.integers(1, max(1, topo.num_slots - topo.slots_per_gpu)))
    load = draw(S.loads(st.integers(1, 3), E))
    live = draw(S.placements(load, topo))
    if draw(st.booleans()):  # weighted replicas
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        raw = rng.random(live.phy2log.shape) + 0.05
        L = live.num_layers
        flat = live.phy2log + (np.arange(L) * E)[:, None]
        sums = np.bincount(flat.ravel(), raw.ravel(), L * E).reshape(L, E)
        share = raw / np.take_along_axis(sums, live.phy2log, 1)
        live = Placement(live.phy2log, E, topo, share).validate()
    k = draw(st.integers(1, G - 1)) if G > 1 else 0
    failed = draw(st.lists(st.integers(0, G - 1), min_size=k, max_size=k, unique=True))
    ftopo = topo.with_failed(tuple(failed)) if failed else topo
    return emptied(live, ftopo), load


def _moves(old: Placement, new: Placement) -> list[int]:
    """Per layer: replicas ``new`` puts on a GPU that did not hold that expert in ``old``
    (a multiset difference per GPU, in plain Python)."""
    G, S = new.topology.num_gpus, new.topology.slots_per_gpu
    out = []
    for a, b in zip(old.phy2log, new.phy2log, strict=True):
        n = 0
        for g in range(G):
            had = Counter(int(x) for x in a[g * S:(g + 1) * S] if x >= 0)
            got = Counter(int(x) for x in b[g * S:(g + 1) * S] if x >= 0)
            n += sum((got - had).values())
        out.append(n)
    return out


@settings(max_examples=60, deadline=None)
@given(failed_placements())
def test_patch_moves_only_the_orphans_and_serves_every_expert(case):
    degraded, load = case
    topo = degraded.topology
    orphans = degraded.logcnt == 0  # [L, E]
    if int(topo.slot_alive.sum()) < degraded.num_experts:
        with pytest.raises(InfeasibleError):
            patch_orphans(degraded, load)
        return
    new = patch_orphans(degraded, load)
    new.validate()  # every expert has a replica, none on a failed GPU
    assert (new.logcnt >= 1).all()
    # one move per orphaned (layer, expert): the fewest there are (counted independently)
    assert _moves(degraded, new) == orphans.sum(1).tolist()
    changed = new.phy2log != degraded.phy2log  # [L, P]
    assert (changed.sum(1) == orphans.sum(1)).all()
    layer, slot = np.nonzero(changed)
    assert orphans[layer, new.phy2log[layer, slot]].all()  # a changed slot holds an orphan
    assert (new.logcnt[orphans] == 1).all()
    assert (new.logcnt[~orphans] <= degraded.logcnt[~orphans]).all()
    # the tokens of every layer are all served (shares of each expert sum to 1)
    np.testing.assert_allclose(new.gpu_load(load).sum(1), load.sum(1), rtol=1e-9)


def test_patch_without_orphans_changes_nothing():
    topo = serving.ClusterConfig.deepseek_day6().topology("decode").with_failed((3,))
    live = Placement(np.tile(np.arange(topo.num_slots) % 256, (2, 1)), 256, topo.with_failed(()))
    degraded = emptied(live, topo)
    assert (degraded.logcnt >= 1).all()
    assert np.array_equal(patch_orphans(degraded, np.ones((2, 256))).phy2log, degraded.phy2log)


@pytest.fixture(scope="module")
def failures():
    """A decode GPU failure on the small cluster under each emergency mode (``min_gain``
    high, so every scheduled rebalance but the first after the failure is skipped)."""
    wl = small_workload(n=160, rate=8.0, seed=21, output_mean=80)
    out = {}
    for mode in ("patch", "resolve"):
        cfg = small_config(faults=[serving.GpuFailure(T_FAIL, ("decode", 0), gpu=5)])
        cfg = cfg.replace(eplb=replace(cfg.eplb, emergency=mode, min_gain=0.99,
                                       rebalance_interval_s=10.0, history_s=10.0))
        out[mode] = serving.simulate(cfg, wl, seed=0, duration_s=45.0, progress=False)
    return out


def test_emergency_patch_in_the_loop(failures):
    res = failures["patch"]
    f = res.faults.iloc[0]
    assert f["orphaned_experts"] > 0
    assert f["emergency_replicas_moved"] == f["orphaned_experts"]  # one move per orphan
    resolve = failures["resolve"].faults.iloc[0]
    assert resolve["orphaned_experts"] == f["orphaned_experts"]
    assert resolve["emergency_replicas_moved"] > 3 * f["emergency_replicas_moved"]
    rb = res.rebalances
    em = rb[rb["kind"] == "emergency"]
    assert len(em) == 1 and em["solver"].iloc[0] == "patch" and em["time_s"].iloc[0] == T_FAIL
    assert em["replicas_moved"].iloc[0] == f["emergency_replicas_moved"]
    # the first scheduled decode rebalance after the failure re-balances fully (never skipped,
    # whatever min_gain); every other one is skipped at min_gain 0.99
    dec = rb[(rb["phase"] == "decode") & (rb["kind"] != "emergency")]
    after = dec[dec["time_s"] > T_FAIL]
    assert after["kind"].iloc[0] == "scheduled" and after["replicas_moved"].iloc[0] > 0
    assert (after["kind"].iloc[1:] == "skipped").all() and len(after) >= 2
    assert (dec[dec["time_s"] < T_FAIL]["kind"] == "skipped").all()
    s = res.summary()
    assert s["emergency_placements"] == 1
    assert s["emergency_replicas_moved"] == f["emergency_replicas_moved"]
    assert s["rebalances"] == int((rb["kind"] == "scheduled").sum()) >= 1
    assert s["rebalances_skipped"] == int((rb["kind"] == "skipped").sum()) >= 3


def test_fault_stalls_agree_with_the_summary(failures):
    for res in failures.values():
        f = res.faults
        rb = res.rebalances
        assert (f["stall_s"] > 0).all()
        # overlap mode: the only stalls are the emergency copies, in both tables
        assert res.summary()["stall_s"] == pytest.approx(f["stall_s"].sum(), rel=1e-12)
        assert rb.loc[rb["kind"] == "emergency", "stall_s"].sum() == pytest.approx(
            f["stall_s"].sum(), rel=1e-12
        )
        # and the unit ran no step for that long after the failure
        dec = res.steps[res.steps["phase"] == "decode"]
        ends = dec["start_s"] + dec["duration_s"]
        before = ends[dec["start_s"] <= T_FAIL].max()  # the step in flight at the failure
        nxt = dec[dec["start_s"] > T_FAIL]["start_s"].min()
        assert nxt >= max(before, T_FAIL) + f["stall_s"].iloc[0] - 1e-9


def test_skipped_rebalances_move_nothing():
    wl = small_workload(n=80, rate=6.0, seed=22)
    runs = {}
    for gain in (0.99, -1.0):
        cfg = small_config()
        cfg = cfg.replace(eplb=replace(cfg.eplb, min_gain=gain, rebalance_interval_s=8.0,
                                       history_s=8.0))
        runs[gain] = serving.simulate(cfg, wl, seed=0, duration_s=30.0, progress=False)
    rb = runs[0.99].rebalances
    n = len(rb)  # t = 8, 16, 24 on both units, where the unit recorded load to place from
    assert n >= 4 and (rb["kind"] == "skipped").all()
    assert (rb["replicas_moved"] == 0).all() and (rb["bytes_moved"] == 0).all()
    assert (rb["predicted_gain"] < 0.99).all()
    assert (runs[0.99].steps["placement_version"] == 1).all()  # the initial placement stays
    s = runs[0.99].summary()
    assert (s["rebalances"], s["rebalances_skipped"], s["bytes_moved"]) == (0, n, 0.0)
    rb = runs[-1.0].rebalances
    assert (rb["kind"] == "scheduled").all() and len(rb) == n
    assert runs[-1.0].summary()["rebalances"] == n
    assert runs[-1.0].steps["placement_version"].max() > 1
    # up to the first rebalance the runs are the same: the same solve, skipped or applied
    first = [r.rebalances[r.rebalances["time_s"] == 8.0]["predicted_gain"] for r in runs.values()]
    np.testing.assert_array_equal(first[0].to_numpy(), first[1].to_numpy())


def test_no_rebalance_at_the_end_and_plots_stop_there(monkeypatch, tmp_path):
    cfg = small_config()
    cfg = cfg.replace(eplb=replace(cfg.eplb, rebalance_interval_s=20.0, history_s=20.0))
    res = serving.simulate(cfg, small_workload(n=200, rate=4.5, seed=23), seed=0,
                           duration_s=40.0, progress=False)
    rb = res.rebalances
    assert (rb["time_s"] < 40.0).all() and len(rb) == 2  # t = 20 on both units, not t = 40
    assert res.summary()["rebalances"] == 2
    # arrivals stop at 40 s, the run drains after them (no rebalance then), plots stop at its end
    end = res.meta["end_s"]
    assert end > 40.0 and res.utilisation["decode0"].index.max() >= 40.0
    figs = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figs.append(fig) or path)
    plots.utilisation(res, tmp_path / "u.png")
    plots.throughput(res, tmp_path / "t.png")
    for fig in figs:
        for ax in fig.axes:
            if ax.get_label() != "<colorbar>":
                assert ax.get_xlim()[1] <= end + 1e-9


def test_eplb_options_round_trip_and_checks(tmp_path):
    cfg = small_config(eplb=EplbConfig(emergency="repair", emergency_tolerance=0.05,
                                       min_gain=0.01))
    (tmp_path / "c.toml").write_text(cfg.to_toml(), encoding="utf-8")
    assert "min_gain = 0.01" in cfg.to_toml()
    back = serving.ClusterConfig.from_toml(tmp_path / "c.toml")
    assert back.eplb == cfg.eplb
    assert EplbConfig().emergency == "patch" and EplbConfig().min_gain == 0.0
    for bad, match in (
        (dict(emergency="fresh"), "eplb.emergency"),
        (dict(min_gain=1.5), "eplb.min_gain"),
        (dict(min_gain="x"), "eplb.min_gain"),
        (dict(emergency_tolerance=-0.1), "eplb.emergency_tolerance"),
    ):
        with pytest.raises(InputError, match=match):
            small_config(eplb=EplbConfig(**bad))


def test_documented_eplb_comparison_shows_an_effect():
    """The comparison in docs/serving.md ("EPLB in a comparison"), run as written."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "serving.md").read_text("utf-8")
    block = doc.split("<!-- doc-eplb-compare:begin -->")[1].split("<!-- doc-eplb-compare:end")[0]
    code = block.strip().removeprefix("```python").removesuffix("```")
    namespace: dict = {}
    exec(compile(code, "docs/serving.md", "exec"), namespace)
    frame = namespace["frame"].set_index("config")
    static, deepseek = frame.loc["static"], frame.loc["deepseek"]
    assert static["rebalances"] == 0 and deepseek["rebalances"] >= 2
    balance = "decode_gpu_load_max_over_mean"
    assert deepseek[balance] < 0.95 * static[balance]
    assert deepseek["r_tpot_p50_s"] < 0 and deepseek["d_tpot_p50_s"] < 0
