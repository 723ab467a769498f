"""What a DP balancer sees: a batch of requests (`RequestBatch`) and the ranks (`RankState`: loads
``float64[R]`` and capacities): what a request adds to its rank and when it fits are in
docs/serving.md, "DP balancers"."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from eplb.errors import InputError
from eplb.evaluation.serving.kvcache import RankCaches

__all__ = ["PHASES", "Ledger", "RankState", "RequestBatch", "make_rng"]

PHASES = ("prefill", "decode")


def make_rng(seed) -> np.random.Generator:
    """``np.random.default_rng(seed)``; ``seed`` is an int, a sequence of ints (e.g.
    ``[run_seed, step]`` so every call of a simulation draws differently) or a Generator."""
    if isinstance(seed, np.random.Generator):
        return seed
    try:
        return np.random.default_rng(seed)
    except (TypeError, ValueError) as exc:
        raise InputError(
            f"seed must be a non-negative int or a sequence of them, got {seed!r} ({exc})"
        ) from None


def _ints(name: str, value, n: int | None) -> np.ndarray:
    arr = np.asarray(value)
    if arr.ndim == 0 and n is not None:
        arr = np.full(n, arr.item())
    if arr.ndim != 1:
        raise InputError(f"{name} must be a 1-D array of token counts, got shape {list(arr.shape)}")
    if arr.dtype.kind not in "iu":
        if (
            arr.dtype.kind not in "f"
            or arr.size
            and (not np.isfinite(arr).all() or (arr != np.round(arr)).any())
        ):
            raise InputError(f"{name} must hold whole numbers, got {arr.dtype} {arr[:3].tolist()}")
    arr = arr.astype(np.int64)
    if n is not None and arr.size != n:
        raise InputError(f"{name} has {arr.size} entries but the batch has {n} requests")
    return arr


@dataclass(frozen=True, eq=False)
class RequestBatch:
    """Requests offered to a balancer at once (``n`` of them).

    ``input_tokens: int64[n]`` (>= 1); ``cached_tokens: int64[n]``, prompt tokens already in a
    cache (default 0, ``<= input_tokens``); ``output_tokens: int64[n]`` (default 1);
    ``kv_tokens: int64[n]``, the KV a decode rank must hold for the request (default
    ``input_tokens + output_tokens``: the whole sequence reserved up front);
    ``block_hashes``: ``n`` sequences of prefix-chained block hashes (for ``cache_aware``);
    ``request_id: int64[n]`` (optional, carried along).
    """

    input_tokens: np.ndarray
    cached_tokens: np.ndarray | None = None
    output_tokens: np.ndarray | None = None
    kv_tokens: np.ndarray | None = None
    block_hashes: tuple | None = None
    request_id: np.ndarray | None = None

    def __post_init__(self):
        inp = _ints("input_tokens", self.input_tokens, None)
        n = inp.size
        if n and inp.min() < 1:
            i = int(np.argmax(inp < 1))
            raise InputError(f"input_tokens[{i}] is {inp[i]}; a prompt has >= 1 token")
        cached = (
            np.zeros(n, np.int64)
            if self.cached_tokens is None
            else _ints("cached_tokens", self.cached_tokens, n)
        )
        bad = np.flatnonzero((cached < 0) | (cached > inp))
        if bad.size:
            i = int(bad[0])
            raise InputError(
                f"cached_tokens[{i}] is {cached[i]}; it must be in 0..input_tokens ({inp[i]})"
            )
        out = (
            np.ones(n, np.int64)
            if self.output_tokens is None
            else _ints("output_tokens", self.output_tokens, n)
        )
        if n and out.min() < 0:
            i = int(np.argmax(out < 0))
            raise InputError(f"output_tokens[{i}] is {out[i]}; it must be >= 0")
        kv = inp + out if self.kv_tokens is None else _ints("kv_tokens", self.kv_tokens, n)
        if n and kv.min() < 0:
            i = int(np.argmax(kv < 0))
            raise InputError(f"kv_tokens[{i}] is {kv[i]}; it must be >= 0")
        hashes = self.block_hashes
        if hashes is not None:
            hashes = tuple(hashes)
            if len(hashes) != n:
                raise InputError(
                    f"block_hashes has {len(hashes)} entries but the batch has {n} requests"
                )
        rid = None if self.request_id is None else _ints("request_id", self.request_id, n)
        for name, v in (
            ("input_tokens", inp),
            ("cached_tokens", cached),
            ("output_tokens", out),
            ("kv_tokens", kv),
            ("block_hashes", hashes),
            ("request_id", rid),
        ):
            object.__setattr__(self, name, v)

    @classmethod
    def from_frame(cls, frame, *, cached_tokens=None, kv_tokens=None) -> RequestBatch:
        """From a request frame or `Workload` (columns ``input_tokens``, ``output_tokens``,
        optional ``cached_tokens``, ``kv_tokens``, ``block_hashes``, ``request_id``)."""
        df = getattr(frame, "requests", frame)
        cols = df.columns

        def col(name, given):
            if given is not None:
                return given
            return df[name].to_numpy() if name in cols else None

        return cls(
            df["input_tokens"].to_numpy(),
            col("cached_tokens", cached_tokens),
            col("output_tokens", None),
            col("kv_tokens", kv_tokens),
            tuple(df["block_hashes"]) if "block_hashes" in cols else None,
            col("request_id", None),
        )

    def __len__(self) -> int:
        return int(self.input_tokens.size)

    def take(self, idx) -> RequestBatch:
        """The requests at ``idx`` (``int[k]`` indices or a ``bool[n]`` mask), in that order."""
        idx = np.arange(len(self))[idx]
        return RequestBatch(
            self.input_tokens[idx],
            self.cached_tokens[idx],
            self.output_tokens[idx],
            self.kv_tokens[idx],
            None if self.block_hashes is None else tuple(self.block_hashes[i] for i in idx),
            None if self.request_id is None else self.request_id[idx],
        )

    @property
    def uncached_tokens(self) -> np.ndarray:
        """``int64[n]``: prompt tokens a prefill rank computes."""
        return self.input_tokens - self.cached_tokens

    @property
    def attention_cost(self) -> np.ndarray:
        """``float64[n]``: prefill core-attention cost, ``uncached * (cached + uncached / 2)``
        (token pairs)."""
        u = self.uncached_tokens.astype(np.float64)
        return u * (self.cached_tokens + u / 2)


def _per_rank(name: str, value, R: int, *, default: float, bool_: bool = False) -> np.ndarray:
    if value is None:
        return np.full(R, default, dtype=bool if bool_ else np.float64)
    arr = np.asarray(value, dtype=bool if bool_ else np.float64)
    if arr.ndim == 0:
        arr = np.full(R, arr.item(), dtype=arr.dtype)
    else:
        arr = arr.copy()
    if arr.shape != (R,):
        raise InputError(
            f"{name} must be a scalar or hold one value per rank ({R}), got shape {list(arr.shape)}"
        )
    if not bool_ and (np.isnan(arr).any() or (arr < 0).any()):
        i = int(np.argmax(np.isnan(arr) | (arr < 0)))
        raise InputError(f"{name}[{i}] is {arr[i]}; it must be >= 0 (inf for no limit)")
    return arr


@dataclass(eq=False)
class RankState:
    """The DP ranks of one unit as a balancer sees them: ``RankState(num_ranks, phase, ...)``.

    Capacities (scalar or per rank, ``inf`` = no limit): ``token_budget`` (prefill: tokens a
    rank may have queued, e.g. its chunked-prefill budget per step), ``kv_blocks_capacity``,
    ``max_requests`` (running plus queued requests). Loads (``float64[R]``, zeros by default):
    ``queued_tokens``, ``running_tokens``, ``kv_blocks_used``, ``num_requests``,
    ``attention_cost``; ``alive: bool[R]``. ``block_size``: tokens per KV block.
    ``caches``: the router's per-rank prefix view (`RankCaches`) for ``cache_aware``.
    ``cursor``: where ``round_robin`` starts next (advanced by `add`).

    The caller keeps the loads current: `add` (what `balancers.assign` does with
    ``commit=True``) and `release` move them by the amounts in the module table; a simulator
    may also write the arrays directly (e.g. move queued tokens to running when a step
    starts).
    """

    num_ranks: int
    phase: str = "prefill"
    token_budget: np.ndarray | float | None = None
    kv_blocks_capacity: np.ndarray | float | None = None
    max_requests: np.ndarray | float | None = None
    alive: np.ndarray | None = None
    queued_tokens: np.ndarray | None = None
    running_tokens: np.ndarray | None = None
    kv_blocks_used: np.ndarray | None = None
    num_requests: np.ndarray | None = None
    attention_cost: np.ndarray | None = None
    block_size: int = 512
    caches: RankCaches | None = None
    cursor: int = 0
    _names: tuple = field(
        default=(
            "queued_tokens",
            "running_tokens",
            "kv_blocks_used",
            "num_requests",
            "attention_cost",
        ),
        repr=False,
        init=False,
    )

    def __post_init__(self):
        R = self.num_ranks
        if isinstance(R, bool) or not isinstance(R, (int, np.integer)) or R < 1:
            raise InputError(f"num_ranks must be a whole number >= 1, got {R!r}")
        self.num_ranks = R = int(R)
        if self.phase not in PHASES:
            raise InputError(f"phase must be one of {', '.join(PHASES)}, got {self.phase!r}")
        if (
            isinstance(self.block_size, bool)
            or not isinstance(self.block_size, (int, np.integer))
            or self.block_size < 1
        ):
            raise InputError(f"block_size must be a whole number >= 1, got {self.block_size!r}")
        self.token_budget = _per_rank("token_budget", self.token_budget, R, default=math.inf)
        self.kv_blocks_capacity = _per_rank(
            "kv_blocks_capacity", self.kv_blocks_capacity, R, default=math.inf
        )
        self.max_requests = _per_rank("max_requests", self.max_requests, R, default=math.inf)
        self.alive = _per_rank("alive", self.alive, R, default=True, bool_=True)
        for name in self._names:
            arr = _per_rank(name, getattr(self, name), R, default=0.0)
            if not np.isfinite(arr).all():
                raise InputError(f"{name} must be finite")
            setattr(self, name, arr)
        if self.caches is not None:
            if not isinstance(self.caches, RankCaches):
                raise InputError(f"caches must be a RankCaches, got {type(self.caches).__name__}")
            if self.caches.num_ranks != R:
                raise InputError(
                    f"caches cover {self.caches.num_ranks} ranks but the state has {R}"
                )
        self.cursor = int(self.cursor) % R

    @property
    def token_load(self) -> np.ndarray:
        """``float64[R]``: ``queued_tokens + running_tokens``."""
        return self.queued_tokens + self.running_tokens

    def copy(self) -> RankState:
        """A deep copy of the arrays (the ``caches`` object is shared)."""
        kw = {
            k: getattr(self, k)
            for k in (*self._names, "token_budget", "kv_blocks_capacity", "max_requests", "alive")
        }
        return RankState(
            self.num_ranks,
            self.phase,
            block_size=self.block_size,
            caches=self.caches,
            cursor=self.cursor,
            **kw,
        )

    def increments(self, requests: RequestBatch) -> tuple[np.ndarray, ...]:
        """``(queued, running, kv_blocks, attention)`` each ``float64[n]``: what each request
        adds to a rank (module table)."""
        n = len(requests)
        zero = np.zeros(n)
        if self.phase == "prefill":
            u = requests.uncached_tokens.astype(np.float64)
            blocks = -(-requests.input_tokens // self.block_size)
            return u, zero, blocks.astype(np.float64), requests.attention_cost
        kv = requests.kv_tokens.astype(np.float64)
        blocks = -(-requests.kv_tokens // self.block_size)
        return zero, kv, blocks.astype(np.float64), kv

    def fits(self, requests: RequestBatch) -> np.ndarray:
        """``bool[n, R]``: each request alone fits each rank as the state is now."""
        dq, _, dkv, _ = self.increments(requests)
        ok = self.alive & (self.num_requests + 1 <= self.max_requests)  # [R]
        ok = ok & (self.kv_blocks_used + dkv[:, None] <= self.kv_blocks_capacity)  # [n, R]
        if self.phase == "prefill":
            ok &= (self.queued_tokens[None, :] + dq[:, None] <= self.token_budget[None, :]) | (
                self.queued_tokens[None, :] == 0
            )
        return ok

    def _apply(self, requests: RequestBatch, ranks, sign: float) -> np.ndarray:
        ranks = np.asarray(ranks, dtype=np.int64)
        if ranks.shape != (len(requests),):
            raise InputError(
                f"ranks has shape {list(ranks.shape)}; expected one rank per "
                f"request ({len(requests)})"
            )
        if ranks.size and (ranks.min() < -1 or ranks.max() >= self.num_ranks):
            raise InputError(
                f"ranks must be in -1..{self.num_ranks - 1}, got {ranks.min()}..{ranks.max()}"
            )
        sel = ranks >= 0
        r = ranks[sel]
        dq, dr, dkv, datt = self.increments(requests)
        for arr, d in (
            (self.queued_tokens, dq),
            (self.running_tokens, dr),
            (self.kv_blocks_used, dkv),
            (self.attention_cost, datt),
            (self.num_requests, np.ones(len(requests))),
        ):
            np.add.at(arr, r, sign * d[sel])
        return sel

    def add(self, requests: RequestBatch, ranks) -> None:
        """Commit an assignment: add each request's load to its rank (``-1``: skipped) and move
        the round-robin cursor past the last assigned rank."""
        sel = self._apply(requests, ranks, 1.0)
        if sel.any():
            self.cursor = (int(np.asarray(ranks)[sel][-1]) + 1) % self.num_ranks

    def release(self, requests: RequestBatch, ranks) -> None:
        """Undo `add` for requests that finished or left their ranks."""
        self._apply(requests, ranks, -1.0)
        for name in self._names:
            arr = getattr(self, name)
            if (arr < -1e-6 * max(1.0, float(np.abs(arr).max()))).any():
                r = int(np.argmin(arr))
                raise InputError(
                    f"release made {name}[{r}] negative ({arr[r]}); a request was "
                    "released from a rank it was not on"
                )
            np.maximum(arr, 0.0, out=arr)

    def fail(self, rank: int) -> None:
        """Rank ``rank`` stops: not alive, loads zeroed, its prefix view cleared. (Its requests
        are the caller's to re-offer.)"""
        self.alive[rank] = False
        for name in self._names:
            getattr(self, name)[rank] = 0.0
        if self.caches is not None:
            self.caches.clear(rank)


class Ledger:
    """A policy's working copy of the loads while it assigns one batch (`RankState` is not
    touched): ``fits(i) -> bool[R]`` and ``place(i, r)``. Loads ``float64[R]`` (``queued``,
    ``running``, ``kv``, ``n``, ``att``, ``tokens``), the batch's increments ``float64[n]``
    (``dq``, ``dr``, ``dkv``, ``datt``, ``dtok``)."""

    def __init__(self, state: RankState, requests: RequestBatch):
        self.alive = state.alive
        self.queued = state.queued_tokens.copy()
        self.running = state.running_tokens.copy()
        self.kv = state.kv_blocks_used.copy()
        self.n = state.num_requests.copy()
        self.att = state.attention_cost.copy()
        self.tokens = self.queued + self.running
        self.dq, self.dr, self.dkv, self.datt = state.increments(requests)
        self.dtok = self.dq + self.dr
        self.max_requests = state.max_requests
        self.kv_cap = state.kv_blocks_capacity
        self.budget = state.token_budget
        self._req = bool(np.isfinite(state.max_requests).any())
        self._kv = bool(np.isfinite(state.kv_blocks_capacity).any())
        self._tok = state.phase == "prefill" and bool(np.isfinite(state.token_budget).any())
        self.unlimited = not (self._req or self._kv or self._tok)

    def fits(self, i: int) -> np.ndarray:
        """``bool[R]``: request ``i`` fits each rank given what was placed so far."""
        if self.unlimited:
            return self.alive
        ok = self.alive
        if self._req:
            ok = ok & (self.n + 1 <= self.max_requests)
        if self._kv:
            ok = ok & (self.kv + self.dkv[i] <= self.kv_cap)
        if self._tok:
            ok = ok & ((self.queued + self.dq[i] <= self.budget) | (self.queued == 0))
        return ok

    def place(self, i: int, r: int) -> None:
        self.queued[r] += self.dq[i]
        self.running[r] += self.dr[i]
        self.tokens[r] += self.dtok[i]
        self.kv[r] += self.dkv[i]
        self.att[r] += self.datt[i]
        self.n[r] += 1
