"""Trace reading speed: a 1,000-window x 58 x 256 trace in the native npz format against the same
data as long CSV and Parquet, read in the same process. Prints median seconds, file sizes and
each format's time as a multiple of the native read.

Run: ``python benchmarks/bench_traces.py [--windows 1000] [--repeat 5] [--skip-csv]``.
The native read must take well under a second; the script exits 1 if it takes >= 1 s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from eplb import traces  # noqa: E402
from eplb.traces import synth  # noqa: E402


def median_s(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--skip-csv", action="store_true", help="skip the slow CSV baseline")
    args = ap.parse_args()

    t0 = time.perf_counter()
    trace = synth.calibrated("deepseek-v3", windows=args.windows, tokens=16384, seed=0)
    print(f"trace: {trace} ({trace.counts.nbytes / 2**20:.0f} MiB of float64 counts), "
          f"generated in {time.perf_counter() - t0:.2f} s")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        files = {"npz (native, compressed)": Path(tmp) / "t.npz",
                 "npz (native, uncompressed)": Path(tmp) / "u.npz",
                 "parquet": Path(tmp) / "t.parquet"}
        if not args.skip_csv:
            files["csv"] = Path(tmp) / "t.csv"
        for name, path in files.items():
            t0 = time.perf_counter()
            if "uncompressed" in name:
                traces.write_npz(trace, path, compress=False)
            else:
                traces.write(trace, path)
            wrote = time.perf_counter() - t0
            assert traces.read(path).equals(trace, meta=name != "csv")  # also warms the cache
            repeat = args.repeat if name != "csv" else max(1, min(args.repeat, 2))
            sec = median_s(lambda p=path: traces.read(p), repeat)
            rows.append((name, sec, path.stat().st_size / 2**20, wrote))
    native = rows[0][1]
    print(f"{'format':<28}{'read s (median)':>16}{'x native':>10}{'MiB':>9}{'write s':>9}")
    for name, sec, mib, wrote in rows:
        print(f"{name:<28}{sec:>16.3f}{sec / native:>10.1f}{mib:>9.1f}{wrote:>9.2f}")
    load_s = median_s(trace.load, args.repeat)
    summ_s = median_s(trace.summary, args.repeat)
    print(f"trace.load() over all windows: {load_s * 1e3:.1f} ms; trace.summary(): "
          f"{summ_s * 1e3:.1f} ms")
    ok = native < 1.0
    print(f"native read {native:.3f} s: {'OK (< 1 s)' if ok else 'TOO SLOW (>= 1 s)'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
