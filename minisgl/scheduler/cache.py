"""``CacheManager``: the page allocator and the prefix cache seen as one pool of memory.

Pages available to new work = free pages + pages the cache could evict. Allocation evicts
(least recently used first) only when the free list runs short. Every slot is in exactly one place:
free, in the cache (evictable or protected), or owned by one admitted request."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from minisgl.core import Req
from minisgl.kvcache import ALLOCATORS, MatchResult, ReqTable, create_prefix_cache


class CacheManager:
    def __init__(self, num_pages: int, page_size: int, cache_type: str, table: ReqTable, allocator: str = "default"):
        self.num_pages, self.page_size, self.table = num_pages, page_size, table
        self.allocator = ALLOCATORS.get(allocator)(num_pages, page_size)
        self.cache = create_prefix_cache(cache_type, page_size)

    @property
    def available_pages(self) -> int:
        return self.allocator.num_free + self.cache.evictable_size // self.page_size

    @property
    def shares_prefixes(self) -> bool:
        return self.cache.shares_prefixes

    def aligned(self, n: int) -> int:
        return self.cache.aligned(n)

    def pages_for(self, positions: int) -> int:
        """Pages that hold positions ``[0, positions)``."""
        return -(-positions // self.page_size)

    def pages_still_needed(self, req: Req) -> int:
        """Pages a request may still allocate before it finishes, at most: positions
        ``[0, max_device_len - 1)`` need KV (the last sampled token is never fed back)."""
        return self.pages_for(req.max_device_len - 1) - req.alloc_len // self.page_size

    def match(self, token_ids: list[int]) -> MatchResult:
        return self.cache.match_prefix(token_ids)

    def lock(self, handle: Any) -> None:
        self.cache.lock(handle)

    def unlock(self, handle: Any) -> None:
        self.cache.unlock(handle)

    def alloc_pages(self, num_pages: int) -> torch.Tensor:
        """``num_pages`` fresh pages, evicting from the cache if the free list is short."""
        short = num_pages - self.allocator.num_free
        if short > 0:
            self.free_slots(self.cache.evict(short * self.page_size))
        return self.allocator.alloc(num_pages)

    def flush(self) -> None:
        """Evict every cached prefix that no running request holds (a benchmark starts each timed
        run from an empty cache this way)."""
        if self.cache.evictable_size:
            self.free_slots(self.cache.evict(self.cache.evictable_size))

    def free_slots(self, slots: torch.Tensor) -> None:
        """Give page-aligned runs of slots back to the allocator."""
        self.allocator.free(self.allocator.pages_of(slots))

    def cache_prompt(self, token_ids: list[int], slots: torch.Tensor, locked_len: int, handle) -> MatchResult:
        """A running request's prompt is prefilled: share its whole pages now, not only when it
        finishes, so requests admitted from now on reuse them. Returns the match of the prompt in
        the cache, already locked (the old ``handle`` is unlocked): the cache owns those slots now.

        If another request cached part of it meanwhile, ours is a duplicate: it is freed, and the
        caller must point its page table at the returned indices for that range."""
        end = self.cache.aligned(len(token_ids))
        prefix = self.cache.insert(token_ids[:end], slots[:end])
        self.free_slots(slots[locked_len:prefix])
        match = self.cache.match_prefix(token_ids[:end])
        self.cache.lock(match.handle)
        self.cache.unlock(handle)
        return match

    def release(self, token_ids: list[int], slots: torch.Tensor, locked_len: int, handle) -> None:
        """A request is done with ``slots`` (its KV of ``token_ids``; ``slots`` may extend past
        them to the end of the last page). Offer the whole pages to the cache, free what it does
        not keep, and drop the request's lock on the prefix it matched at admission."""
        end = self.cache.aligned(len(token_ids))
        prefix = self.cache.insert(token_ids[:end], slots[:end])
        # [0, locked_len) are the cache's own slots; [locked_len, prefix) duplicate what another request
        # cached meanwhile; [end, ...) is the partial last page (and any page past it)
        self.free_slots(slots[locked_len:prefix])
        self.free_slots(slots[end:])
        self.cache.unlock(handle)

    # ---- a running request's KV ------------------------------------------------------------
    def share_prompt(self, req: Req) -> None:
        """Insert a request's freshly prefilled prompt into the prefix cache (its KV is written:
        this runs after the batch, and later batches are ordered after it on the device)."""
        old, row = req.locked_len, req.table_idx
        match = self.cache_prompt(req.input_ids, self.table.slots(row, 0, req.alloc_len), old, req.cache_handle)
        req.relock(match.length, match.handle)
        if match.length > old:  # point the duplicate range at the cache's copy (a no-op where it was ours)
            self.table.set_slots(row, old, match.indices[old:])

    def release_request(self, req: Req) -> None:
        """An admitted request gives back its row and KV: the computed tokens' whole pages to the
        prefix cache (finished or retracted, later requests may reuse them), the rest freed."""
        tokens = req.all_token_ids()[: req.cached_len]
        self.release(tokens, self.table.slots(req.table_idx, 0, req.alloc_len), req.locked_len, req.cache_handle)
        self.table.free_row(req.table_idx)

    def check(self, admitted: Iterable[Req]) -> None:
        """Raise ``AssertionError`` unless every slot is free, cached or owned by exactly one of the
        ``admitted`` requests, and none holds more than its reservation."""
        self.cache.check_integrity()
        p, admitted = self.page_size, list(admitted)
        owned = sum(r.alloc_len - r.locked_len for r in admitted)
        total = self.allocator.num_free * p + self.cache.evictable_size + self.cache.protected_size
        assert total + owned == self.num_pages * p, (
            f"KV accounting broken: free+cached {total} + owned {owned} != {self.num_pages * p}"
        )
        for r in admitted:
            assert self.pages_still_needed(r) >= 0, f"request {r.uid} holds more KV than it reserved"
