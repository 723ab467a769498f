"""Kernel-time curves from the hardware tables: `GemmCurve` (dense FP8 GEMMs by tokens),
`ExpertCurve` (a routed expert's grouped GEMMs by tokens per expert) and `TabulatedCurve`
(the expert curve as a lookup table, for the simulator's hot path)."""

from __future__ import annotations

import numpy as np

from eplb.evaluation.serving.config.model import ModelSpec

MIN_GEMM_M = 64  # below this a GEMM is weight-read bound: its time stops shrinking


class GemmCurve:
    """Seconds of a set of FP8 GEMMs ``(N, K)`` run on ``M`` tokens, from DeepGEMM's table.

    Throughput of each shape is interpolated in ``log2 M`` between the table's rows, flat
    beyond them; below ``MIN_GEMM_M`` tokens the time is the ``MIN_GEMM_M`` time (weight
    reads dominate); 0 tokens cost 0. ``scale`` multiplies every throughput (``0.5`` for BF16).
    """

    def __init__(
        self, rows, shapes, *, efficiency: float, scale: float = 1.0, substitute: dict | None = None
    ) -> None:
        table: dict[tuple[int, int], list[tuple[int, float]]] = {}
        for m, n, k, tf in rows:
            table.setdefault((n, k), []).append((m, tf))
        self.parts = []
        for n, k in shapes:
            key = (substitute or {}).get((n, k), (n, k))
            pts = sorted(table[key])
            self.parts.append(
                (
                    2.0 * n * k,
                    np.log2([p[0] for p in pts]),
                    np.array([p[1] for p in pts]) * 1e12 * efficiency * scale,
                )
            )

    def seconds(self, m) -> np.ndarray:
        """Seconds of the GEMMs at ``m: float[...]`` tokens each (same shape)."""
        m = np.asarray(m, dtype=np.float64)
        if m.ndim == 1 and 0 < m.size <= MEMO_MAX_SIZE:  # per-rank arrays: memoised halves
            h = m * 2.0
            j = h.astype(np.intp)
            if (j == h).all() and 0 <= j.min() and j.max() < MEMO_HALVES:
                return self.memo().take(j)
        return self._compute(m)

    def memo(self) -> np.ndarray:
        """``float64[MEMO_HALVES]``: seconds at ``j / 2`` tokens (built on first use)."""
        table = self.__dict__.get("_memo")
        if table is None:
            table = self.__dict__["_memo"] = self._compute(np.arange(MEMO_HALVES) / 2.0)
        return table

    def _compute(self, m: np.ndarray) -> np.ndarray:
        """`seconds` without the memo (``m: float64[...]``)."""
        eff = np.maximum(m, MIN_GEMM_M)
        lm = np.log2(eff)
        out = np.zeros_like(eff)
        for flops, xs, rates in self.parts:
            out += flops * eff / np.interp(lm, xs, rates)
        return np.where(m > 0, out, 0.0)


# GemmCurve memoises whole and half token counts below this many halves (per-rank tokens per
# micro-batch of decode and prefill steps are such counts), for arrays of at most this size
MEMO_HALVES = 1 << 16
MEMO_MAX_SIZE = 4096


class ExpertCurve:
    """Seconds of one routed expert's grouped GEMMs (gate+up, then down) at ``m`` tokens per
    expert, from DeepGEMM's grouped tables; same interpolation rules as `GemmCurve`."""

    def __init__(self, rows, model: ModelSpec, *, efficiency: float) -> None:
        rows = sorted(rows)
        self.xs = np.log2([r[0] for r in rows])
        self.gu = np.array([r[1] for r in rows]) * 1e12 * efficiency
        self.dn = np.array([r[2] for r in rows]) * 1e12 * efficiency
        self.f_gu = 2.0 * 2 * model.moe_intermediate * model.hidden
        self.f_dn = 2.0 * model.hidden * model.moe_intermediate
        self.floor = float(2 ** self.xs[0])

    def seconds(self, m) -> np.ndarray:
        """Seconds of one expert at ``m: float[...]`` tokens per expert (same shape)."""
        m = np.asarray(m, dtype=np.float64)
        eff = np.maximum(m, self.floor)
        lm = np.log2(eff)
        t = eff * (
            self.f_gu / np.interp(lm, self.xs, self.gu)
            + self.f_dn / np.interp(lm, self.xs, self.dn)
        )
        return np.where(m > 0, t, 0.0)


class LinearCurve:
    """A what-if expert curve: ``per_pick`` seconds per token per expert, linear (0 tokens cost
    0). Put in place of `GpuSide.expert` to ask what a result owes to the measured curve's
    non-linearity (`scripts/lp_never_worse.py`)."""

    def __init__(self, per_pick: float) -> None:
        self.per_pick = float(per_pick)

    def seconds(self, m) -> np.ndarray:
        """Seconds of one expert at ``m: float[...]`` tokens per expert (same shape)."""
        return self.per_pick * np.asarray(m, dtype=np.float64)


class TabulatedCurve:
    """`ExpertCurve.seconds` from a table, for the simulator's per-step hot path.

    Seconds are tabulated at every ``step`` tokens from 0 to the curve's last table row (beyond
    it the throughput is flat, so the time is linear in the tokens and the last interval
    extrapolates exactly) and linearly interpolated: no logarithm per call (``np.log2``
    dominates `ExpertCurve.seconds`). Below the curve's floor the time is the floor's, 0 tokens
    cost 0. Relative error against the curve < `TABLE_TOL` (tested over 1e-6..1e6 tokens;
    largest just above the floor).
    """

    def __init__(self, curve: ExpertCurve, step: float = 0.25) -> None:
        top = float(2.0 ** curve.xs[-1])
        self.inv = 1.0 / step
        grid = np.arange(int(np.ceil(top / step)) + 2) * step
        t = curve.seconds(np.maximum(grid, curve.floor))
        self.t = t
        self.dt = np.append(np.diff(t), t[-1] - t[-2])
        self.last = len(grid) - 2

    def seconds(self, m: np.ndarray) -> np.ndarray:
        """`ExpertCurve.seconds` of ``m: float64[...]`` tokens per expert, from the table."""
        pos = m * self.inv
        row = np.trunc(pos)  # the table row (pos >= 0); float ops are cheaper than int ones
        if row.size and row.max() > self.last:
            np.minimum(row, self.last, out=row)
        pos -= row
        i = row.astype(np.intp)
        out = self.dt.take(i, mode="clip")  # (rows are in range: no bounds checks)
        out *= pos
        out += self.t.take(i, mode="clip")
        # 0 tokens cost 0: the same +0.0 as multiplying the (positive) times by m > 0
        np.copyto(out, 0.0, where=m <= 0)
        return out


TABLE_TOL = 1e-5  # relative error of TabulatedCurve against ExpertCurve
