"""Admission: which waiting requests start in the next prefill batch.

An admitted request holds a row of the request table and a *reservation*: KV pages for the
positions the admission policy expects it to fill (``reserved_len``: its prompt and some or all of
its ``max_tokens``). Admission never promises more pages than the pool could give, counting pages
the prefix cache could evict::

    available pages  =  free pages + evictable cached pages
    admit req  only if  pages_needed(req) <= available pages - reserved pages (of admitted requests)

Reserving every request's whole ``max_tokens`` (``ReserveAll``) means no request ever runs out of
memory, but a chat that leaves ``max_tokens`` out reserves the whole context, so a handful of them
fill the pool while using a fraction of it. The engine's default (``Optimistic``) reserves a share of
``max_tokens`` that adapts, and the scheduler *retracts* the newest running requests when decodes do
run out (they wait again, keep their outputs, and recompute their KV later: the same tokens).
"""

from __future__ import annotations

import math
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
        self,
        cache: CacheManager,
        table: ReqTable,
        policy: AdmissionPolicy,
        chunking: ChunkingPolicy,
        running: list[Req],
        tokens_left: float,
        computing: Sequence[Req] = (),
    ):
        """``computing``: requests whose whole prompt is in a launched batch not yet processed (the overlap
        loop's): their prompts enter the prefix cache once it is."""
        self._cache, self._table, self._policy, self._chunking = cache, table, policy, chunking
        self._computing = computing
        self.tokens_left = tokens_left  # new tokens this batch may still compute (inf: no budget)
        self.reserved_pages = sum(self._reservation(r, r.alloc_len) for r in running)  # promised to admitted ones
        self.extends: list[Extend] = []  # this batch so far (a continued chunk first, or after its joiners)
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

    def _reservation(self, req: Req, have: int) -> int:
        """Pages to reserve for ``req`` holding slots for ``[0, have)``: up to the policy's
        ``reserved_len``, never past what it can ever use."""
        end = min(self._policy.reserved_len(req), req.max_device_len - 1)
        return max(0, self._cache.pages_for(end) - have // self._cache.page_size)

    def pages_needed(self, req: Req) -> int:
        """The reservation ``req`` would take if admitted now: pages for its prompt (and, as the
        policy sees fit, its outputs), minus the cached prefix it matched (see ``match``)."""
        m = self._matches.get(req)
        return self._reservation(req, m.length if m is not None else 0)

    def waits_for_batch_prefix(self, req: Req) -> bool:
        """True when a prompt of this batch, or of the batch in flight, shares a longer prefix with ``req``
        than the cache does: a batch later that prefix is cached, and ``req`` computes only the rest."""
        prompts = [x.req.fill_ids for x in self.extends] + [r.input_ids for r in self._computing]
        if not self._cache.shares_prefixes or not prompts:
            return False
        fill = req.fill_ids
        matchable = fill[: len(fill) - 1]
        shared = max(common_prefix_len(p, matchable) for p in prompts)
        return self._cache.aligned(shared) > self._cache.match(matchable).length

    def match(self, req: Req) -> int:
        """Find and lock ``req``'s longest cached prefix (locked, it cannot be evicted; pages it
        protects stop counting as available). Returns its length in tokens. Undo with ``unmatch``."""
        # all but the last token (a full hit must still compute that token's logits), and none a prompt
        # logprob still needs
        m = self._cache.match(req.fill_ids[: req.match_limit])
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
        self._table.set_tokens(row, req.fill_ids)
        self.reserved_pages += self._reservation(req, req.alloc_len)
        self.add_extend(req)

    def add_extend(self, req: Req) -> None:
        """Put an admitted request's next chunk into the batch (charged to ``tokens_left``)."""
        end = self._chunking.extend_end(req, self.tokens_left)
        self.extends.append(Extend(req, req.cached_len, end))
        self.tokens_left -= end - req.cached_len
        if end < req.device_len:
            self.cut = req


class AdmissionPolicy(ABC):
    """Lab 05's seam, registered in ``ADMISSION_POLICIES``. Its decisions must depend only on the
    scheduler's state and its own (never on time): tensor-parallel ranks must all decide alike."""

    def reserved_len(self, req: Req) -> int:
        """The positions ``[0, reserved_len)`` of ``req`` to hold KV for: at least ``req.device_len``
        (what it must prefill); ``max_device_len - 1`` (all it may ever need: the last sampled token
        is never fed back) means it can never run out of memory."""
        return req.max_device_len - 1

    def on_batch(self) -> None:  # noqa: B027 (an optional hook)
        """Called once per batch the scheduler runs."""

    def on_retract(self, reqs: list[Req]) -> None:  # noqa: B027 (an optional hook)
        """Decodes ran out of memory and the scheduler retracted ``reqs`` (back in the waiting
        queue, first in line)."""

    @abstractmethod
    def admit(self, waiting: Sequence[Req], ctx: AdmissionContext) -> None:
        """Admit some of ``waiting`` (oldest first) through ``ctx.admit``.

        Contract: admit a request only while ``ctx.has_room``, and only if its reservation fits:
        ``ctx.pages_needed(req) <= ctx.available_pages() - ctx.reserved_pages``, checked *after*
        ``ctx.match(req)`` (locking its prefix may make cached pages unavailable); ``ctx.unmatch``
        a request that is not admitted. A request that does not fit must not make the ones behind it
        wait forever, nor be passed over forever."""


class ReserveAll(AdmissionPolicy):
    """Every request's whole ``max_tokens``, in arrival order, stopping at the first request that
    does not fit (so none waits forever behind later ones), or that should wait one batch for a
    prefix this batch computes. Memory never runs out; a big request blocks the small ones behind it."""

    def admit(self, waiting: Sequence[Req], ctx: AdmissionContext) -> None:
        for req in waiting:
            if not ctx.has_room or ctx.waits_for_batch_prefix(req):
                break
            ctx.match(req)
            if ctx.pages_needed(req) > ctx.available_pages() - ctx.reserved_pages:
                ctx.unmatch(req)
                break
            ctx.admit(req)


class Optimistic(AdmissionPolicy):
    """The engine's default. Reserves each request's prompt and ``ratio`` of what it may still
    generate (at most ``CLIP`` tokens of it). ``ratio`` starts at ``INIT_RATIO``, falls by ``DECAY``
    per batch to ``MIN_RATIO`` while memory holds, and rises by ``RETRACT_BUMP`` whenever decodes run
    out and requests are retracted. A request that does not fit is passed over by the ones behind
    it, until ``AGING`` later requests have been admitted ahead of it; from then on nobody passes it."""

    INIT_RATIO, MIN_RATIO, DECAY, RETRACT_BUMP = 0.7, 0.1, 0.001, 0.1
    CLIP = 4096
    AGING = 8

    def __init__(self):
        self.ratio = self.INIT_RATIO
        self._passed_over: dict[int, int] = {}  # uid -> later requests admitted while it waited

    def reserved_len(self, req: Req) -> int:
        remaining = req.max_device_len - req.device_len
        return req.device_len - 1 + math.ceil(min(remaining, self.CLIP) * self.ratio)

    def on_batch(self) -> None:  # noqa: B027 (an optional hook)
        self.ratio = max(self.MIN_RATIO, self.ratio - self.DECAY)

    def on_retract(self, reqs: list[Req]) -> None:  # noqa: B027 (an optional hook)
        self.ratio = min(1.0, self.ratio + self.RETRACT_BUMP)

    def admit(self, waiting: Sequence[Req], ctx: AdmissionContext) -> None:
        live = {r.uid for r in waiting}
        self._passed_over = {u: n for u, n in self._passed_over.items() if u in live}
        skipped: list[Req] = []
        for req in waiting:
            if not ctx.has_room or any(self._passed_over.get(r.uid, 0) >= self.AGING for r in skipped):
                break  # a request that waited long enough is not passed: the memory that frees up is its
            if ctx.waits_for_batch_prefix(req):
                continue
            ctx.match(req)
            if ctx.pages_needed(req) > ctx.available_pages() - ctx.reserved_pages:
                ctx.unmatch(req)
                skipped.append(req)
                continue
            ctx.admit(req)
            self._passed_over.pop(req.uid, None)
            for r in skipped:
                self._passed_over[r.uid] = self._passed_over.get(r.uid, 0) + 1


ADMISSION_POLICIES: Registry[type[AdmissionPolicy]] = Registry(
    "admission policy", {"default": Optimistic, "reserve-all": ReserveAll}
)
