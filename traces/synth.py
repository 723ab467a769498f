"""Seeded synthetic trace generators; same arguments, same trace.

Counts-level generators sample ``tokens * top_k`` picks per (window, layer) from expert shares
capped at ``1 / top_k``: ``counts: float64[windows, L, E]``. `token_level` and `token_windows`
route individual tokens (group-limited top-k) to match a target load. See docs/data.md,
section "Synthetic traces".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from eplb.args import check_int, check_number, check_seed
from eplb.errors import TraceError
from eplb.loads import as_real_array
from eplb.safeload import check_size
from eplb.traces.model import Trace

__all__ = ["bursty", "calibrated", "cap_shares", "drift", "lognormal", "token_level",
           "token_windows", "uniform", "zipf"]


# ------------------------------------------------------------------ helpers
_LIMITS = {"tokens": 2**40, "num_tokens": 2**31}  # picks must fit int64, token ids int32


def _check_sizes(**sizes: int) -> None:
    """Positive integers, within sane limits; the arrays they make within `check_size`'s."""
    for name, value in sizes.items():
        check_int(name, value, 1, _LIMITS.get(name, 2**31 - 1), error=TraceError)
    shape = [sizes[k] for k in ("windows", "num_layers", "num_experts") if k in sizes]
    if len(shape) == 3:
        flag = {"windows": "--windows", "num_layers": "--layers", "num_experts": "--experts"}
        check_size(f"the counts ({', '.join(f'{flag[k]} {sizes[k]}' for k in flag)})",
                   shape, 8, error=TraceError, fix="ask for fewer windows, layers or experts")
    if "tokens" in sizes and "top_k" in sizes and sizes["tokens"] * sizes["top_k"] > 2**53:
        raise TraceError(f"tokens x top_k = {sizes['tokens'] * sizes['top_k']} picks per "
                         "window exceeds 2**53")


def _rng(seed) -> np.random.Generator:
    return np.random.default_rng(check_seed("seed", seed, error=TraceError))


def _check_range(name: str, value, lo: float = 0.0) -> tuple[float, float]:
    if isinstance(value, (str, bytes)):
        raise TraceError(f"{name} must be a pair (low, high), got {value!r}")
    try:
        a, b = (float(v) for v in value)
    except (TypeError, ValueError, OverflowError):
        raise TraceError(f"{name} must be a pair (low, high), got {value!r}") from None
    if not (lo <= a <= b) or not math.isfinite(b) or b > 1e3:
        raise TraceError(f"{name} must be (low, high) with {lo:g} <= low <= high <= 1000, got "
                         f"{value!r}")
    return a, b


def _check_prob(name: str, value: float) -> float:
    return check_number(name, value, 0.0, 1.0, error=TraceError)


def cap_shares(p: np.ndarray, top_k: int) -> np.ndarray:
    """``p: float[..., E]`` (rows sum to 1) with every share capped at ``1 / top_k``.

    Mass above the cap goes to the uncapped experts in proportion to their shares (water
    filling), so rows still sum to 1. Needs ``E >= top_k``.
    """
    p = as_real_array(p, "p", error=TraceError)
    if p.ndim < 1 or p.shape[-1] == 0 or not np.isfinite(p).all() or (p < 0).any():
        raise TraceError("p must be float[..., E] shares: finite, >= 0, E >= 1")
    total = p.sum(-1)
    if not np.all(np.abs(total - 1.0) <= 1e-9):
        bad = float(np.ravel(total)[np.argmax(np.ravel(np.abs(total - 1.0)))])
        raise TraceError(f"p's rows must sum to 1 (shares), a row sums to {bad:.6g}: divide "
                         "each row by its sum")
    E = p.shape[-1]
    top_k = check_int("top_k", top_k, 1, error=TraceError)
    if top_k > E:
        raise TraceError(f"top_k {top_k} exceeds the {E} experts; a token picks distinct experts")
    cap = 1.0 / top_k
    for _ in range(E):
        over = p > cap * (1 + 1e-12)
        if not over.any():
            break
        capped = p >= cap * (1 - 1e-12)
        free = np.where(capped, 0.0, p)
        excess = 1.0 - capped.sum(-1, keepdims=True) * cap - free.sum(-1, keepdims=True)
        scale = 1.0 + np.divide(excess, free.sum(-1, keepdims=True),
                                out=np.zeros_like(excess), where=free.sum(-1, keepdims=True) > 0)
        p = np.where(capped, cap, p * scale)
    return p


