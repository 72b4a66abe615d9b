"""KV memory: the pool of K/V slots, the page allocator, and prefix caches over them."""

from __future__ import annotations

from minisgl.kvcache.allocator import PageAllocator
from minisgl.kvcache.base import MatchResult, PrefixCache
from minisgl.kvcache.naive import NaivePrefixCache
from minisgl.kvcache.pool import KVPool
from minisgl.kvcache.radix import RadixPrefixCache

# name -> factory(page_size); a lab registers its own implementation here to run inside the engine
PREFIX_CACHES: dict[str, type[PrefixCache]] = {
    "radix": RadixPrefixCache,
    "naive": NaivePrefixCache,
}


def create_prefix_cache(name: str, page_size: int) -> PrefixCache:
    if name not in PREFIX_CACHES:
        raise ValueError(f"unknown cache type {name!r}; choose one of {sorted(PREFIX_CACHES)}")
    return PREFIX_CACHES[name](page_size)


__all__ = [
    "KVPool",
    "MatchResult",
    "NaivePrefixCache",
    "PREFIX_CACHES",
    "PageAllocator",
    "PrefixCache",
    "RadixPrefixCache",
    "create_prefix_cache",
]
