"""Seeded workload generators (`poisson_arrivals`, `gamma_arrivals`, `lognormal_lengths`,
`synthesize` with multi-turn sessions and shared system prompts, solving for a hit rate) and
`rescale`; each random stream is ``default_rng([seed, k])`` with its own ``k``, so changing one
parameter leaves the other draws alone (docs/serving.md, "Generators")."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from eplb.errors import InputError
from eplb.evaluation.serving.workload.model import MAX_TOKENS, Workload
from eplb.evaluation.serving.workload.recent import Recent
from eplb.safeload import check_size

__all__ = [
    "ARRIVALS",
    "gamma_arrivals",
    "lognormal_lengths",
    "poisson_arrivals",
    "rescale",
    "synthesize",
]

ARRIVALS = ("poisson", "gamma", "constant")
HIT_RATE_TOL = 0.002  # bisection stops when the realised hit rate is this close to the target
_P_MAX = 0.999  # largest session continuation probability tried
_ARRIVAL, _INPUT, _OUTPUT, _TURN, _PICK, _SYSTEM, _RESAMPLE = range(7)


def _rng(seed, stream: int) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"seed must be a whole number >= 0, got {seed!r}")
    return np.random.default_rng([int(seed), stream])


def _positive(name: str, value, *, integer: bool = False, allow_zero: bool = False) -> float:
    ok = not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating))
    if ok:
        v = float(value)
        ok = math.isfinite(v) and (v >= 0 if allow_zero else v > 0) and (not integer or v == int(v))
    if not ok:
        what = "a whole number" if integer else "a finite number"
        raise InputError(f"{name} must be {what} {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return float(value)


MAX_SIGMA = 10.0  # largest log-space sigma of the synthetic lengths
BYTES_PER_REQUEST = 256  # columns, block-hash list and frame overhead of one request (rough)


def _count(name: str, value) -> int:
    """A request count: a whole number >= 0 whose frame fits `eplb.safeload.max_bytes`."""
    n = int(_positive(name, value, integer=True, allow_zero=True))
    check_size(f"{name} {n:,}", (n,), BYTES_PER_REQUEST, fix="generate fewer requests")
    return n


def _gaps_to_times(gaps: np.ndarray, n: int) -> np.ndarray:
    """``float64[n]`` arrival times from 0 by the first ``n - 1`` of ``gaps: float[>= n - 1]``."""
    out = np.zeros(n, dtype=np.float64)
    if n > 1:
        np.cumsum(gaps[: n - 1], out=out[1:])
    return out


def poisson_arrivals(n: int, rate: float, *, seed=0) -> np.ndarray:
    """``float64[n]`` arrival seconds of a Poisson process at ``rate`` req/s, the first at 0."""
    n = _count("n", n)
    rate = _positive("rate", rate)
    return _gaps_to_times(_rng(seed, _ARRIVAL).exponential(1.0 / rate, size=max(n - 1, 0)), n)


def gamma_arrivals(n: int, rate: float, cv: float, *, seed=0) -> np.ndarray:
    """``float64[n]`` arrival seconds with gamma gaps of mean ``1/rate`` and coefficient of
    variation ``cv`` (shape ``1/cv**2``; ``cv=1`` is Poisson), the first at 0."""
    n = _count("n", n)
    rate = _positive("rate", rate)
    cv = _positive("cv", cv)
    shape = 1.0 / cv**2
    gaps = _rng(seed, _ARRIVAL).gamma(shape, 1.0 / (rate * shape), size=max(n - 1, 0))
    return _gaps_to_times(gaps, n)


def lognormal_lengths(
    n: int, mean: float, sigma: float, *, seed=0, stream: int = _INPUT, max_tokens: int = MAX_TOKENS
) -> np.ndarray:
    """``int64[n]`` token counts, lognormal with the given ``mean`` (not median) and
    log-space ``sigma``, rounded and clipped to ``[1, max_tokens]``."""
    n = _count("n", n)
    mean = _positive("mean length", mean)
    name = {_INPUT: "input_sigma", _OUTPUT: "output_sigma"}.get(stream, "sigma")
    sigma = _positive(name, sigma, allow_zero=True)
    if sigma > MAX_SIGMA:  # sigma**2 overflows near 1e154; long before, lengths are 1 or max
        raise InputError(f"{name} must be <= {MAX_SIGMA:g} (log-space spread: at {MAX_SIGMA:g} "
                         f"the median length is e^-{MAX_SIGMA**2 / 2:g} times the mean), got "
                         f"{sigma:g}")
    mu = math.log(mean) - sigma**2 / 2
    x = _rng(seed, stream).lognormal(mu, sigma, size=n)
    return np.clip(np.rint(x), 1, max_tokens).astype(np.int64)


def _arrivals(n: int, rate: float, arrival: str, cv: float, seed) -> np.ndarray:
    if arrival == "poisson":
        return poisson_arrivals(n, rate, seed=seed)
    if arrival == "gamma":
        return gamma_arrivals(n, rate, cv, seed=seed)
    if arrival == "constant":
        return np.arange(n, dtype=np.float64) / _positive("rate", rate)
    raise InputError(f"unknown arrival process {arrival!r}; use one of {', '.join(ARRIVALS)}")


class _Draws:
    """Every random number `synthesize` uses, drawn once (common random numbers for the
    hit-rate search)."""

    def __init__(self, n, *, new_tokens, output_tokens, system_prompts, seed):
        self.n = n
        self.new = new_tokens.tolist()
        self.out = output_tokens.tolist()
        self.turn = _rng(seed, _TURN).random(n).tolist()
        self.pick = _rng(seed, _PICK).random(n).tolist()
        self.system = (
            _rng(seed, _SYSTEM).integers(0, system_prompts, size=n).tolist()
            if system_prompts
            else [-1] * n
        )


def _sessions(
    d: _Draws,
    p: float,
    *,
    system_tokens: int,
    open_sessions: int,
    max_input: int,
    block: int,
    hashes: bool,
):
    """Lay the requests out in sessions with continuation probability ``p``.

    Returns ``(input_tokens, session, hit_tokens, block_hashes | None)``: a continuation's
    prompt is its session's previous prompt and output plus the new tokens; a new session's is
    its system prompt plus the new tokens. ``hit_tokens`` is what an unbounded prefix cache
    serves (the previous prompt's full blocks, or a system prompt's full blocks after its first
    use).
    """
    n = d.n
    sys_blocks = system_tokens // block
    num_sys = max(d.system) + 1 if n else 0
    # system prompt j's blocks are hashes j * sys_blocks ...; session blocks follow them (only
    # the prompts drawn are built: system_prompts may be far more than the requests)
    next_id = num_sys * sys_blocks if hashes else 0
    none = np.empty(0, dtype=np.int64)
    concat, arange, i64 = np.concatenate, np.arange, np.int64
    sys_seen: set[int] = set()
    opened = Recent()  # open sessions, least recently used first
    ctx_tokens: dict[int, int] = {}
    ctx_blocks: dict[int, np.ndarray | int] = {}  # a session's full blocks (or their count)
    inp = [0] * n
    ses = [0] * n
    out_h: list | None = [None] * n if hashes else None
    hit_total = 0
    sessions = 0
    for i in range(n):
        new = d.new[i]
        cont = d.turn[i] < p and len(opened) > 0
        if cont:
            k = int(d.pick[i] * len(opened))
            s, where = opened.locate(k)
            length = ctx_tokens[s] + new
            # the session moves to the end; a conversation that outgrew the context ends here
            opened.drop(where, to_end=length <= max_input)
            if length > max_input:
                cont = False
            else:
                prev = ctx_blocks[s]
                reuse = len(prev) if hashes else prev
                hit_total += reuse * block
        if not cont:
            s = sessions
            sessions += 1
            j = d.system[i]
            length = min(new + (system_tokens if j >= 0 else 0), max_input)
            reuse = min(sys_blocks, length // block) if j >= 0 else 0
            if j >= 0:
                if j in sys_seen:
                    hit_total += reuse * block
                sys_seen.add(j)
            opened.append(s)
            if len(opened) > open_sessions:
                opened.popleft()
            prev = arange(j * sys_blocks, (j + 1) * sys_blocks, dtype=i64) if hashes and j >= 0 \
                else none
        nblocks = -(-length // block)
        if hashes:
            h = concat((prev[:reuse], arange(next_id, next_id + nblocks - reuse, dtype=i64)))
            next_id += nblocks - reuse
            out_h[i] = h
            ctx_blocks[s] = h[: length // block]
        else:
            ctx_blocks[s] = length // block
        ctx_tokens[s] = length + d.out[i]
        inp[i] = length
        ses[i] = s
    return inp, ses, hit_total, out_h


def synthesize(
    num_requests: int,
    *,
    rate: float = 1.0,
    arrival: str = "poisson",
    cv: float = 1.0,
    input_mean: float = 2048.0,
    input_sigma: float = 1.0,
    output_mean: float = 256.0,
    output_sigma: float = 1.0,
    lengths_from: Workload | None = None,
    hit_rate: float | None = None,
    session_prob: float | None = None,
    system_prompts: int = 0,
    system_prompt_tokens: int = 0,
    open_sessions: int = 32,
    max_input_tokens: int = 131_072,
    block_size: int = 512,
    seed: int = 0,
) -> Workload:
    """A seeded synthetic workload of ``num_requests`` requests.

    Arrivals: ``arrival`` (``poisson``, ``gamma`` with coefficient of variation ``cv``, or
    ``constant``) at ``rate`` req/s. Lengths: each request's *new* prompt tokens and its output
    tokens are lognormal (``input_mean``/``input_sigma``, ``output_mean``/``output_sigma``;
    sigma in log space) or resampled jointly from ``lengths_from``.

    Prefix sharing: a request continues one of the ``open_sessions`` most recent sessions with
    probability ``session_prob`` (its prompt is the session's previous prompt and output plus
    its new tokens, up to ``max_input_tokens``), else opens a session whose prompt starts with
    one of ``system_prompts`` shared system prompts of ``system_prompt_tokens`` tokens (drawn
    uniformly). ``hit_rate`` (instead of ``session_prob``): the token-weighted hit rate an
    unbounded prefix cache should get (``Workload.summary()["prefix_hit_rate"]``); the
    continuation probability is found by bisection on the drawn requests, so the realised rate
    is within ``HIT_RATE_TOL`` of the target for all but tiny workloads
    (``meta["generator"]`` records both). Block hashes are unique per new block and shared
    exactly where prompts share a prefix (prefix-chained by construction).
    """
    n = int(_positive("num_requests", num_requests, integer=True))
    _count("num_requests", n)
    cv = _positive("cv", cv)  # checked for every arrival process: a bad value is never ignored
    block = int(_positive("block_size", block_size, integer=True))
    max_input = int(_positive("max_input_tokens", max_input_tokens, integer=True))
    if max_input > MAX_TOKENS:
        raise InputError(f"max_input_tokens must be <= {MAX_TOKENS:,}, got {max_input}")
    num_sys = int(_positive("system_prompts", system_prompts, integer=True, allow_zero=True))
    sys_tokens = int(
        _positive("system_prompt_tokens", system_prompt_tokens, integer=True, allow_zero=True)
    )
    if sys_tokens and not num_sys:
        raise InputError(
            "system_prompt_tokens needs system_prompts >= 1 (how many distinct "
            "system prompts there are)"
        )
    if sys_tokens >= max_input:
        raise InputError(
            f"system_prompt_tokens {sys_tokens} must be below max_input_tokens {max_input}"
        )
    open_n = int(_positive("open_sessions", open_sessions, integer=True))
    if hit_rate is not None and session_prob is not None:
        raise InputError("give hit_rate (solved for) or session_prob (used as is), not both")
    if session_prob is not None and not (0 <= float(session_prob) < 1):
        raise InputError(f"session_prob must be in [0, 1), got {session_prob!r}")
    if hit_rate is not None and not (0 <= float(hit_rate) < 1):
        raise InputError(f"hit_rate must be in [0, 1), got {hit_rate!r}")
    arr = _arrivals(n, rate, arrival, cv, seed)
    if lengths_from is not None:
        if not isinstance(lengths_from, Workload) or len(lengths_from) == 0:
            raise InputError("lengths_from must be a non-empty Workload to resample lengths from")
        idx = _rng(seed, _RESAMPLE).integers(0, len(lengths_from), size=n)
        src = lengths_from.requests
        new = np.minimum(src["input_tokens"].to_numpy()[idx], max_input)
        out = src["output_tokens"].to_numpy()[idx]
        lengths = {
            "lengths_from": str(
                lengths_from.meta.get("provenance", {}).get("path", repr(lengths_from))
            )
        }
    else:
        new = lognormal_lengths(
            n, input_mean, input_sigma, seed=seed, stream=_INPUT, max_tokens=max_input
        )
        out = lognormal_lengths(n, output_mean, output_sigma, seed=seed, stream=_OUTPUT)
        lengths = {
            "input_mean": input_mean,
            "input_sigma": input_sigma,
            "output_mean": output_mean,
            "output_sigma": output_sigma,
        }
    draws = _Draws(n, new_tokens=new, output_tokens=out, system_prompts=num_sys, seed=seed)
    kw = {
        "system_tokens": sys_tokens,
        "open_sessions": open_n,
        "max_input": max_input,
        "block": block,
    }

    def realised(p: float) -> float:
        inp, _, hit, _ = _sessions(draws, p, hashes=False, **kw)
        return hit / sum(inp)

    if hit_rate is None:
        p = float(session_prob or 0.0)
    else:
        target = float(hit_rate)
        lo, hi = 0.0, _P_MAX
        h_lo, h_hi = realised(lo), realised(hi)
        if target < h_lo - HIT_RATE_TOL:
            raise InputError(
                f"hit_rate {target} is below the {h_lo:.3f} that the shared system "
                "prompts alone give; use fewer, shorter or more system prompts"
            )
        if target > h_hi + HIT_RATE_TOL:
            raise InputError(
                f"hit_rate {target} is out of reach: at most {h_hi:.3f} with these "
                "lengths and max_input_tokens; raise max_input_tokens or add "
                "system prompts"
            )
        p, best = lo, abs(h_lo - target)
        if abs(h_hi - target) < best:
            p, best = hi, abs(h_hi - target)
        for _ in range(40):
            if best <= HIT_RATE_TOL:
                break
            mid = (lo + hi) / 2
            h = realised(mid)
            if abs(h - target) < best:
                p, best = mid, abs(h - target)
            if h < target:
                lo = mid
            else:
                hi = mid
    inp, ses, hit, hashes = _sessions(draws, p, hashes=True, **kw)
    col = np.empty(n, dtype=object)
    for i, h in enumerate(hashes):
        col[i] = h
    frame = pd.DataFrame(
        {
            "request_id": np.arange(n, dtype=np.int64),
            "arrival_s": arr,
            "input_tokens": np.asarray(inp, dtype=np.int64),
            "output_tokens": np.asarray(out, dtype=np.int64),
            "block_hashes": col,
            "session": np.asarray(ses, dtype=np.int64),
        }
    )
    meta = {
        "generator": {
            "name": "synthesize",
            "num_requests": n,
            "rate": rate,
            "arrival": arrival,
            "cv": cv if arrival == "gamma" else None,
            **lengths,
            "system_prompts": num_sys,
            "system_prompt_tokens": sys_tokens,
            "open_sessions": open_n,
            "max_input_tokens": max_input,
            "seed": seed,
            "hit_rate_target": hit_rate,
            "session_prob": p,
            "hit_rate_realised": hit / float(sum(inp)),
        }
    }
    # valid and in arrival order by construction (what `Workload` would check and sort)
    return Workload._trusted(frame, block, meta)


def rescale(
    workload: Workload,
    *,
    rate: float | None = None,
    speedup: float | None = None,
    how: str = "scale",
    seed: int = 0,
) -> Workload:
    """``workload`` replayed at another load; request order (hence order within each session)
    is kept.

    ``rate``: target mean rate in req/s (``(n - 1) / span``), or ``speedup``: factor on the
    current rate. ``how="scale"`` divides every gap by the factor (burstiness kept);
    ``how="poisson"`` redraws Poisson arrivals at the target rate in the workload's order, as
    ``sglang.bench_serving --request-rate`` does. The first arrival stays where it was.
    """
    if not isinstance(workload, Workload):
        raise InputError(f"rescale needs a Workload, got {type(workload).__name__}")
    if (rate is None) == (speedup is None):
        raise InputError("rescale needs exactly one of rate= (req/s) or speedup= (a factor)")
    if how not in ("scale", "poisson"):
        raise InputError(f"how must be 'scale' or 'poisson', got {how!r}")
    a = workload.requests["arrival_s"].to_numpy()
    n = len(a)
    if n < 2:
        raise InputError("rescale needs at least two requests (a rate needs a gap)")
    span = float(a[-1] - a[0])
    current = (n - 1) / span if span > 0 else math.inf
    if speedup is not None:
        factor = _positive("speedup", speedup)
        target = current * factor
    else:
        target = _positive("rate", rate)
        factor = target / current
    if how == "scale":
        if span == 0:
            raise InputError(
                "every request arrives at the same time, so there are no gaps to "
                "scale; use how='poisson' (CLI: --poisson) to draw new arrivals"
            )
        new = a[0] + (a - a[0]) / factor
        note = f"arrivals rescaled by 1/{factor:.6g} (rate {current:.6g} -> {target:.6g} req/s)"
    else:
        if math.isinf(target):
            raise InputError(
                "speedup of a workload with a zero span has no finite rate; pass rate="
            )
        new = a[0] + poisson_arrivals(n, target, seed=seed)
        note = f"arrivals redrawn as Poisson at {target:.6g} req/s in the original order"
    out = workload.with_arrivals(new, note)
    out.meta["rescale"] = {"how": how, "factor": factor, "rate_rps": target, "seed": seed}
    return out