def _normalise(w: np.ndarray) -> np.ndarray:
    return w / w.sum(axis=-1, keepdims=True)


def _sample(p: np.ndarray, windows: int, tokens: int, top_k: int,
            rng: np.random.Generator) -> np.ndarray:
    """``float64[windows, L, E]`` multinomial picks from shares ``p: [L, E]`` or ``[T, L, E]``."""
    p = cap_shares(_normalise(p), top_k)
    if p.ndim == 2:
        p = np.broadcast_to(p, (windows, *p.shape))
    return rng.multinomial(tokens * top_k, p).astype(np.float64)


def _zipf_weights(num_layers: int, num_experts: int, skew, rng: np.random.Generator):
    """Per-layer exponents ``s: [L]`` and rank of each expert ``rank: int[L, E]`` (0 = hottest)."""
    lo, hi = _check_range("skew", skew)
    s = rng.uniform(lo, hi, size=num_layers)
    rank = np.argsort(rng.random((num_layers, num_experts)), axis=1)
    return s, rank


def _check_meta(meta) -> None:
    if meta and not isinstance(meta, Mapping):
        raise TraceError(f"meta must be a dict, got {type(meta).__name__}")


def _layer_ids(layer_ids, num_layers: int) -> np.ndarray | None:
    try:
        return None if layer_ids is None else np.asarray(list(layer_ids))
    except (TypeError, ValueError, OverflowError):
        raise TraceError(f"layer_ids must be a list of {num_layers} model layer ids, got "
                         f"{str(layer_ids)[:40]}") from None


def _finish(counts: np.ndarray, layer_ids, top_k: int, prov: dict, meta) -> Trace:
    info: dict[str, Any] = {"model": "synthetic", "top_k": int(top_k), "provenance": prov}
    if meta:
        _check_meta(meta)
        info.update(meta)
    ids = _layer_ids(layer_ids, counts.shape[1])
    try:
        return Trace(counts, ids, meta=info)
    except TraceError as exc:
        raise TraceError(f"generator output rejected: {exc}") from None


# ------------------------------------------------------------------ counts-level generators
def zipf(num_layers: int = 58, num_experts: int = 256, *, windows: int = 1, tokens: int = 16384,
         top_k: int = 8, skew: tuple[float, float] = (0.6, 1.1), seed: int = 0,
         layer_ids: Sequence[int] | None = None, meta: Mapping | None = None) -> Trace:
    """Zipf-shaped loads: the expert of popularity rank ``r`` (1 = hottest) gets ``r ** -s``.

    Each layer draws ``s`` uniformly from ``skew`` and its own random ranking of experts; the
    popularity is the same in every window (only sampling noise differs).
    """
    _check_sizes(num_layers=num_layers, num_experts=num_experts, windows=windows,
                 tokens=tokens, top_k=top_k)
    rng = _rng(seed)
    s, rank = _zipf_weights(num_layers, num_experts, skew, rng)
    w = (rank + 1.0) ** -s[:, None]
    counts = _sample(w, windows, tokens, top_k, rng)
    prov = {"generator": "zipf", "seed": seed, "skew": list(skew), "tokens": tokens}
    return _finish(counts, layer_ids, top_k, prov, meta)


def lognormal(num_layers: int = 58, num_experts: int = 256, *, windows: int = 1,
              tokens: int = 16384, top_k: int = 8, sigma: tuple[float, float] = (0.5, 1.0),
              seed: int = 0, layer_ids: Sequence[int] | None = None,
              meta: Mapping | None = None) -> Trace:
    """Log-normal popularity: weight ``exp(sigma * z)``, ``z ~ N(0, 1)`` per expert, ``sigma``
    per layer uniform in ``sigma`` (the coefficient of variation is ``sqrt(exp(sigma^2) - 1)``
    for large ``E``)."""
    _check_sizes(num_layers=num_layers, num_experts=num_experts, windows=windows,
                 tokens=tokens, top_k=top_k)
    lo, hi = _check_range("sigma", sigma)
    rng = _rng(seed)
    sig = rng.uniform(lo, hi, size=num_layers)
    w = np.exp(sig[:, None] * rng.standard_normal((num_layers, num_experts)))
    counts = _sample(w, windows, tokens, top_k, rng)
    prov = {"generator": "lognormal", "seed": seed, "sigma": [lo, hi], "tokens": tokens}
    return _finish(counts, layer_ids, top_k, prov, meta)


