"""How ilp runs (issue 13): the time limit is wall seconds for the whole solve, deterministic
time gives reproducible runs, progress shows off a terminal, bound and gap are in the
metadata, and worker processes never outlive their parent (Linux process checks).

No assertion here depends on the machine's speed or load (issue 19): a run must stop on its
limit or its signal, not be fast; how fast it stops is measured by
``benchmarks/bench_ilp_runtime.py``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from eplb import InputError, Topology, solvers
from eplb import runners as workers
from eplb.solvers.primitives import ilp_layers

HARD = Topology(2, 4, 10)  # 80 slots


def _hard_load(layers: int = 4) -> np.ndarray:
    """Zipf loads on 64 experts: far from any analytic bound, so every layer is searched."""
    return np.random.default_rng(0).zipf(1.3, size=(layers, 64)).astype(float)


def test_time_limit_is_wall_seconds_for_the_whole_solve():
    load = _hard_load(6)
    p = solvers.solve("ilp", load, HARD, time_limit=3, workers=1, counts="free", progress=False)
    info = p.meta["solver"]
    assert info["time_limit"] == 3 and info["deterministic_time"] is None
    assert info["wall_limited"] >= 1  # the search was cut, and says so
    for key in ("objective", "bound", "gap", "status"):
        assert len(info[key]) == 6
    assert info["gap_max"] == max(info["gap"]) and info["bound_min"] == min(info["bound"])
    assert (np.array(info["bound"]) <= p.gpu_load(load).max(1) + 1e-9).all()


class _Clock:
    """A wall clock that moves only when told (``ilp_layers.time`` in the test below)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def time(self) -> float:
        return self.now


@pytest.mark.parametrize("workers_", [1, 2])
def test_the_time_left_is_shared_by_the_layers_still_to_search(monkeypatch, workers_):
    """The schedule gives each layer a share of the time left until ``start + time_limit``:
    the budgets of layers that use them fully add up to the limit, a slow layer leaves less
    to the others, and past the deadline a layer gets 0 (it keeps its warm start)."""
    clock = _Clock()
    monkeypatch.setattr(ilp_layers, "time", clock)
    sched = ilp_layers._Schedule(clock.now + 3.0, 6, workers_, workers.shared_value("i", 0))
    spent = 0.0
    for _ in range(0, 6, workers_):  # a round of layers starting together, one per worker
        budgets = [sched.next_budget() for _ in range(workers_)]
        assert all(b > 0 for b in budgets)
        clock.now += max(budgets)  # each uses its whole budget
        spent += max(budgets)
    assert spent == pytest.approx(3.0)
    sched = ilp_layers._Schedule(clock.now + 3.0, 3, 1, workers.shared_value("i", 0))
    first = sched.next_budget()
    assert first == pytest.approx(1.0)
    clock.now += 2.5  # the first layer overran its budget (model building on a busy machine)
    assert sched.next_budget() == pytest.approx(0.25)  # half of the 0.5 s left
    clock.now += 1.0  # past the deadline
    assert sched.next_budget() == 0.0


def test_deterministic_time_is_reproducible():
    load = _hard_load(2)
    kw = dict(workers=1, deterministic_time=0.2, counts="free", progress=False)
    a = solvers.solve("ilp", load, HARD, **kw)
    b = solvers.solve("ilp", load, HARD, **kw)
    assert a.equals(b)
    assert a.meta["solver"]["objective"] == b.meta["solver"]["objective"]
    assert a.meta["solver"]["wall_limited"] == 0


def test_progress_lines_when_not_a_terminal(capsys):
    load = _hard_load(12)
    solvers.solve("ilp", load, HARD, workers=1, deterministic_time=0.01, counts="fixed")
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("ilp layers: 10/12 layers")
    assert err[-1].startswith("ilp layers: 12/12 layers")
    solvers.solve(
        "ilp", load, HARD, workers=1, deterministic_time=0.01, counts="fixed", progress=False
    )
    assert capsys.readouterr().err == ""


def test_seed_beyond_cp_sat_is_one_clear_error():
    with pytest.raises(InputError, match="seed 9999999999999999999999999 is too large"):
        solvers.solve("ilp", np.ones((1, 8)), HARD, seed=9999999999999999999999999)
    with pytest.raises(InputError, match="too large"):
        solvers.solve("ilp", np.ones((1, 8)), HARD, seed=2**31, weighted=True)


def _boom(x):
    if x == 3:
        raise InputError("task 3 failed")
    return x * x


def _nested(x):
    return workers.run(_boom, [x, x + 1], workers=2)  # inside a daemon: runs inline


def test_daemonic_callers_run_inline():
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as p:  # Pool workers are daemons
        assert p.map(_nested, [0]) == [[0, 1]]


def test_worker_errors_reach_the_parent_and_stop_the_pool():
    assert workers.run(_boom, [0, 1, 2], workers=2) == [0, 1, 4]
    with pytest.raises(InputError, match="task 3 failed"):
        workers.run(_boom, list(range(6)), workers=2)


