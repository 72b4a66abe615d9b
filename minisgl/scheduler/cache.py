"""``CacheManager``: the page allocator and the prefix cache seen as one pool of memory.

Pages available to new work = free pages + pages the cache could evict. Allocation evicts
(least recently used first) only when the free list runs short."""

from __future__ import annotations

import torch

from minisgl.core import Req
from minisgl.kvcache import MatchResult, PageAllocator, create_prefix_cache


class CacheManager:
    def __init__(self, num_pages: int, page_size: int, cache_type: str):
        self.page_size = page_size
        self.allocator = PageAllocator(num_pages, page_size)
        self.cache = create_prefix_cache(cache_type, page_size)

    @property
    def available_pages(self) -> int:
        return self.allocator.num_free + self.cache.evictable_size // self.page_size

    def pages_still_needed(self, req: Req) -> int:
        """Pages an admitted request may still allocate before it finishes: positions
        ``[0, max_device_len - 1)`` need KV (the last sampled token is never fed back)."""
        p = self.page_size
        return -(-(req.max_device_len - 1) // p) - req.alloc_len // p

    def match(self, token_ids: list[int]) -> MatchResult:
        return self.cache.match_prefix(token_ids)

    def alloc_slots(self, num_pages: int) -> torch.Tensor:
        """Slots of ``num_pages`` fresh pages, evicting from the cache if needed."""
        short = num_pages - self.allocator.num_free
        if short > 0:
            self.free_slots(self.cache.evict(short * self.page_size))
        pages = self.allocator.alloc(num_pages)
        offs = torch.arange(self.page_size, dtype=torch.int64)
        return (pages[:, None] * self.page_size + offs[None, :]).flatten()

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
