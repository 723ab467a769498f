"""Prefix KV cache over block hashes: `KVStore` (one cache; radix semantics, LRU over leaves as
SGLang's radix cache) and `RankCaches` (one per DP rank, with an inverted index). The hashes
must be prefix-chained (`chain` makes them so); docs/serving.md, "KV store"."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from eplb.errors import InputError

__all__ = ["EVICTION_POLICIES", "KVStore", "RankCaches", "cached_tokens", "chain"]

EVICTION_POLICIES = ("lru",)
_MASK64 = (1 << 64) - 1


def _as_list(block_hashes) -> list:
    """Block hashes as a list of Python ints (numpy arrays converted once, lists kept)."""
    if isinstance(block_hashes, list):
        return block_hashes
    if isinstance(block_hashes, np.ndarray):
        return block_hashes.tolist()
    if block_hashes is None:
        return []
    return list(block_hashes)


def _check_capacity(capacity_blocks) -> int | None:
    if capacity_blocks is None:
        return None
    if isinstance(capacity_blocks, bool):
        raise InputError(f"capacity_blocks must be a number of blocks, got {capacity_blocks!r}")
    try:
        cap = float(capacity_blocks)
    except (TypeError, ValueError):
        raise InputError(
            f"capacity_blocks must be a number of blocks or None (unbounded), got "
            f"{capacity_blocks!r}"
        ) from None
    if math.isinf(cap) and cap > 0:
        return None
    if not math.isfinite(cap) or cap < 0 or cap != int(cap):
        raise InputError(
            f"capacity_blocks must be a whole number >= 0 (or None / math.inf for "
            f"an unbounded store), got {capacity_blocks!r}"
        )
    return int(cap)


def _check_block_size(block_size) -> int:
    if (
        isinstance(block_size, bool)
        or not isinstance(block_size, (int, np.integer))
        or (block_size < 1)
    ):
        raise InputError(f"block_size must be a whole number of tokens >= 1, got {block_size!r}")
    return int(block_size)


class KVStore:
    """Prefix cache of KV blocks keyed by prefix-chained block hashes.

    ``capacity_blocks``: blocks it holds (``None`` or ``math.inf``: unbounded; ``0``: holds
    nothing). ``block_size``: tokens per block (used by `cached_tokens` only).
    ``eviction``: ``"lru"`` (least recently used leaf). ``on_evict(hash)`` is called for each
    evicted block.

    Counters (touching lookups only): ``lookups``, ``hits`` (lookups that matched >= 1 block),
    ``lookup_blocks``, ``hit_blocks``; ``inserted`` and ``evictions`` count blocks.
    """

    __slots__ = (
        "_bounded",
        "_cap",
        "_d",
        "_on_evict",
        "block_size",
        "evictions",
        "eviction",
        "hit_blocks",
        "hits",
        "inserted",
        "lookup_blocks",
        "lookups",
    )

    def __init__(
        self,
        capacity_blocks: float | None = None,
        block_size: int = 512,
        eviction: str = "lru",
        *,
        on_evict: Callable[[int], None] | None = None,
    ):
        if eviction not in EVICTION_POLICIES:
            raise InputError(
                f"unknown eviction policy {eviction!r}; use one of {', '.join(EVICTION_POLICIES)}"
            )
        self._cap = _check_capacity(capacity_blocks)
        self._bounded = self._cap is not None
        self.block_size = _check_block_size(block_size)
        self.eviction = eviction
        self._on_evict = on_evict
        # hash -> None, least recently used first (a plain dict when nothing is ever evicted)
        self._d: dict = OrderedDict() if self._bounded else {}
        self.lookups = self.hits = self.lookup_blocks = self.hit_blocks = 0
        self.inserted = self.evictions = 0

    @property
    def capacity_blocks(self) -> float:
        """Blocks the store can hold (``math.inf`` when unbounded)."""
        return math.inf if self._cap is None else self._cap

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, block_hash) -> bool:
        return block_hash in self._d

    def __repr__(self) -> str:
        cap = "unbounded" if self._cap is None else f"{self._cap} blocks"
        return (
            f"KVStore({len(self._d)} cached / {cap}, block_size={self.block_size}, "
            f"{self.lookups} lookups, {self.evictions} evictions)"
        )

    def match(self, block_hashes: Sequence[int], *, touch: bool = True) -> int:
        """Longest cached prefix of ``block_hashes``, in blocks.

        ``touch``: count the lookup and mark the matched blocks used (LRU). A router probing
        several caches passes ``touch=False`` (no side effect at all).
        """
        hs = _as_list(block_hashes)
        d = self._d
        m = 0
        for h in hs:
            if h not in d:
                break
            m += 1
        if touch:
            self.lookups += 1
            self.lookup_blocks += len(hs)
            if m:
                self.hits += 1
                self.hit_blocks += m
                if self._bounded:
                    move = d.move_to_end
                    for i in range(m - 1, -1, -1):  # deepest first: parents end up more recent
                        move(hs[i])
        return m

    def insert(self, block_hashes: Sequence[int]) -> int:
        """Cache the prefix ``block_hashes`` (touching what is already there); new blocks added.

        Evicts least recently used leaves to make room, never a block of this path; a path
        longer than the capacity keeps its first ``capacity_blocks`` blocks.
        """
        hs = _as_list(block_hashes)
        d = self._d
        if not self._bounded:
            before = len(d)
            for h in hs:
                d[h] = None
            new = len(d) - before
            self.inserted += new
            return new
        cap = self._cap
        path = hs if len(hs) <= cap else hs[:cap]
        if not path:
            return 0
        move = d.move_to_end
        absent = []
        for h in path:  # protect what is cached already: move it behind everything evictable
            if h in d:
                move(h)
            else:
                absent.append(h)
        new = len(set(absent)) if len(absent) > 1 else len(absent)
        over = len(d) + new - cap
        if over > 0:
            self._evict(over)
        for i in range(len(path) - 1, -1, -1):
            h = path[i]
            d[h] = None
            move(h)
        self.inserted += new
        return new

    def _evict(self, count: int) -> None:
        pop = self._d.popitem
        cb = self._on_evict
        for _ in range(count):
            h, _ = pop(last=False)
            if cb is not None:
                cb(h)
        self.evictions += count

    def clear(self) -> None:
        """Drop every block (a failed GPU's cache); ``on_evict`` is called for each, counters
        are kept (cleared blocks are not counted as evictions)."""
        cb = self._on_evict
        if cb is not None:
            for h in self._d:
                cb(h)
        self._d.clear()

    def cached_tokens(
        self, block_hashes: Sequence[int], input_tokens: int, *, touch: bool = True
    ) -> int:
        """Tokens of a prompt of ``input_tokens`` served from the cache (see `cached_tokens`)."""
        return cached_tokens(self.match(block_hashes, touch=touch), input_tokens, self.block_size)

    def stats(self) -> dict:
        """Counters and size as a dict; ``hit_rate`` is ``hit_blocks / lookup_blocks``."""
        return {
            "blocks": len(self._d),
            "capacity_blocks": self.capacity_blocks,
            "lookups": self.lookups,
            "hits": self.hits,
            "lookup_blocks": self.lookup_blocks,
            "hit_blocks": self.hit_blocks,
            "hit_rate": self.hit_blocks / self.lookup_blocks if self.lookup_blocks else 0.0,
            "inserted": self.inserted,
            "evictions": self.evictions,
        }


def cached_tokens(matched_blocks, input_tokens, block_size: int = 512):
    """Prompt tokens served by ``matched_blocks`` cached blocks: ``min(blocks * size, input)``.

    The last block of a prompt is usually partial, so a full match covers the whole prompt.
    (A runtime still computes at least one token to get logits; that cap is the caller's.)
    Works on scalars and arrays.
    """
    if isinstance(matched_blocks, np.ndarray) or isinstance(input_tokens, np.ndarray):
        blocks = np.asarray(matched_blocks, dtype=np.int64)
        return np.minimum(blocks * int(block_size), np.asarray(input_tokens, dtype=np.int64))
    return min(int(matched_blocks) * int(block_size), int(input_tokens))


def chain(block_hashes: Iterable[int], seed: int = 0) -> np.ndarray:
    """Prefix-chain per-block content hashes: ``out[i] = mix(out[i-1], h[i])`` -> ``int64[b]``.

    Use it for hash lists that identify a block's content only, so that equal blocks under
    different prefixes become different nodes. Deterministic (splitmix64 finaliser); equal input
    prefixes give equal output prefixes.
    """
    out = []
    prev = seed & _MASK64
    for h in _as_list(block_hashes):
        x = (prev * 0x9E3779B97F4A7C15 + (int(h) & _MASK64) + 1) & _MASK64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
        x ^= x >> 31
        prev = x
        out.append(x - (1 << 64) if x >= 1 << 63 else x)
    return np.asarray(out, dtype=np.int64)


class RankCaches:
    """One `KVStore` per DP rank plus an index ``hash -> ranks holding it``.

    ``match(block_hashes) -> int64[R]`` gives every rank's cached prefix in one walk over the
    prompt (cost grows with the matched length, not with ``R``), which a cache-aware router
    needs for every request. ``stores[r]`` is rank ``r``'s cache; use `insert` / `clear` here
    (not on the stores directly) so the index stays in step.
    """

    def __init__(
        self,
        num_ranks: int,
        capacity_blocks: float | None = None,
        block_size: int = 512,
        eviction: str = "lru",
    ):
        if (
            isinstance(num_ranks, bool)
            or not isinstance(num_ranks, (int, np.integer))
            or (num_ranks < 1)
        ):
            raise InputError(f"num_ranks must be a whole number >= 1, got {num_ranks!r}")
        self.num_ranks = int(num_ranks)
        self.block_size = _check_block_size(block_size)
        self._owners: dict = {}  # hash -> bitmask of the ranks caching it
        self._all = (1 << self.num_ranks) - 1
        self._nbytes = (self.num_ranks + 7) // 8
        self._sizes = np.zeros(self.num_ranks, dtype=np.int64)
        self.stores = [
            KVStore(capacity_blocks, block_size, eviction, on_evict=self._dropper(r))
            for r in range(self.num_ranks)
        ]

    def _dropper(self, rank: int) -> Callable[[int], None]:
        owners, sizes, bit = self._owners, self._sizes, 1 << rank

        def drop(h) -> None:
            v = owners.get(h, 0) & ~bit
            if v:
                owners[h] = v
            else:
                owners.pop(h, None)
            sizes[rank] -= 1

        return drop

    def _mask(self, bits: int) -> np.ndarray:
        """``bool[R]`` of a rank bitmask."""
        raw = np.frombuffer(bits.to_bytes(self._nbytes, "little"), dtype=np.uint8)
        return np.unpackbits(raw, bitorder="little")[: self.num_ranks].astype(bool)

    def __len__(self) -> int:
        return self.num_ranks

    def __repr__(self) -> str:
        return (
            f"RankCaches({self.num_ranks} ranks, {int(self.sizes().sum())} blocks cached, "
            f"capacity {self.stores[0].capacity_blocks} each)"
        )

    def match(self, block_hashes: Sequence[int]) -> np.ndarray:
        """``int64[R]``: each rank's longest cached prefix of ``block_hashes`` (no touch)."""
        hs = _as_list(block_hashes)
        out = np.zeros(self.num_ranks, dtype=np.int64)
        owners = self._owners
        mask = self._all
        for i, h in enumerate(hs):
            m = owners.get(h, 0) & mask
            if m != mask:
                if i:  # the ranks that drop out here match exactly i blocks
                    out[self._mask(mask & ~m)] = i
                mask = m
                if not mask:
                    return out
        if hs:
            out[self._mask(mask)] = len(hs)
        return out

    def insert(self, rank: int, block_hashes: Sequence[int]) -> int:
        """Cache ``block_hashes`` on ``rank`` (LRU eviction there); new blocks added."""
        hs = _as_list(block_hashes)
        store = self.stores[rank]
        new = store.insert(hs)
        self._sizes[rank] += new
        bit = 1 << int(rank)
        owners = self._owners
        cap = store._cap
        for h in hs if cap is None or len(hs) <= cap else hs[:cap]:
            owners[h] = owners.get(h, 0) | bit
        return new

    def touch(self, rank: int, block_hashes: Sequence[int]) -> int:
        """A counted lookup on ``rank`` (marks the matched prefix used); matched blocks."""
        return self.stores[rank].match(block_hashes, touch=True)

    def clear(self, rank: int) -> None:
        """Drop rank ``rank``'s cache (its GPU failed or restarted)."""
        self.stores[rank].clear()

    def sizes(self) -> np.ndarray:
        """``int64[R]``: blocks cached per rank."""
        return self._sizes.copy()
