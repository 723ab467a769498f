"""Expert loads for the simulator: a popularity process per phase (`Popularity`: expected shares
``float64[L, E]`` per window, calibrated, uniform or from a trace, with drift and bursts) and
cheap per-step counts (`StepLoads`: Gaussian around the popularity, from a bank of pre-drawn
noise patterns). The model and its options (`OPTIONS`): docs/serving.md, "Simulator", item 6."""

from __future__ import annotations

import math

import numpy as np

from eplb import traces
from eplb.errors import EplbError, InputError
from eplb.evaluation.serving.config import RoutingConfig
from eplb.evaluation.serving.config.model import ModelSpec
from eplb.traces import calibration
from eplb.traces.synth import cap_shares

__all__ = ["OPTIONS", "Popularity", "StepLoads"]

OPTIONS = {
    "window_s": 60.0,
    "overdispersion": 1.0,
    "noise_bank": 128,
    "burst_experts": 2,
    "burst_factor": 20.0,
}
_PHASE_ID = {"prefill": 0, "decode": 1}
_BASE, _FORWARD, _BACKWARD, _BURST, _NOISE, _PICK = range(6)


def routing_options(config: RoutingConfig) -> dict:
    """``routing.options`` with defaults filled in and checked (one `InputError` per bad key)."""
    opts = dict(OPTIONS)
    for key, value in config.options.items():
        if key not in OPTIONS:
            raise InputError(
                f"unknown key routing.options.{key}; known: {', '.join(sorted(OPTIONS))}"
            )
        opts[key] = value
    for key in ("window_s", "burst_factor"):
        v = opts[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise InputError(f"routing.options.{key} must be a number > 0, got {v!r}")
        opts[key] = float(v)
    if opts["burst_factor"] < 1:
        raise InputError(f"routing.options.burst_factor must be >= 1, got {opts['burst_factor']!r}")
    v = opts["overdispersion"]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v >= 0):
        raise InputError(f"routing.options.overdispersion must be a number >= 0, got {v!r}")
    opts["overdispersion"] = float(v)
    for key in ("noise_bank", "burst_experts"):
        v = opts[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(f"routing.options.{key} must be an integer >= 1, got {v!r}")
    if config.drift > 1:
        raise InputError(f"routing.drift must be a share of experts in [0, 1], got {config.drift}")
    if config.burst > 1:
        raise InputError(f"routing.burst must be a probability in [0, 1], got {config.burst}")
    return opts


def _cap(p: np.ndarray, top_k: int) -> np.ndarray:
    """Rows of ``p: float[L, E]`` as shares summing to 1, each capped at ``1 / top_k``."""
    return cap_shares(p / p.sum(-1, keepdims=True), top_k)


class Popularity:
    """Expected expert shares ``p(w): float64[L, E]`` per window of one phase
    (docs/serving.md, "Simulator", item 6)."""

    def __init__(self, config: RoutingConfig, model: ModelSpec, phase: str, seed: int):
        self.config = config
        self.model = model
        self.phase = phase
        self.options = routing_options(config)
        self.window_s = self.options["window_s"]
        self.seed = int(seed)
        L, E, K = model.moe_layers, model.num_experts, model.top_k
        self._pid = _PHASE_ID[phase]
        self._trace = None
        if config.source == "trace":
            self._trace = _read_trace(config.path, L, E)
            base = None
        elif config.source == "uniform":
            base = np.full((L, E), 1.0 / E)
        else:
            base = _calibrated(model, phase, self._rng(_BASE))
        self._base = None if base is None else _cap(base, K)
        self._state = {0: base}  # uncapped shares after drift, by window
        self._lo = self._hi = 0
        self._fwd = self._rng(_FORWARD)
        self._bwd = self._rng(_BACKWARD)
        self._cache: dict[int, np.ndarray] = {}

    def _rng(self, purpose: int, *extra: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, 1, self._pid, purpose, *extra])

    def window_of(self, t: float) -> int:
        return math.floor(t / self.window_s)

    def window(self, w: int) -> np.ndarray:
        """``float64[L, E]`` shares of window ``w`` (read-only, cached)."""
        out = self._cache.get(w)
        if out is not None:
            return out
        K = self.model.top_k
        if self._trace is not None:
            counts = self._trace[w % len(self._trace)]
            out = _cap(np.where(counts.sum(-1, keepdims=True) > 0, counts, 1.0), K)
        elif self.config.drift <= 0 and self.config.burst == 0:
            out = self._base
        else:
            p = self._drifted(w)
            if self.config.burst > 0:
                p = self._bursts(w, p)
            out = _cap(p, K)
        out.flags.writeable = False
        if len(self._cache) > 256:
            self._cache.clear()
        self._cache[w] = out
        return out

    def _drifted(self, w: int) -> np.ndarray:
        if self.config.drift <= 0:
            return self._state[0]
        while self._hi < w:
            p = self._state[self._hi].copy()
            self._shift(p, self._fwd)
            self._hi += 1
            self._state[self._hi] = p
        while self._lo > w:
            p = self._state[self._lo].copy()
            self._shift(p, self._bwd)
            self._lo -= 1
            self._state[self._lo] = p
        return self._state[w]

    def _shift(self, p: np.ndarray, rng: np.random.Generator) -> None:
        """One window of drift on ``p: float64[L, E]`` in place (pair swaps of shares)."""
        L, E = p.shape
        swaps = rng.poisson(self.config.drift * E / 2, size=L)
        for layer in np.flatnonzero(swaps):
            for _ in range(int(swaps[layer])):
                a, b = rng.choice(E, size=2, replace=False)
                p[layer, a], p[layer, b] = p[layer, b], p[layer, a]

    def _bursts(self, w: int, p: np.ndarray) -> np.ndarray:
        """``p: float64[L, E]`` with window ``w``'s bursts applied (a copy if any)."""
        L, E = p.shape
        rng = self._rng(_BURST, w + (1 << 40))
        hit = rng.random(L) < self.config.burst
        if not hit.any():
            return p
        k = min(self.options["burst_experts"], E)
        chosen = np.argsort(rng.random((L, E)), axis=1)[:, :k]
        boost = np.ones((L, E))
        np.put_along_axis(boost, chosen, self.options["burst_factor"], axis=1)
        return np.where(hit[:, None], p * boost, p)

    def at(self, t: float) -> np.ndarray:
        return self.window(self.window_of(t))

    def mean(self, t0: float, t1: float) -> np.ndarray:
        """``float64[L, E]``: the time-weighted mean share over ``[t0, t1)``."""
        if not t1 > t0:
            return self.at(t0).copy()
        w0, w1 = self.window_of(t0), self.window_of(np.nextafter(t1, -np.inf))
        acc = np.zeros((self.model.moe_layers, self.model.num_experts))
        for w in range(w0, w1 + 1):
            lo = max(t0, w * self.window_s)
            hi = min(t1, (w + 1) * self.window_s)
            if hi > lo:
                acc += (hi - lo) * self.window(w)
        return acc / (t1 - t0)