def uniform(num_layers: int = 58, num_experts: int = 256, *, windows: int = 1,
            tokens: int = 16384, top_k: int = 8, seed: int = 0,
            layer_ids: Sequence[int] | None = None, meta: Mapping | None = None) -> Trace:
    """Every expert equally popular; counts differ only by multinomial sampling noise."""
    _check_sizes(num_layers=num_layers, num_experts=num_experts, windows=windows,
                 tokens=tokens, top_k=top_k)
    rng = _rng(seed)
    counts = _sample(np.ones((num_layers, num_experts)), windows, tokens, top_k, rng)
    prov = {"generator": "uniform", "seed": seed, "tokens": tokens}
    return _finish(counts, layer_ids, top_k, prov, meta)


def drift(num_layers: int = 58, num_experts: int = 256, *, windows: int = 8,
          tokens: int = 16384, top_k: int = 8, rate: float = 0.1,
          skew: tuple[float, float] = (0.6, 1.1), seed: int = 0,
          layer_ids: Sequence[int] | None = None, meta: Mapping | None = None) -> Trace:
    """Zipf popularity whose hot set moves: a share ``rate`` of the experts change rank each window.

    Window 0 is `zipf`-shaped. Before each later window, ``round(rate * E)`` experts chosen at
    random per layer trade popularity ranks by a cyclic shift (each chosen expert takes the
    rank of the next one), so exactly that many experts change rank when at least two are
    chosen. A hot expert that moves lands on a random chosen rank, so the top ``h`` experts
    lose on average ``rate * (1 - h / E)`` of their members per window.
    """
    _check_sizes(num_layers=num_layers, num_experts=num_experts, windows=windows,
                 tokens=tokens, top_k=top_k)
    rate = _check_prob("rate", rate)
    rng = _rng(seed)
    s, rank = _zipf_weights(num_layers, num_experts, skew, rng)
    k = int(round(rate * num_experts))
    ranks = np.empty((windows, num_layers, num_experts), dtype=np.int64)
    ranks[0] = rank
    rows = np.arange(num_layers)[:, None]
    for t in range(1, windows):
        rank = rank.copy()
        if k >= 2:
            chosen = np.argsort(rng.random((num_layers, num_experts)), axis=1)[:, :k]  # [L, k]
            rank[rows, chosen] = rank[rows, np.roll(chosen, -1, axis=1)]
        ranks[t] = rank
    w = (ranks + 1.0) ** -s[None, :, None]
    counts = _sample(w, windows, tokens, top_k, rng)
    prov = {"generator": "drift", "seed": seed, "rate": rate, "skew": list(skew),
            "tokens": tokens}
    return _finish(counts, layer_ids, top_k, prov, meta)


def bursty(num_layers: int = 58, num_experts: int = 256, *, windows: int = 8,
           tokens: int = 16384, top_k: int = 8, burst_prob: float = 0.05,
           burst_experts: int = 2, burst_factor: float = 20.0,
           skew: tuple[float, float] = (0.6, 1.1), seed: int = 0,
           layer_ids: Sequence[int] | None = None, meta: Mapping | None = None) -> Trace:
    """Steady zipf popularity with occasional spikes on a few experts.

    Each (window, layer) independently bursts with probability ``burst_prob``: then
    ``burst_experts`` experts chosen at random have their weight multiplied by
    ``burst_factor`` for that window only (shares stay capped at ``1 / top_k``).
    """
    _check_sizes(num_layers=num_layers, num_experts=num_experts, windows=windows,
                 tokens=tokens, top_k=top_k, burst_experts=burst_experts)
    burst_prob = _check_prob("burst_prob", burst_prob)
    if burst_experts > num_experts:
        raise TraceError(f"burst_experts {burst_experts} exceeds the {num_experts} experts")
    if not (isinstance(burst_factor, (int, float)) and burst_factor >= 1):
        raise TraceError(f"burst_factor must be a number >= 1, got {burst_factor!r}")
    rng = _rng(seed)
    s, rank = _zipf_weights(num_layers, num_experts, skew, rng)
    base = _normalise((rank + 1.0) ** -s[:, None])
    w = np.repeat(base[None], windows, axis=0)  # [T, L, E]
    burst = rng.random((windows, num_layers)) < burst_prob
    chosen = np.argsort(rng.random((windows, num_layers, num_experts)), axis=2)[..., :burst_experts]
    boost = np.ones_like(w)
    np.put_along_axis(boost, chosen, float(burst_factor), axis=2)
    w = np.where(burst[..., None], w * boost, w)
    counts = _sample(w, windows, tokens, top_k, rng)
    prov = {"generator": "bursty", "seed": seed, "burst_prob": burst_prob,
            "burst_experts": burst_experts, "burst_factor": float(burst_factor),
            "skew": list(skew), "tokens": tokens, "num_bursts": int(burst.sum())}
    return _finish(counts, layer_ids, top_k, prov, meta)