# ----------------------------------------------------------------- processes (Linux only)
SCRIPT = """
import numpy as np
from eplb import Topology, solvers
load = np.random.default_rng(0).zipf(1.3, size=(4, 64)).astype(float)
print("start", flush=True)
solvers.solve("ilp", load, Topology(2, 4, 10), workers=2, deterministic_time=600,
              counts="free", progress=False)
"""


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(d.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start() -> tuple[subprocess.Popen, list[int]]:
    """The solve of `SCRIPT` in a new session, once both workers are searching (each has
    spent a second of CPU: the model is built). Waits for that however busy the machine is,
    up to two minutes."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    kids: list[int] = []
    while time.monotonic() < deadline and len(kids) < 2:
        time.sleep(0.2)
        kids = [k for k in _children(proc.pid) if _alive(k)]
        assert proc.poll() is None, proc.stderr.read().decode()
    assert len(kids) >= 2, "workers did not start"
    while time.monotonic() < deadline and min(_cpu_seconds(k) for k in kids) < 1.0:
        time.sleep(0.2)
        assert proc.poll() is None, proc.stderr.read().decode()
    assert min(_cpu_seconds(k) for k in kids) >= 1.0, "workers did not get to the search"
    return proc, kids


def _kill_all(proc: subprocess.Popen, kids: list[int]) -> None:
    """SIGKILL the run ``proc`` and its workers ``kids`` that are still alive (cleanup)."""
    if proc.poll() is None:
        proc.kill()
    for k in kids:
        if _alive(k):
            os.kill(k, signal.SIGKILL)


def _gone(pids: list[int], within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(_alive(k) for k in pids):
            return True
        time.sleep(0.1)
    return False


linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")
# Limits far above what a healthy run takes, far below what a broken one does: uninterrupted,
# `SCRIPT` searches for 600 deterministic seconds per layer (more than 10 wall minutes), so a
# run that ends within STOP_WITHIN was stopped by the signal, however loaded the machine.
STOP_WITHIN = 60.0
GONE_WITHIN = 30.0  # polled: a passing run waits only until the workers are gone


@linux
def test_workers_die_with_a_killed_parent():
    proc, kids = _start()
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert _gone(kids, GONE_WITHIN), "workers outlived their parent"
    finally:
        for k in kids:
            if _alive(k):
                os.kill(k, signal.SIGKILL)


@linux
@pytest.mark.parametrize("group", [False, True])
def test_ctrl_c_stops_parent_and_workers_fast(group):
    """One Ctrl-C (to the parent alone, or to the whole group twice) ends everything."""
    proc, kids = _start()
    try:
        t = time.monotonic()
        if group:
            os.killpg(proc.pid, signal.SIGINT)
            time.sleep(0.05)
            os.killpg(proc.pid, signal.SIGINT)  # a second Ctrl-C must not hang
        else:
            os.kill(proc.pid, signal.SIGINT)
        proc.wait(timeout=STOP_WITHIN)
        assert time.monotonic() - t < STOP_WITHIN
        assert proc.returncode != 0  # stopped by the signal, not finished
        assert _gone(kids, GONE_WITHIN)
    finally:
        _kill_all(proc, kids)


class _Ticking:
    """A wall clock that moves ``step`` seconds at every reading (``ilp_model.time``)."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 1000.0, step

    def time(self) -> float:
        self.now += self.step
        return self.now

    def perf_counter(self) -> float:
        return self.now


def test_the_deadline_bounds_the_model_build(monkeypatch):
    """Issue 22: the wall limit covers building the model, not only CP-SAT's search. A clock
    that moves 10 ms per reading makes the 64-expert build outlast a 50 ms deadline: the
    layer stops building, searches nothing and keeps its start, marked as stopped by the
    wall (no dependence on the machine's speed)."""
    from eplb.solvers.primitives import ilp_model

    load = _hard_load(1)
    warm = solvers.solve("greedy", load, HARD).phy2log[0]
    pb = ilp_model.LayerProblem(load[0], HARD, warm, counts="free", deterministic_time=None)
    clock = _Ticking(0.01)
    monkeypatch.setattr(ilp_model, "time", clock)
    r = ilp_model.solve_layer(pb, wall=10.0, deadline=clock.now + 0.05)
    assert r.method == "skipped" and r.stopped == "wall" and r.status == "feasible"
    assert np.array_equal(r.slots, warm)


def test_time_limit_one_second_ends_the_whole_solve_in_time():
    """Issue 22 (``compare --solver ilp --time-limit 1`` took 4.7 s): the limit is the wall
    time of the whole solve, OR-Tools' import, model builds and presolve included. Generous
    margin (2.5 s for a 1 s limit); unbounded, this problem runs far longer (10 deterministic
    seconds per layer)."""
    load = _hard_load(6)
    t0 = time.perf_counter()
    p = solvers.solve("ilp", load, HARD, time_limit=1, workers=1, counts="free", progress=False)
    assert time.perf_counter() - t0 < 2.5
    assert p.meta["solver"]["wall_limited"] >= 1
