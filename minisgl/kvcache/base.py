"""The prefix-cache interface: which token prefixes still have their KV in the pool.

Units are *slots* (tokens). With ``page_size > 1`` only whole pages are cached: lengths passed in
are rounded down to a multiple of ``page_size`` and returned lengths are multiples of it.

Ownership. Every slot of the pool is in exactly one place: the allocator's free list, the cache
(evictable when no request uses it, protected while a handle on it is locked), or a running request.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, NamedTuple

import torch


class MatchResult(NamedTuple):
    length: int  # tokens of the query found in the cache (multiple of page_size)
    indices: torch.Tensor  # their KV slot indices, int64, len == length
    handle: Any  # pass to lock()/unlock(); identifies the matched prefix


class PrefixCache(ABC):
    # False for a cache that never keeps anything (the naive baseline): the scheduler then skips
    # offering it prompts that are still in use
    shares_prefixes: bool = True

    def __init__(self, page_size: int = 1):
        self.page_size = page_size

    @abstractmethod
    def match_prefix(self, token_ids: list[int]) -> MatchResult:
        """The longest cached prefix of ``token_ids``. The handle must be locked before the returned
        indices are used: until then they may be evicted."""

    @abstractmethod
    def lock(self, handle: Any) -> None:
        """Protect the matched prefix (and every prefix of it) from eviction. Reference counted."""

    @abstractmethod
    def unlock(self, handle: Any) -> None:
        """Undo one ``lock``. Unlocking more often than locking raises."""

    @abstractmethod
    def insert(self, token_ids: list[int], indices: torch.Tensor) -> int:
        """Offer the KV of ``token_ids`` (slots ``indices``) to the cache; return ``prefix_len``.

        The cache keeps ``indices[prefix_len:aligned_len]`` (it owns them from now on); the caller
        still owns ``indices[:prefix_len]`` (a prefix that was already cached, so they are
        duplicates to free unless they are the cache's own slots from ``match_prefix``) and the
        unaligned tail ``indices[aligned_len:]``. A cache that keeps nothing returns ``aligned_len``.
        """

    @abstractmethod
    def evict(self, n: int) -> torch.Tensor:
        """Free at least ``n`` slots of unlocked entries, least recently used first, and return
        them (the caller gives them back to the allocator). May evict more than asked (whole
        entries); evicting 0 is always safe; asking for more than ``evictable_size`` raises."""

    @property
    @abstractmethod
    def evictable_size(self) -> int:
        """Slots held by the cache that ``evict`` could free now."""

    @property
    @abstractmethod
    def protected_size(self) -> int:
        """Slots held by the cache under a lock."""

    @abstractmethod
    def check_integrity(self) -> None:
        """Raise ``AssertionError`` if an internal invariant does not hold."""

    def aligned(self, n: int) -> int:
        return n - n % self.page_size