def _calibrated(model: ModelSpec, phase: str, rng: np.random.Generator) -> np.ndarray:
    """DeepSeek-V3 shares as `traces.synth.calibrated` draws them (no window jitter)."""
    table = calibration.load_table("deepseek-v3")
    L, E = len(table["layer_ids"]), int(table["num_experts"])
    if (L, E) != (model.moe_layers, model.num_experts):
        raise InputError(
            f"routing.source 'calibrated' holds DeepSeek-V3 loads ({L} MoE layers x {E} "
            f"experts) but the model has {model.moe_layers} x {model.num_experts}; use "
            "routing.source = 'trace' or 'uniform'"
        )
    par = calibration.phase_params(table, phase)
    sg = np.maximum(
        np.asarray(par["sigma_group"]["center"])
        + np.asarray(par["sigma_group"]["std"]) * rng.standard_normal(L),
        0.02,
    )
    sw = np.maximum(
        np.asarray(par["sigma_within"]["center"])
        + np.asarray(par["sigma_within"]["std"]) * rng.standard_normal(L),
        0.02,
    )
    return calibration.shares(sg, sw, table, rng)


def _read_trace(path, L: int, E: int) -> np.ndarray:
    try:
        trace = traces.read(path)
    except EplbError as exc:
        raise InputError(f"routing.path: {exc}") from None
    if (trace.num_layers, trace.num_experts) != (L, E):
        raise InputError(
            f"routing.path {path}: the trace has {trace.num_layers} layers x "
            f"{trace.num_experts} experts but the model has {L} MoE layers x {E} experts"
        )
    return np.asarray(trace.counts, dtype=np.float64)


class StepLoads:
    """Per-step expert counts of one unit (docs/serving.md, "Simulator", item 6):
    ``draw(t, picks) -> float64[L, E]``."""

    def __init__(self, popularity: Popularity, unit: int, seed: int):
        self.pop = popularity
        opts = popularity.options
        self.phi = opts["overdispersion"]
        L, E = popularity.model.moe_layers, popularity.model.num_experts
        pid = popularity._pid
        bank = opts["noise_bank"] if self.phi > 0 else 0
        if bank:
            rng = np.random.default_rng([int(seed), 2, pid, unit, _NOISE])
            self._z = rng.standard_normal((bank, L, E)).astype(np.float32)
            self._pick = np.random.default_rng([int(seed), 2, pid, unit, _PICK])
        self._bank = bank
        self._idx = np.empty(0, dtype=np.intp)
        self._pos = 0
        self._w = None
        self._p = None
        self._zs = None
        self._buf = None  # scratch for the noise term

    def window(self, t: float) -> tuple[int, np.ndarray]:
        """``(w, p)``: the window of ``t`` and its expected shares."""
        w = self.pop.window_of(t)
        if w != self._w:
            self._w = w
            self._p = self.pop.window(w)
            self._zs = None
        return w, self._p

    def draw(self, t: float, picks: float) -> np.ndarray:
        """Counts ``float64[L, E]`` of a step at time ``t`` making ``picks`` expert picks."""
        _, p = self.window(t)
        mean = p * picks
        if not self._bank or picks <= 0:
            return mean
        if self._zs is None:
            # float32 (the values are float32 products): half the memory the steps read
            self._zs = self._z * np.sqrt(self.phi * p).astype(np.float32)
        if self._pos >= self._idx.size:
            self._idx = self._pick.integers(0, self._bank, size=4096)
            self._pos = 0
        k = self._idx[self._pos]
        self._pos += 1
        noise = self._buf
        if noise is None:
            noise = self._buf = np.empty_like(mean)
        mean += np.multiply(self._zs[k], math.sqrt(picks), out=noise, dtype=np.float64)
        np.maximum(mean, 0.0, out=mean)
        return mean
