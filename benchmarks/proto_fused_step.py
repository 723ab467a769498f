"""Prototype (not used by eplb): what a compiled helper would save on the simulator's per-step
GPU-side chain, measured against today's numpy chain in the same process on the same inputs.

The chain of one step under `even` dispatch (`StepLoads.draw` -> `Routing.slot_picks` ->
`per_gpu` and `TabulatedCurve.seconds` -> `per_gpu`): draw the step's expert counts
``float64[L, E]`` (mean + banked noise, clipped at 0), gather them to the slots
``float64[L, P]`` times each slot's share and the scale, then per GPU the picks received and
the routed-expert seconds ``float64[L, G]``. ``fused`` does it in one loop with numba, with the
same floating-point operations in the same order, and the script checks the outputs are equal
bit for bit before timing. Needs numba (``pip install numba``; not an eplb dependency).

    python benchmarks/proto_fused_step.py [--phase decode] [--repeat 2000]

Issue 36: the decode step's numpy chain sets a floor under the simulator's cost per step (a few
dozen calls on 16,704-element arrays); this measures how much of it a compiled loop removes.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from eplb import solvers  # noqa: E402
from eplb.evaluation import serving  # noqa: E402
from eplb.evaluation.serving.simulator.expert_loads import Popularity, StepLoads  # noqa: E402
from eplb.evaluation.serving.steptime import StepModel  # noqa: E402
from eplb.evaluation.serving.steptime.routing import per_gpu  # noqa: E402


def numpy_chain(loads, sm, routed, t, picks, mb):
    counts = loads.draw(t, picks)
    slot = sm.routing.slot_picks(routed, counts, 1.0 / mb)
    recv = per_gpu(slot, sm.topology.slots_per_gpu)
    moe = sm.gpu.seconds_fast(slot, True)
    return counts, recv, moe


def make_fused():
    import numba

    @numba.njit(cache=False, fastmath=False)
    def fused(p, picks, zs_k, sq, gather, share, scale, inv, last, tab_t, tab_dt, S, counts,
              recv, moe):
        L, E = p.shape
        P = gather.size // L
        G = P // S
        for i in range(L):
            for e in range(E):
                m = p[i, e] * picks
                m += np.float64(zs_k[i, e]) * sq
                counts[i, e] = m if m > 0.0 else 0.0
        flat = counts.ravel()
        for i in range(L):
            for g in range(G):
                r = 0.0
                s_ = 0.0
                for k in range(S):
                    j = g * S + k
                    x = flat[gather[i * P + j]]
                    x *= share[i, j]
                    x *= scale
                    # TabulatedCurve.seconds
                    pos = x * inv
                    row = math.trunc(pos)
                    if row > last:
                        row = last
                    pos -= row
                    ii = int(row)
                    y = tab_dt[ii] * pos
                    y += tab_t[ii]
                    y *= 1.0 if x > 0 else 0.0
                    if k == 0:
                        r, s_ = x, y
                    else:
                        r += x
                        s_ += y
                recv[i, g] = r
                moe[i, g] = s_

    return fused


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--phase", default="decode", choices=["decode", "prefill"])
    ap.add_argument("--repeat", type=int, default=2000)
    args = ap.parse_args()
    cfg = serving.ClusterConfig.deepseek_day6()
    model = cfg.model_spec
    topo = cfg.topology(args.phase)
    sm = StepModel(args.phase, topo, model=model, hardware=cfg.hardware_spec, dispatch="even",
                   micro_batches=cfg.unit(args.phase).micro_batches)
    pop = Popularity(cfg.routing, model, args.phase, 0)
    loads_a, loads_b = StepLoads(pop, 0, 0), StepLoads(pop, 0, 0)
    _, p = loads_a.window(1.0)
    placement = solvers.solve("deepseek", p, topo, num_groups=model.num_groups)
    routed = sm.prepare(placement, p)
    mb = sm.micro_batches
    picks = 8.0 * 128 * topo.num_gpus  # a full decode batch's picks
    fused = make_fused()
    table = sm.gpu.expert_table
    L, E = p.shape
    G = topo.num_gpus
    counts, recv, moe = np.empty((L, E)), np.empty((L, G)), np.empty((L, G))

    def fused_chain(loads, t):
        _, pw = loads.window(t)
        if loads._zs is None:
            loads._zs = loads._z * np.sqrt(loads.phi * pw).astype(np.float32)
        if loads._pos >= loads._idx.size:
            loads._idx = loads._pick.integers(0, loads._bank, size=4096)
            loads._pos = 0
        k = loads._idx[loads._pos]
        loads._pos += 1
        fused(pw, picks, loads._zs[k], math.sqrt(picks), routed.gather, routed.share, 1.0 / mb,
              table.inv, float(table.last), table.t, table.dt, topo.slots_per_gpu, counts,
              recv, moe)
        return counts, recv, moe

    for step in range(200):  # equal bit for bit (the first call also compiles)
        a = numpy_chain(loads_a, sm, routed, 1.0, picks, mb)
        b = fused_chain(loads_b, 1.0)
        for x, y in zip(a, b, strict=True):
            if not np.array_equal(x, y):
                raise SystemExit(f"step {step}: outputs differ (max {np.abs(x - y).max():.3g})")
    times = {}
    for name, fn in (("numpy", lambda: numpy_chain(loads_a, sm, routed, 1.0, picks, mb)),
                     ("fused", lambda: fused_chain(loads_b, 1.0))):
        t = time.process_time()
        for _ in range(args.repeat):
            fn()
        times[name] = (time.process_time() - t) / args.repeat
    print(f"{args.phase} unit ({topo.num_gpus} GPUs, {L} x {topo.num_slots} slots): per step "
          f"numpy chain {1e6 * times['numpy']:.0f} us, fused {1e6 * times['fused']:.0f} us "
          f"(x{times['numpy'] / times['fused']:.1f}); outputs equal bit for bit over 200 steps; "
          f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