def calibrated(model: str = "deepseek-v3", *, windows: int = 8, tokens: int = 16384,
               phase: str = "all", jitter: float = 0.05, drift: float = 0.0, seed: int = 0,
               meta: Mapping | None = None) -> Trace:
    """A trace whose per-layer skew is drawn from the model fitted to real dumps of ``model``.

    ``phase``: the workloads the sigmas are centred on (``all``, ``prefill`` or ``decode``);
    ``jitter``: log-normal noise per (window, expert) (not calibrated: the dumps have no time
    axis); ``drift``: step per window of a Gaussian random walk of each log-share (0: none).
    Shape, layer ids (3..60 of 61 model layers), ``num_groups``, ``top_k`` and ``topk_groups``
    are the model's: ``counts: float64[windows, 58, 256]`` for deepseek-v3. Method:
    docs/data.md, section "Synthetic traces".
    """

    from eplb.traces import calibration  # lazy: it imports pandas, which start-up avoids

    for name, value in (("model", model), ("phase", phase)):
        if not isinstance(value, str):
            raise TraceError(f"{name} must be a string, got {str(value)[:40]}")
    _check_meta(meta)
    _check_sizes(windows=windows, tokens=tokens)
    if not (isinstance(jitter, (int, float)) and 0 <= jitter <= 2):
        raise TraceError(f"jitter must be a number in [0, 2], got {jitter!r}")
    if isinstance(drift, bool) or not (isinstance(drift, (int, float)) and 0 <= drift <= 2):
        raise TraceError(f"drift must be a number in [0, 2], got {drift!r}")
    table = calibration.load_table(model)
    par = calibration.phase_params(table, phase)
    rng = _rng(seed)
    L = len(table["layer_ids"])
    sg = np.maximum(np.asarray(par["sigma_group"]["center"])
                    + np.asarray(par["sigma_group"]["std"]) * rng.standard_normal(L), 0.02)
    sw = np.maximum(np.asarray(par["sigma_within"]["center"])
                    + np.asarray(par["sigma_within"]["std"]) * rng.standard_normal(L), 0.02)
    p = calibration.shares(sg, sw, table, rng)  # [L, E], iid draws: identities are random
    G, E = int(table["num_groups"]), int(table["num_experts"])
    w = p[None] * np.exp(jitter * rng.standard_normal((windows, L, E)))
    if drift > 0:  # no draw without drift: the same seed gives the same trace as before
        walk = np.cumsum(rng.standard_normal((windows, L, E)), axis=0)
        w = w * np.exp(drift * (walk - walk[:1]))
    top_k = int(table["top_k"])
    counts = _sample(w, windows, tokens, top_k, rng)
    info = {
        "model": f"{model} (calibrated)",
        "num_model_layers": int(table["num_model_layers"]),
        "num_groups": G,
        "topk_groups": int(table["topk_groups"]),
    }
    prov = {"generator": "calibrated", "model": model, "phase": phase, "seed": seed,
            "jitter": jitter, "tokens": tokens, **({"drift": drift} if drift else {}),
            "calibration": {"table": calibration.table_path(model).name,
                            "fitted_from": [f["name"] for f in table["source"]["files"]]}}
    return _finish(counts, table["layer_ids"], top_k, prov, {**info, **(meta or {})})


