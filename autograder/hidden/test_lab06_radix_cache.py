"""Lab 06, hidden tests: the cache keeps its own copy of the slots, locks interleaved with splits and
evictions at page sizes 4 and 8, and random operations at page sizes 3 and 8 on longer prompts.
Each calls the cache first, so a stub fails at once with its hint."""

from __future__ import annotations

import random

import pytest
import torch

from autograder.adapters import lab06 as lab
from autograder.points import points
from minisgl.kvcache.radix import RadixPrefixCache


def _slots(start: int, n: int) -> torch.Tensor:
    return torch.arange(start, start + n, dtype=torch.int64)


def _state(cache) -> tuple[int, int]:
    return cache.evictable_size, cache.protected_size


@points(3)
def test_insert_keeps_its_own_copy():
    """insert keeps a copy of the slots it takes: the engine reuses the page-table row it passed in."""
    cache = lab.make_cache(1)
    row = _slots(100, 12)  # stands for a request's page-table row
    cache.insert(list(range(1, 9)), row[:8])
    row2 = _slots(200, 12)
    assert cache.insert(list(range(1, 13)), row2) == 8
    row.fill_(-1)
    row2.fill_(-1)  # both rows now serve other requests
    got = cache.match_prefix(list(range(1, 13))).indices
    assert isinstance(got, torch.Tensor) and got.tolist() == [*range(100, 108), *range(208, 212)], (
        f"after the caller reused its tensors, match_prefix returned slots {got.tolist()}; expected 100..107 and "
        "208..211. insert must store indices[pos:end].clone(): a slice shares memory with the caller's row"
    )
    freed = cache.evict(12)
    assert isinstance(freed, torch.Tensor) and freed.dtype == torch.int64, (
        f"evict must return an int64 tensor of slots, got {type(freed).__name__} {getattr(freed, 'dtype', '')}"
    )
    assert sorted(freed.tolist()) == [*range(100, 108), *range(208, 212)], f"evict(12) freed {freed.tolist()}"


@points(2)
@pytest.mark.parametrize("page", [4, 8])
def test_interleaved_locks_and_evictions(page):
    """Two requests share a prefix and lock it, a third match splits it under their locks, and the
    locks are released in another order than taken, with evictions in between (page sizes 4, 8)."""
    cache = lab.make_cache(page)
    p = page
    stem, a, b = list(range(1, 2 * p + 1)), [70] * (2 * p), [80] * p
    cache.insert(stem + a, _slots(0, 4 * p))
    cache.insert(stem + b + [9] * (p - 1), _slots(1000, 3 * p + p - 1))  # the partial last page is dropped
    steps: list[str] = []

    def expect(state: tuple[int, int], what: str) -> None:
        steps.append(what)
        got = _state(cache)
        assert got == state, (
            f"page_size {p}, after: {'; '.join(steps)}\n(evictable_size, protected_size) = {got}, expected {state}"
        )
        cache.check_integrity()

    expect((5 * p, 0), "insert stem+a, then stem+b")
    ma, mb = cache.match_prefix(stem + a), cache.match_prefix(stem + b)
    cache.lock(ma.handle)
    cache.lock(mb.handle)
    expect((0, 5 * p), "lock stem+a and stem+b")
    ms = cache.match_prefix(stem[:p] + [99] * p)  # ends inside the locked stem: split it
    assert ms.length == p and ms.indices.tolist() == list(range(p)), (
        f"page_size {p}: match of the stem's first page gave length {ms.length} slots {ms.indices.tolist()}"
    )
    cache.lock(ms.handle)
    expect((0, 5 * p), "match and lock the stem's first page (a split inside locked nodes)")
    cache.unlock(ma.handle)
    expect((2 * p, 3 * p), "unlock stem+a (the stem stays locked by the other two)")
    freed = sorted(cache.evict(1).tolist())
    assert freed == list(range(2 * p, 4 * p)), f"page_size {p}: evict(1) freed {freed}, expected a's whole leaf"
    expect((0, 3 * p), "evict(1)")
    with pytest.raises(ValueError):
        cache.evict(1)
        pytest.fail(f"page_size {p}: evict(1) with nothing evictable must raise ValueError")
    cache.unlock(mb.handle)
    expect((2 * p, p), "unlock stem+b (only the stem's first page is still locked)")
    freed = sorted(cache.evict(p).tolist())
    assert freed == list(range(1000 + 2 * p, 1000 + 3 * p)), (
        f"page_size {p}: evict({p}) freed {freed}; expected b's leaf only (a leaf first, and stop once enough)"
    )
    freed = sorted(cache.evict(p).tolist())
    assert freed == list(range(p, 2 * p)), f"page_size {p}: the next evict({p}) freed {freed}: the stem's 2nd page"
    expect((0, p), "evict b's leaf, then the stem's unlocked second page")
    cache.unlock(ms.handle)
    expect((p, 0), "unlock the first page")
    assert cache.match_prefix(stem + a).length == p


