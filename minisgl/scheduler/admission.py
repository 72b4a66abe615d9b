"""Admission: which waiting requests start in the next prefill batch.

An admitted request holds a row of the request table and a *reservation*: the KV pages it may
still need until it finishes (prompt + ``max_tokens``, minus what it holds). Admission never
promises more pages than the pool could ever give, counting pages the prefix cache could evict, so
a running request never runs out of memory mid-way::

    available pages  =  free pages + evictable cached pages
    admit req  only if  pages_needed(req) <= available pages - reserved pages (of admitted requests)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from minisgl.core import Req
from minisgl.kvcache import MatchResult, ReqTable
from minisgl.kvcache.radix import common_prefix_len
from minisgl.registry import Registry
from minisgl.scheduler.cache import CacheManager
from minisgl.scheduler.chunking import ChunkingPolicy


@dataclass
class Extend:
    """A request computes positions ``[start, end)`` of its prompt in this batch."""

    req: Req
    start: int
    end: int


class AdmissionContext:
    """What an admission policy sees and may do while it fills one prefill batch."""

    def __init__(
        self, cache: CacheManager, table: ReqTable, chunking: ChunkingPolicy, running: list[Req], tokens_left: float
    ):
        self._cache, self._table, self._chunking = cache, table, chunking
        self.tokens_left = tokens_left  # new tokens this batch may still compute (inf: no budget)
        self.reserved_pages = sum(cache.pages_still_needed(r) for r in running)  # promised to admitted requests
        self.extends: list[Extend] = []  # this batch so far (a continued chunk first)
        self.cut: Req | None = None  # the request whose prompt this batch cuts (it continues next batch)
        self._matches: dict[Req, MatchResult] = {}

    @property
    def page_size(self) -> int:
        return self._cache.page_size

    @property
    def rows_left(self) -> int:
        return self._table.num_free_rows

    @property
    def has_room(self) -> bool:
        """Tokens and a row are left, and no prompt was cut (a cut prompt ends the batch)."""
        return self.tokens_left > 0 and self.rows_left > 0 and self.cut is None

    def available_pages(self) -> int:
        """Free pages + pages the prefix cache could evict now (locking a match changes it)."""
        return self._cache.available_pages

    def pages_needed(self, req: Req) -> int:
        """The reservation ``req`` would take if admitted now: pages for its whole prompt and
        ``max_tokens``, minus the cached prefix it matched (see ``match``)."""
        m = self._matches.get(req)
        return self._cache.pages_still_needed(req, m.length if m is not None else 0)

    def waits_for_batch_prefix(self, req: Req) -> bool:
        """True when a prompt of this batch shares a longer prefix with ``req`` than the cache does:
        one batch later that prefix is cached, and ``req`` computes only the rest."""
        if not self._cache.shares_prefixes or not self.extends:
            return False
        matchable = req.input_ids[: req.prompt_len - 1]
        shared = max(common_prefix_len(x.req.input_ids, matchable) for x in self.extends)
        return self._cache.aligned(shared) > self._cache.match(matchable).length

    def match(self, req: Req) -> int:
        """Find and lock ``req``'s longest cached prefix (locked, it cannot be evicted; pages it
        protects stop counting as available). Returns its length in tokens. Undo with ``unmatch``."""
        # all but the last prompt token: a full hit must still compute that token's logits
        m = self._cache.match(req.input_ids[: req.prompt_len - 1])
        self._cache.lock(m.handle)
        self._matches[req] = m
        return m.length

    def unmatch(self, req: Req) -> None:
        self._cache.unlock(self._matches.pop(req).handle)

    def admit(self, req: Req) -> None:
        """Start ``req`` in this batch: a table row, its matched prefix (``match`` first), its
        reservation, and as much of its prompt as the chunking policy gives it."""
        m = self._matches.pop(req, None)
        if m is None:
            self.match(req)
            m = self._matches.pop(req)
        row = self._table.alloc_row()
        req.admit(row, m.length, m.handle)
        self._table.set_slots(row, 0, m.indices)
        self._table.set_tokens(row, req.input_ids)
        self.reserved_pages += self._cache.pages_still_needed(req)
        self.add_extend(req)

    def add_extend(self, req: Req) -> None:
        """Put an admitted request's next chunk into the batch (charged to ``tokens_left``)."""
        end = self._chunking.extend_end(req, self.tokens_left)
        self.extends.append(Extend(req, req.cached_len, end))
        self.tokens_left -= end - req.cached_len
        if end < req.prompt_len:
            self.cut = req


class AdmissionPolicy(ABC):
    """Lab 05's seam, registered in ``ADMISSION_POLICIES``."""

    @abstractmethod
    def admit(self, waiting: Sequence[Req], ctx: AdmissionContext) -> None:
        """Admit some of ``waiting`` (oldest first) through ``ctx.admit``.

        Contract: admit a request only while ``ctx.has_room``, and only if its reservation fits:
        ``ctx.pages_needed(req) <= ctx.available_pages() - ctx.reserved_pages``, checked *after*
        ``ctx.match(req)`` (locking its prefix may make cached pages unavailable); ``ctx.unmatch``
        a request that is not admitted. A request that does not fit must not make the ones behind it
        wait forever, nor be passed over forever."""


class FirstComeFirstServed(AdmissionPolicy):
    """In arrival order, stopping at the first request that does not fit (no request waits forever
    behind later ones), or that should wait one batch for a prefix this batch computes."""

    def admit(self, waiting: Sequence[Req], ctx: AdmissionContext) -> None:
        for req in waiting:
            if not ctx.has_room or ctx.waits_for_batch_prefix(req):
                break
            ctx.match(req)
            if ctx.pages_needed(req) > ctx.available_pages() - ctx.reserved_pages:
                ctx.unmatch(req)
                break
            ctx.admit(req)


ADMISSION_POLICIES: Registry[type[AdmissionPolicy]] = Registry("admission policy", {"default": FirstComeFirstServed})
