"""How punctually ``ilp`` stops: wall seconds past ``time_limit``, and from Ctrl-C to exit.

The tests check that a run stops on its limit or its signal (tests/test_solvers_ilp_runtime.py);
how far past the limit it runs depends on the machine and its load, so it is measured here:

1. ``time_limit`` 1 / 3 / 10 s on 6 Zipf layers (64 experts, 2 x 4 GPUs, 80 slots; every layer is
   searched): wall seconds, overshoot (wall - limit: model building of the last layer, start-up),
   layers cut by the limit;
2. Ctrl-C: a 2-worker solve that would search for 600 deterministic seconds per layer gets one
   SIGINT once its workers are searching; seconds until the process and its workers are gone.

Run: ``python benchmarks/bench_ilp_runtime.py [--limits 1 3 10] [--repeat 3]``. Before issue 19
the test asserted an overshoot below 2.5 s at ``time_limit=3`` and an exit within 6 s of Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from eplb import Topology, solvers

HARD = Topology(2, 4, 10)
SCRIPT = """
import numpy as np
from eplb import Topology, solvers
load = np.random.default_rng(0).zipf(1.3, size=(4, 64)).astype(float)
solvers.solve("ilp", load, Topology(2, 4, 10), workers=2, deterministic_time=600,
              counts="free", progress=False)
"""


def _load(layers: int) -> np.ndarray:
    return np.random.default_rng(0).zipf(1.3, size=(layers, 64)).astype(float)


def time_limits(limits: list[float], repeat: int) -> None:
    print("time_limit  wall s (median)  overshoot s (max)  layers cut by the limit")
    for limit in limits:
        walls, cut = [], 0
        for _ in range(repeat):
            t = time.perf_counter()
            p = solvers.solve(
                "ilp", _load(6), HARD, time_limit=limit, workers=1, counts="free", progress=False
            )
            walls.append(time.perf_counter() - t)
            cut = p.meta["solver"]["wall_limited"]
        over = max(walls) - limit
        print(f"{limit:10.1f}  {statistics.median(walls):14.2f}  {over:17.2f}  {cut}/6")


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(d.name))
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _cpu(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ctrl_c(repeat: int) -> None:
    if not sys.platform.startswith("linux"):
        print("Ctrl-C: skipped (reads /proc)")
        return
    stops = []
    for _ in range(repeat):
        proc = subprocess.Popen(
            [sys.executable, "-c", SCRIPT], start_new_session=True, stderr=subprocess.DEVNULL
        )  # its KeyboardInterrupt traceback is expected
        kids: list[int] = []
        while len(kids) < 2 or min(_cpu(k) for k in kids) < 1.0:
            time.sleep(0.2)
            kids = _children(proc.pid)
        t = time.monotonic()
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(timeout=120)
        while any(_alive(k) for k in kids) and time.monotonic() - t < 120:
            time.sleep(0.05)
        stops.append(time.monotonic() - t)
    print(f"Ctrl-C to exit: median {statistics.median(stops):.2f} s, max {max(stops):.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limits", nargs="*", type=float, default=[1.0, 3.0, 10.0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    time_limits(args.limits, args.repeat)
    ctrl_c(args.repeat)


if __name__ == "__main__":
    main()