def _random_prompts(rng: random.Random, page: int) -> list[list[int]]:
    """Prompts of 0..6 pages plus a partial one, built from three stems so they share prefixes that
    end on and off page boundaries."""
    stems = [[rng.randrange(1, 5) for _ in range(rng.randrange(3 * page))] for _ in range(3)]
    out = []
    for _ in range(8):
        s = rng.choice(stems)
        cut = rng.randrange(len(s) + 1)
        out.append(s[:cut] + [rng.randrange(1, 5) for _ in range(rng.randrange(4 * page))])
    return out


@points(3, timeout=30)
def test_random_operations_at_page_sizes_3_and_8():
    """Random inserts, locked matches, unlocks and evictions on prompts up to 7 pages long, at page sizes
    3 and 8, give the engine cache's results and sizes."""
    lab.make_cache(3).match_prefix([1, 2, 3])  # a stub fails here
    for page in (3, 8):
        for seed in range(40):
            rng = random.Random(seed)
            prompts = _random_prompts(rng, page)
            mine, ref = lab.make_cache(page), RadixPrefixCache(page)
            locks: list[tuple] = []
            log, next_slot, n = [], 0, 0
            for _ in range(30):
                op, prompt = rng.choice(["insert", "insert", "lock", "unlock", "evict"]), rng.choice(prompts)
                if op == "unlock" and not locks:
                    op = "evict"
                if op == "insert":
                    idx = _slots(next_slot, len(prompt))
                    next_slot += len(prompt)
                    got, want = mine.insert(prompt, idx.clone()), ref.insert(prompt, idx.clone())
                elif op == "lock":
                    m_got, m_want = mine.match_prefix(prompt), ref.match_prefix(prompt)
                    got, want = (m_got.length, m_got.indices.tolist()), (m_want.length, m_want.indices.tolist())
                    mine.lock(m_got.handle)
                    ref.lock(m_want.handle)
                    locks.append((m_got.handle, m_want.handle))
                elif op == "unlock":
                    h_got, h_want = locks.pop(rng.randrange(len(locks)))
                    got, want = mine.unlock(h_got), ref.unlock(h_want)
                else:
                    n = min(rng.randrange(1, 3 * page), ref.evictable_size)
                    got, want = sorted(mine.evict(n).tolist()), sorted(ref.evict(n).tolist())
                shown = {"insert": f"insert({len(prompt)} tokens {prompt[:10]}...)", "evict": f"evict({n})"}
                shown["lock"] = f"match_prefix({len(prompt)} tokens {prompt[:10]}...) + lock"
                log.append(f"  {shown.get(op, 'unlock(one of the locks taken)')} -> {want}")
                if got != want or _state(mine) != _state(ref):
                    raise AssertionError(
                        f"page_size {page}, seed {seed}: the last operation returned {got} (expected {want}); "
                        f"(evictable, protected) {_state(mine)}, expected {_state(ref)}\n" + "\n".join(log[-8:])
                    )
                mine.check_integrity()