# ------------------------------------------------------------------ token level
def token_level(target: Trace | ArrayLike, *, num_tokens: int = 4096,
                num_groups: int | None = None, topk_groups: int | None = None,
                top_k: int | None = None, num_ranks: int = 32, iterations: int = 20,
                seed: int = 0, layer_ids: Sequence[int] | None = None, meta: Mapping | None = None,
                progress: bool = False) -> Trace:
    """Token-level routing with group-limited top-k whose marginals match ``target``.

    ``target``: a `Trace` (its total ``load()``, layer ids and meta are used) or ``float[L, E]``.
    Each token keeps ``topk_groups`` of ``num_groups`` contiguous expert groups and picks
    ``top_k`` distinct experts in them (each, when not given, from a `Trace` target's meta,
    else DeepSeek-V3's 8 groups, 4 of them, top-8). Per layer, the total variation between
    the picks and the target shares is at most ``E / (N * top_k)`` on DeepSeek-V3-like
    targets; the achieved one is in ``meta["provenance"]["max_total_variation"]``.
    ``token_rank[n] = n * num_ranks // N``. Returns one window: ``counts[0]`` is the bincount
    of ``topk_ids: int16[N, L, K]``, ``source_counts[0, l, r, e]`` the picks of rank ``r``'s
    tokens; ``meta`` records ``num_groups``, ``topk_groups``, ``top_k`` and the achieved
    per-layer distance. Method and limits: docs/data.md, section "Token-level routing".
    """
    base_meta: dict[str, Any] = {}
    _check_meta(meta)
    ids = layer_ids
    if isinstance(target, Trace):
        base_meta = {k: v for k, v in target.meta.items() if k != "provenance"}
        ids = target.layer_ids if ids is None else ids
        load = target.load()
    else:
        try:
            load = np.asarray(target, dtype=np.float64)
        except (TypeError, ValueError, OverflowError):
            raise TraceError("target must be a Trace or a non-negative finite load[L, E]") from None
    if load.ndim != 2 or 0 in load.shape or not np.isfinite(load).all() or (load < 0).any():
        raise TraceError("target must be a Trace or a non-negative finite load[L, E]")
    def routing(value: int | None, key: str, default: int) -> int:  # given, target's, default
        if value is not None:
            return value
        return base_meta[key] if base_meta.get(key) is not None else default

    num_groups = routing(num_groups, "num_groups", 8)
    topk_groups = routing(topk_groups, "topk_groups", 4)
    top_k = routing(top_k, "top_k", 8)
    _check_sizes(num_tokens=num_tokens, num_groups=num_groups, topk_groups=topk_groups,
                 top_k=top_k, num_ranks=num_ranks, iterations=iterations)
    L, E = load.shape
    if E % num_groups:
        raise TraceError(f"num_groups {num_groups} must divide the {E} experts")
    if topk_groups > num_groups:
        raise TraceError(f"topk_groups {topk_groups} exceeds num_groups {num_groups}")
    M = E // num_groups
    if top_k > topk_groups * M:
        raise TraceError(f"top_k {top_k} exceeds the {topk_groups * M} experts in "
                         f"{topk_groups} groups of {M}")
    if num_tokens * L * E > 2**31:
        raise TraceError(f"{num_tokens} tokens x {L} layers x {E} experts is too large")
    rows = load.sum(axis=1)
    if (rows <= 0).any():
        raise TraceError(f"target layer row {int(np.argmin(rows))} has no load")
    p = cap_shares(load / rows[:, None], top_k)
    rng = _rng(seed)
    topk = np.empty((num_tokens, L, top_k), dtype=np.int16)
    tv = np.empty(L)
    chunk = max(1, min(L, 2**19 // (num_tokens * E)))  # small chunks stay in cache
    bar = None
    if progress:
        from tqdm import tqdm  # lazy: tqdm only when progress is shown

        bar = tqdm(total=L, desc="routing tokens", unit="layer")
    for a in range(0, L, chunk):
        pl = p[a:a + chunk]
        ids_c, tv[a:a + chunk] = _fit_router(pl, num_tokens, num_groups, topk_groups, top_k,
                                             iterations, rng)
        topk[:, a:a + chunk] = ids_c.transpose(1, 0, 2)
        if bar is not None:
            bar.update(len(pl))
    if bar is not None:
        bar.close()
    token_rank = (np.arange(num_tokens, dtype=np.int64) * num_ranks // num_tokens).astype(np.int32)
    flat = ((np.arange(L)[None, :, None] * num_ranks + token_rank[:, None, None]) * E
            + topk.astype(np.int64)).ravel()
    src = np.bincount(flat, minlength=L * num_ranks * E).reshape(1, L, num_ranks, E)
    src = src.astype(np.float64)
    info = {**base_meta, "num_groups": num_groups, "topk_groups": topk_groups, "top_k": top_k}
    info.setdefault("model", "synthetic")
    info["provenance"] = {
        "generator": "token_level", "seed": seed, "num_tokens": num_tokens,
        "num_ranks": num_ranks, "iterations": iterations,
        "max_total_variation": round(float(tv.max()), 6),
        "tolerance": round(E / (num_tokens * top_k), 6),
    }
    if meta:
        info.update(meta)
    ids = _layer_ids(ids, L)
    try:
        return Trace(src.sum(axis=2), ids, src, topk, token_rank, meta=info)
    except TraceError as exc:
        raise TraceError(f"generator output rejected: {exc}") from None


def token_windows(target: Trace, *, num_tokens: int = 4096, num_groups: int = 8,
                  topk_groups: int = 4, top_k: int = 8, num_ranks: int = 32,
                  iterations: int = 20, seed: int = 0,
                  progress: bool = False) -> tuple[Trace, list[Trace]]:
    """One batch of ``num_tokens`` tokens per window of ``target``: `token_level` on each
    window's counts (window ``t`` with seed ``seed + t``). Returns ``(counts, tokens)``: the
    trace of the tokens' pick counts (``counts[t]`` and ``source_counts[t]`` are window ``t``'s
    tokens; ``target``'s layer ids and meta) and the list of the ``T`` one-window token-level
    traces, as `evaluation.replay.replay` takes them (``tokens=``)."""
    if not isinstance(target, Trace):
        raise TraceError("target must be a traces.Trace with the windows to route")
    check_seed("seed", seed, error=TraceError)
    out = []
    windows = range(target.num_windows)
    if progress:
        from tqdm import tqdm  # lazy: tqdm only when progress is shown

        windows = tqdm(windows, desc="token windows", unit="window")
    for t in windows:
        out.append(token_level(target.select(windows=t), num_tokens=num_tokens,
                               num_groups=num_groups, topk_groups=topk_groups, top_k=top_k,
                               num_ranks=num_ranks, iterations=iterations, seed=seed + t))
    meta = {k: v for k, v in target.meta.items() if k != "provenance"}
    meta.update(num_groups=num_groups, topk_groups=topk_groups, top_k=top_k)
    meta["provenance"] = {"generator": "token_windows", "seed": seed, "num_tokens": num_tokens,
                          "num_ranks": num_ranks, "iterations": iterations,
                          "target": target.meta.get("provenance")}
    counts = Trace(np.concatenate([tk.counts for tk in out]), target.layer_ids,
                   np.concatenate([tk.source_counts for tk in out]), meta=meta)
    return counts, out


def _route(theta: np.ndarray, noise: np.ndarray, G: int, TG: int, K: int) -> np.ndarray:
    """Group-limited top-k picks ``int64[l, N, K]`` for ``theta: [l, E]``, ``noise: [l, N, E]``."""
    l, N, E = noise.shape
    M = E // G
    s = (theta[:, None, :] + noise).reshape(l, N, G, M)
    if M >= 2:
        gscore = np.partition(s, M - 2, axis=-1)[..., M - 2:].sum(-1)  # [l, N, G] top-2 sum
    else:
        gscore = s[..., 0]
    gsel = np.argpartition(-gscore, TG - 1, axis=-1)[..., :TG] if TG < G else np.broadcast_to(
        np.arange(G), (l, N, G))
    rows = (np.arange(l * N)[:, None] * G + gsel.reshape(l * N, TG)).ravel()
    cand = s.reshape(l * N * G, M).take(rows, axis=0).reshape(l, N, TG * M)  # chosen groups
    j = np.argpartition(-cand, K - 1, axis=-1)[..., :K] if K < TG * M else np.broadcast_to(
        np.arange(K), (l, N, K))
    return np.take_along_axis(gsel, j // M, axis=-1) * M + j % M


def _fit_router(p: np.ndarray, N: int, G: int, TG: int, K: int, iterations: int,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Fit ``theta`` so the picks of ``N`` tokens match shares ``p: [l, E]``; returns the picks
    ``int64[l, N, K]`` of the best iterate and its per-layer total variation ``[l]``."""
    l, E = p.shape
    noise = rng.gumbel(size=(l, N, E)).astype(np.float32)
    target = N * K * p
    offsets = (np.arange(l) * E)[:, None, None]
    theta = np.log(np.maximum(p, 1e-12)).astype(np.float32)
    best_ids = None
    best_tv = np.full(l, np.inf)
    for it in range(iterations + 1):
        ids = _route(theta, noise, G, TG, K)
        c = np.bincount((ids + offsets).ravel(), minlength=l * E).reshape(l, E)
        tv = 0.5 * np.abs(c / (N * K) - p).sum(-1)
        if best_ids is None:
            best_ids = ids.copy()
        better = tv < best_tv
        best_ids[better] = ids[better]
        best_tv = np.minimum(best_tv, tv)
        step = max(0.05, 0.6 * 0.85**it)
        theta += (step * np.log((target + 0.5) / (c + 0.5))).astype(np.float32)
    return best_ids, best_tv
