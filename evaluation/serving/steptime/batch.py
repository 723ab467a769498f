"""`RankBatch`: the work of one step on each DP rank (tokens, attended pairs, KV read, output
rows), built from prefill chunks, decode requests or a uniform load."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from eplb.errors import InputError

PHASES = ("prefill", "decode")


def check_phase(phase: str) -> str:
    if phase not in PHASES:
        raise InputError(f"phase must be 'prefill' or 'decode', got {phase!r}")
    return phase


def _vector(name: str, value, n: int | None = None) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be numeric, got {value!r}") from None
    if arr.ndim != 1 or (n is not None and arr.shape != (n,)):
        want = f"[{n}]" if n is not None else "1-D"
        raise InputError(
            f"{name} must be a {want} array (one value per DP rank), got shape {arr.shape}"
        )
    if not np.all(np.isfinite(arr)) or (arr < 0).any():
        raise InputError(f"{name} must be finite and >= 0")
    return arr


@dataclass(frozen=True, eq=False)
class RankBatch:
    """The work of one step on each DP rank (arrays ``float64[G]``, one entry per rank).

    - ``tokens``: query tokens (prefill: new tokens; decode: requests x query tokens each);
    - ``attention``: attended (query, key) pairs (prefill: ``sum n * c + n (n + 1) / 2`` over
      chunks of ``n`` new tokens after ``c`` cached ones; decode: ``sum q * kv``);
    - ``kv_tokens``: cached tokens read per layer (decode: ``sum kv``; prefill: the KV tokens
      a rank exchanges with other ranks for context-parallel pieces, `chunking`, else 0);
    - ``logits``: rows of the output head (prefill: prompts whose last chunk runs;
      decode: query tokens).

    Build with `RankBatch.prefill`, `RankBatch.decode` (per-request lists) or `RankBatch.uniform`.
    """

    tokens: np.ndarray
    attention: np.ndarray
    kv_tokens: np.ndarray
    logits: np.ndarray

    def __post_init__(self) -> None:
        tokens = _vector("tokens", self.tokens)
        n = tokens.size
        if n < 1:
            raise InputError("a RankBatch needs at least one rank")
        for name in ("attention", "kv_tokens", "logits"):
            arr = _vector(name, getattr(self, name), n)
            arr.flags.writeable = False
            object.__setattr__(self, name, arr)
        tokens.flags.writeable = False
        object.__setattr__(self, "tokens", tokens)

    @property
    def num_ranks(self) -> int:
        return self.tokens.size

    @classmethod
    def trusted(cls, tokens, attention, kv_tokens, logits) -> RankBatch:
        """From ``tokens``, ``attention``, ``kv_tokens``, ``logits``: ``float64[G]`` arrays the
        caller guarantees finite, >= 0 and of one length (no copies, no checks: the
        simulator's per-step constructor)."""
        b = object.__new__(cls)
        object.__setattr__(b, "tokens", tokens)
        object.__setattr__(b, "attention", attention)
        object.__setattr__(b, "kv_tokens", kv_tokens)
        object.__setattr__(b, "logits", logits)
        return b

    def mean(self) -> RankBatch:
        """Every rank at the mean of the ranks (the batch a perfect DP balancer would give)."""
        n = self.num_ranks
        return RankBatch(
            *(
                np.full(n, getattr(self, f).mean())
                for f in ("tokens", "attention", "kv_tokens", "logits")
            )
        )

    @classmethod
    def prefill(
        cls, new_tokens, cached_tokens=None, rank=None, *, num_ranks: int, last_chunk=None
    ) -> RankBatch:
        """From chunks: ``new_tokens: int[n]`` computed after ``cached_tokens: int[n]`` already
        in the KV cache (default 0), on DP rank ``rank: int[n]`` (default 0..n-1);
        ``last_chunk: bool[n]`` marks chunks that end their prompt (default all)."""
        new = _vector("new_tokens", new_tokens)
        n = new.size
        cached = (
            np.zeros(n) if cached_tokens is None else _vector("cached_tokens", cached_tokens, n)
        )
        ranks = _ranks(rank, n, num_ranks)
        last = np.ones(n) if last_chunk is None else np.asarray(last_chunk, dtype=np.float64)
        if last.shape != (n,):
            raise InputError(f"last_chunk must be bool[{n}], got shape {last.shape}")
        pairs = new * cached + new * (new + 1) / 2
        return cls(
            np.bincount(ranks, new, num_ranks),
            np.bincount(ranks, pairs, num_ranks),
            np.zeros(num_ranks),
            np.bincount(ranks, last, num_ranks),
        )

    @classmethod
    def decode(cls, kv_tokens, rank=None, *, num_ranks: int, query_tokens: int = 1) -> RankBatch:
        """From running requests: ``kv_tokens: int[n]`` context of each request on DP rank
        ``rank: int[n]``; ``query_tokens`` per request per step (1, or 1 + MTP drafts)."""
        kv = _vector("kv_tokens", kv_tokens)
        ranks = _ranks(rank, kv.size, num_ranks)
        q = float(query_tokens)
        if not q >= 1:
            raise InputError(f"query_tokens must be >= 1, got {query_tokens!r}")
        count = np.bincount(ranks, minlength=num_ranks).astype(np.float64) * q
        kv_sum = np.bincount(ranks, kv, num_ranks)
        return cls(count, kv_sum * q, kv_sum, count.copy())

    @classmethod
    def uniform(
        cls,
        phase: str,
        num_ranks: int,
        *,
        tokens: float,
        context: float,
        cached: float = 0.0,
        query_tokens: int = 1,
    ) -> RankBatch:
        """Every rank alike. Prefill: ``tokens`` new tokens per rank from prompts of
        ``context`` new tokens after ``cached`` cached ones (chunked prefill fills the budget,
        so on average a token attends to ``cached + (context + 1) / 2`` keys). Decode:
        ``tokens`` running requests per rank, each with ``context`` cached tokens."""
        check_phase(phase)
        ones = np.ones(num_ranks)
        if phase == "prefill":
            pairs = tokens * (cached + (context + 1) / 2)
            return cls(ones * tokens, ones * pairs, ones * 0.0, ones * tokens / max(context, 1))
        q = tokens * query_tokens
        return cls(ones * q, ones * q * context, ones * tokens * context, ones * q)


def _ranks(rank, n: int, num_ranks: int) -> np.ndarray:
    if isinstance(num_ranks, bool) or not isinstance(num_ranks, (int, np.integer)) or num_ranks < 1:
        raise InputError(f"num_ranks must be a positive integer, got {num_ranks!r}")
    if rank is None:
        if n > num_ranks:
            raise InputError(
                f"{n} requests need rank= (which DP rank runs each); only {num_ranks} ranks"
            )
        return np.arange(n)
    r = np.asarray(rank)
    if r.shape != (n,) or (r.size and not np.issubdtype(r.dtype, np.integer)):
        raise InputError(f"rank must be int[{n}], got {r.dtype}{r.shape}")
    if r.size and (r.min() < 0 or r.max() >= num_ranks):
        raise InputError(f"rank must hold DP ranks in 0..{num_ranks - 1}")
    return r.astype(np.int64)
