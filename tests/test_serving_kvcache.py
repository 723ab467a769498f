"""KVStore / RankCaches: prefix matching and LRU eviction against brute-force oracles."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from eplb.errors import InputError
from eplb.evaluation.serving.kvcache import KVStore, RankCaches, cached_tokens, chain


class Chainer:
    """Token paths (tuples of small symbols) -> prefix-chained ids: one id per distinct prefix."""

    def __init__(self):
        self.ids: dict[tuple, int] = {}

    def __call__(self, path) -> list[int]:
        out = []
        for i in range(len(path)):
            out.append(self.ids.setdefault(tuple(path[: i + 1]), len(self.ids)))
        return out


class OracleLRU:
    """Independent reference: nodes are explicit tuple prefixes with last-use stamps; a match is
    the longest prefix whose every prefix is cached; eviction removes the least recently used
    *leaf* (a node with no cached child) that is not on the path being inserted."""

    def __init__(self, capacity):
        self.cap = capacity
        self.stamp: dict[tuple, int] = {}
        self.clock = 0

    def _touch(self, prefixes):
        for q in reversed(prefixes):  # deepest first, so parents are more recent
            self.clock += 1
            self.stamp[q] = self.clock

    def match(self, path, touch=True) -> int:
        k = 0
        while k < len(path) and tuple(path[: k + 1]) in self.stamp:
            k += 1
        if touch:
            self._touch([tuple(path[: i + 1]) for i in range(k)])
        return k

    def insert(self, path) -> None:
        path = list(path) if self.cap is None else list(path)[: self.cap]
        prefixes = [tuple(path[: i + 1]) for i in range(len(path))]
        if not prefixes:
            return
        new = [q for q in prefixes if q not in self.stamp]
        if self.cap is not None:
            while len(self.stamp) + len(new) > self.cap:
                leaves = [
                    q
                    for q in self.stamp
                    if q not in prefixes
                    and not any(len(o) == len(q) + 1 and o[: len(q)] == q for o in self.stamp)
                ]
                del self.stamp[min(leaves, key=self.stamp.__getitem__)]
        for q in new:
            self.stamp[q] = 0
        self._touch(prefixes)


paths = st.lists(st.integers(0, 2), min_size=0, max_size=6)
ops = st.lists(st.tuples(st.sampled_from(["match", "peek", "insert"]), paths), max_size=40)


@given(ops=ops, cap=st.one_of(st.none(), st.integers(0, 9)))
@example(ops=[("insert", [0, 1]), ("match", [0, 1]), ("insert", [2])], cap=2)
def test_match_and_lru_eviction_equal_the_oracle(ops, cap):
    _replay(ops, cap)


@pytest.mark.parametrize("cap", [1, 2, 3, 5, 8])
def test_long_random_op_sequences_equal_the_oracle(cap):
    """Seeded stress: thousands of operations under eviction pressure (hypothesis keeps its
    examples short)."""
    rng = np.random.default_rng(cap)
    kinds = ("match", "peek", "insert")
    ops = [
        (kinds[rng.integers(3)], rng.integers(0, 2, size=rng.integers(0, 5)).tolist())
        for _ in range(1500)
    ]
    _replay(ops, cap)


def _replay(ops, cap):
    ids = Chainer()
    store = KVStore(cap, block_size=4)
    oracle = OracleLRU(cap)
    for op, path in ops:
        hs = ids(path)
        if op == "insert":
            store.insert(hs)
            oracle.insert(path)
        else:
            touch = op == "match"
            assert store.match(hs, touch=touch) == oracle.match(path, touch=touch)
        assert len(store) == len(oracle.stamp)
        assert {ids.ids[q] for q in oracle.stamp} == {h for h in ids.ids.values() if h in store}
        if cap is not None:
            assert len(store) <= cap


@given(ops=st.lists(paths, max_size=30), cap=st.integers(0, 8))
def test_eviction_never_strands_a_block_and_counts_add_up(ops, cap):
    ids = Chainer()
    evicted = []
    store = KVStore(cap, on_evict=evicted.append)
    for path in ops:
        store.insert(ids(path))
        parent = {ids.ids[q]: ids.ids.get(q[:-1]) for q in ids.ids}
        for h in list(ids.ids.values()):
            if h in store and parent[h] is not None:
                assert parent[h] in store  # a cached block's prefix is cached (leaf eviction)
    assert store.evictions == len(evicted) == store.inserted - len(store)
    assert all(h not in store or evicted.count(h) >= 1 for h in evicted)


@given(ops=st.lists(st.tuples(st.integers(0, 3), paths), max_size=30), cap=st.integers(0, 6))
def test_rank_caches_match_equals_each_store(ops, cap):
    ids = Chainer()
    rc = RankCaches(4, cap)
    probes = []
    for rank, path in ops:
        hs = ids(path)
        rc.insert(rank, hs)
        probes.append(hs)
        for p in probes[-3:]:
            want = [s.match(p, touch=False) for s in rc.stores]
            assert rc.match(p).tolist() == want
    assert rc.sizes().tolist() == [len(s) for s in rc.stores]
    # the index holds exactly the cached blocks
    held = {}
    for r, s in enumerate(rc.stores):
        for h in ids.ids.values():
            if h in s:
                held[h] = held.get(h, 0) | (1 << r)
    assert held == rc._owners


def test_lru_touch_on_hit_keeps_the_used_prefix():
    s = KVStore(4)
    s.insert([1, 2])
    s.insert([3, 4])
    assert s.match([1, 2]) == 2  # [1, 2] now more recent than [3, 4]
    s.insert([5, 6])  # evicts 4 then 3 (leaf first), not the touched prefix
    assert [h in s for h in (1, 2, 3, 4, 5, 6)] == [True, True, False, False, True, True]
    assert s.match([3, 4]) == 0 and s.evictions == 2
    assert s.match([1, 2], touch=False) == 2
    st_ = s.stats()
    assert st_["lookups"] == 2 and st_["hits"] == 1 and st_["hit_blocks"] == 2
    assert st_["lookup_blocks"] == 4 and st_["hit_rate"] == 0.5


def test_path_longer_than_capacity_keeps_its_prefix():
    s = KVStore(3)
    s.insert([7, 8, 9])
    assert s.insert([1, 2, 3, 4, 5]) == 3
    assert s.match([1, 2, 3, 4, 5]) == 3 and 7 not in s
    z = KVStore(0)
    assert z.insert([1, 2]) == 0 and z.match([1]) == 0 and len(z) == 0


def test_unbounded_and_inf_capacity_and_clear():
    for cap in (None, math.inf, float("inf")):
        s = KVStore(cap)
        assert s.capacity_blocks == math.inf
        s.insert(np.arange(1000, dtype=np.int64))
        assert s.match(list(range(1000))) == 1000 and s.evictions == 0
    cleared = []
    s = KVStore(10, on_evict=cleared.append)
    s.insert([1, 2, 3])
    s.clear()
    assert len(s) == 0 and sorted(cleared) == [1, 2, 3] and s.evictions == 0


@pytest.mark.parametrize(
    "kw, frag",
    [
        ({"capacity_blocks": -1}, "capacity_blocks"),
        ({"capacity_blocks": 2.5}, "whole number"),
        ({"capacity_blocks": "ten"}, "capacity_blocks"),
        ({"capacity_blocks": float("nan")}, "capacity_blocks"),
        ({"capacity_blocks": True}, "capacity_blocks"),
        ({"capacity_blocks": 4, "eviction": "fifo"}, "eviction"),
        ({"capacity_blocks": 4, "block_size": 0}, "block_size"),
    ],
)
def test_bad_arguments(kw, frag):
    with pytest.raises(InputError, match=frag):
        KVStore(**kw)


def test_cached_tokens_caps_at_the_prompt():
    assert cached_tokens(3, 1000, 512) == 1000
    assert cached_tokens(1, 1000, 512) == 512
    assert cached_tokens(np.array([0, 1, 2]), np.array([10, 600, 1100]), 512).tolist() == [
        0,
        512,
        1024,
    ]


def test_chain_makes_content_hashes_prefix_unique():
    a = chain([5, 6, 7])
    b = chain([9, 6, 7])
    assert a.dtype == np.int64 and a.tolist() == chain([5, 6, 7]).tolist()
    assert chain([5, 6]).tolist() == a[:2].tolist()
    assert a[1] != b[1] and a[2] != b[2]  # same content, different parents: different nodes
    s = KVStore()
    s.insert(a)
    assert s.match(b) == 0 and s.match(chain([5, 6, 8])) == 2


def test_mooncake_hashes_are_prefix_chained(mooncake_jsonl):
    """The assumption the store relies on, checked on the real trace: every hash id has one
    parent (the id before it, or none at position 0)."""
    parent: dict[int, int | None] = {}
    with open(mooncake_jsonl) as fh:
        for line in fh:
            h = json.loads(line)["hash_ids"]
            for i, x in enumerate(h):
                p = h[i - 1] if i else None
                assert parent.setdefault(x, p) == p
    assert len(parent) > 100_000
