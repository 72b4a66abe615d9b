"""KV memory: the pool of K/V slots, the page allocator, the request table (page table) and
prefix caches over them. Each swappable part has a registry: ``ALLOCATORS``, ``REQ_TABLES``,
``PREFIX_CACHES``."""

from __future__ import annotations

from minisgl.kvcache.allocator import ALLOCATORS, FreeListAllocator, PageAllocator
from minisgl.kvcache.base import MatchResult, PrefixCache
from minisgl.kvcache.naive import NaivePrefixCache
from minisgl.kvcache.pool import KVPool
from minisgl.kvcache.radix import RadixPrefixCache
from minisgl.kvcache.table import REQ_TABLES, ReqTable, TensorReqTable, ragged_index
from minisgl.registry import Registry

# name -> factory(page_size); a lab registers its own implementation here to run inside the engine
PREFIX_CACHES: Registry[type[PrefixCache]] = Registry(
    "cache type", {"radix": RadixPrefixCache, "naive": NaivePrefixCache}
)


def create_prefix_cache(name: str, page_size: int) -> PrefixCache:
    return PREFIX_CACHES.get(name)(page_size)


__all__ = [
    "ALLOCATORS",
    "FreeListAllocator",
    "KVPool",
    "MatchResult",
    "NaivePrefixCache",
    "PREFIX_CACHES",
    "PageAllocator",
    "PrefixCache",
    "REQ_TABLES",
    "RadixPrefixCache",
    "ReqTable",
    "TensorReqTable",
    "create_prefix_cache",
    "ragged_index",
]
