"""The radix prefix cache against a brute-force model (a dict of cached page-aligned prefixes),
under random sequences of insert / match / lock / unlock / evict (hypothesis state machine)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from minisgl.kvcache import NaivePrefixCache, RadixPrefixCache

tokens = st.lists(st.integers(0, 3), min_size=0, max_size=14)


class RadixMachine(RuleBasedStateMachine):
    page_size = 1

    def __init__(self):
        super().__init__()
        self.cache = RadixPrefixCache(self.page_size)
        # model: cached page-aligned prefix (tuple) -> slots of its last page; prefix-closed
        self.model: dict[tuple[int, ...], list[int]] = {}
        self.next_slot = 0
        self.kept: set[int] = set()  # slots the cache owns
        self.returned: set[int] = set()  # slots evict() has given back
        self.locks: list[tuple[object, tuple[int, ...]]] = []

    def _model_match(self, ids: list[int]) -> int:
        p, n = self.page_size, 0
        while n + p <= len(ids) and tuple(ids[: n + p]) in self.model:
            n += p
        return n

    @rule(ids=tokens)
    def insert(self, ids):
        p = self.page_size
        end = len(ids) - len(ids) % p
        slots = torch.arange(self.next_slot, self.next_slot + len(ids))
        self.next_slot += len(ids)
        expected = self._model_match(ids)
        prefix = self.cache.insert(ids, slots)
        assert prefix == expected, "insert() must report the longest prefix that was already cached"
        for k in range(prefix + p, end + 1, p):
            self.model[tuple(ids[:k])] = slots[k - p : k].tolist()
        self.kept |= set(slots[prefix:end].tolist())

    @rule(ids=tokens)
    def match(self, ids):
        res = self.cache.match_prefix(ids)
        assert res.length == self._model_match(ids), "match length is not the longest cached prefix"
        assert len(res.indices) == res.length
        want = [s for k in range(self.page_size, res.length + 1, self.page_size) for s in self.model[tuple(ids[:k])]]
        assert res.indices.tolist() == want, "matched slots are not the ones inserted for those tokens"

    @rule(ids=tokens)
    def lock(self, ids):
        res = self.cache.match_prefix(ids)
        self.cache.lock(res.handle)
        self.locks.append((res.handle, tuple(ids[: res.length])))

    @precondition(lambda self: self.locks)
    @rule(i=st.integers(0, 100))
    def unlock(self, i):
        handle, _ = self.locks.pop(i % len(self.locks))
        self.cache.unlock(handle)

    @rule(n=st.integers(0, 30))
    def evict(self, n):
        n = min(n, self.cache.evictable_size)
        before = self.cache.evictable_size
        freed = self.cache.evict(n).tolist()
        assert len(freed) >= n, "evict() freed fewer slots than asked"
        assert len(freed) == before - self.cache.evictable_size
        assert not (set(freed) & self.returned), "a slot was returned twice"
        assert set(freed) <= self.kept, "evict() returned a slot the cache did not own"
        self.returned |= set(freed)
        self.kept -= set(freed)
        locked = {
            s
            for _, pre in self.locks
            for k in range(self.page_size, len(pre) + 1, self.page_size)
            for s in self.model[pre[:k]]
        }
        assert not (set(freed) & locked), "evict() freed a locked prefix"
        self.model = {k: v for k, v in self.model.items() if not set(v) & set(freed)}
        # the model stays prefix-closed: a cached prefix's parent prefix is cached too
        for k in self.model:
            assert len(k) == self.page_size or k[: -self.page_size] in self.model

    @rule()
    def evict_too_much_raises(self):
        with pytest.raises(ValueError):
            self.cache.evict(self.cache.evictable_size + 1)

    @invariant()
    def integrity(self):
        self.cache.check_integrity()
        cached = self.cache.evictable_size + self.cache.protected_size
        assert cached == len(self.kept) == len(self.model) * self.page_size
        assert sorted(self.cache.all_slots().tolist()) == sorted(self.kept)


class RadixPage2(RadixMachine):
    page_size = 2


class RadixPage4(RadixMachine):
    page_size = 4


TestRadixPage1 = RadixMachine.TestCase
TestRadixPage2 = RadixPage2.TestCase
TestRadixPage4 = RadixPage4.TestCase
for case in (TestRadixPage1, TestRadixPage2, TestRadixPage4):
    case.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_lru_order_and_split():
    c = RadixPrefixCache()
    c.insert([1, 2, 3, 4], torch.arange(4))
    c.insert([1, 2, 9], torch.arange(10, 13))  # splits [1,2,3,4] into [1,2] + [3,4]
    assert c.match_prefix([1, 2, 3, 4, 5]).indices.tolist() == [0, 1, 2, 3]
    c.insert([7, 7], torch.arange(20, 22))
    c.match_prefix([1, 2, 9])  # [1,2,9] is now the most recently used; [3,4] the least
    assert c.evict(1).tolist() == [2, 3]
    assert c.evict(2).tolist() == [20, 21]
    c.check_integrity()


def test_lock_protects_the_whole_path():
    c = RadixPrefixCache()
    c.insert([1, 2, 3], torch.arange(3))
    h = c.match_prefix([1, 2]).handle  # splits: [1,2] locked, [3] free
    c.lock(h)
    assert (c.protected_size, c.evictable_size) == (2, 1)
    assert c.evict(1).tolist() == [2]
    with pytest.raises(ValueError):
        c.evict(1)
    c.unlock(h)
    with pytest.raises(RuntimeError):
        c.unlock(h)
    assert c.evict(2).tolist() == [0, 1] and c.evictable_size == 0


def test_page_aligned_keys():
    c = RadixPrefixCache(page_size=4)
    assert c.insert([1, 2, 3, 4, 5, 6], torch.arange(6)) == 0
    assert c.evictable_size == 4  # the partial page is not kept
    assert c.match_prefix([1, 2, 3, 4, 5, 6, 7, 8]).length == 4
    assert c.match_prefix([1, 2, 3, 9]).length == 0  # a page matches whole or not at all


def test_naive_cache_keeps_nothing():
    c = NaivePrefixCache(page_size=2)
    assert c.insert([1, 2, 3], torch.arange(3)) == 2  # the caller keeps (frees) everything
    assert c.match_prefix([1, 2, 3]).length == 0
    assert c.evictable_size == c.protected_size == 0
    assert len(c.evict(0)) == 0
