"""``PrefillManager``: admission of waiting requests and chunked prefill.

A prefill batch holds at most ``max_prefill_length`` new tokens. A prompt that does not fit in
what is left is split: its first chunk runs now and it stays the *chunked* request, first in line
for the next prefill batch. Admission is first-come first-served and stops at the first request
that does not fit (in rows or in memory), so no request waits forever behind later ones. It also
stops at a request whose prompt shares more with a prompt of this batch than with the cache: one
batch later that prefix is cached (``Scheduler._share_prompt``) and it computes only the rest.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from minisgl.core import Req
from minisgl.kvcache.radix import common_prefix_len
from minisgl.scheduler.cache import CacheManager
from minisgl.scheduler.table import ReqTable


@dataclass
class Extend:
    req: Req
    start: int
    end: int


class PrefillManager:
    def __init__(self, cache: CacheManager, table: ReqTable, budget: int | None):
        self.cache, self.table = cache, table
        self.budget = budget
        self.pending: deque[Req] = deque()
        self.chunked: Req | None = None  # admitted, prompt partly prefilled

    @property
    def has_work(self) -> bool:
        return bool(self.pending) or self.chunked is not None

    def add(self, req: Req) -> None:
        self.pending.append(req)

    def remove(self, req: Req) -> bool:
        """Drop a request that is waiting (not admitted); False if it is not waiting."""
        try:
            self.pending.remove(req)
            return True
        except ValueError:
            return False

    def schedule(self, reserved_pages: int) -> list[Extend]:
        """Extends for the next prefill batch; ``reserved_pages`` are promised to running requests."""
        left = self.budget if self.budget is not None else float("inf")
        out: list[Extend] = []
        if self.chunked is not None:
            req, self.chunked = self.chunked, None
            out.append(self._take(req, left))
            left -= out[-1].end - out[-1].start
        while self.pending and left > 0 and self.chunked is None and self.table.num_free_rows > 0:
            req = self.pending[0]
            if not self._admit(req, reserved_pages, [x.req.input_ids for x in out]):
                break
            self.pending.popleft()
            reserved_pages += self.cache.pages_still_needed(req)
            out.append(self._take(req, left))
            left -= out[-1].end - out[-1].start
        return out

    def _take(self, req: Req, left: float) -> Extend:
        end = int(min(req.prompt_len, req.cached_len + left))
        if end < req.prompt_len:
            self.chunked = req
        return Extend(req, req.cached_len, end)

    def _admit(self, req: Req, reserved_pages: int, batch_prompts: list[list[int]]) -> bool:
        # match all but the last prompt token: a full hit must still compute that token's logits
        matchable = req.input_ids[: req.prompt_len - 1]
        match = self.cache.match(matchable)
        if self.cache.cache.shares_prefixes and batch_prompts:
            # a longer prefix is being computed in this batch: wait one batch and reuse it
            shared = max(common_prefix_len(p, matchable) for p in batch_prompts)
            if self.cache.cache.aligned(shared) > match.length:
                return False
        self.cache.cache.lock(match.handle)  # locking first: it may turn evictable pages protected
        req.alloc_len = match.length
        if self.cache.pages_still_needed(req) > self.cache.available_pages - reserved_pages:
            self.cache.cache.unlock(match.handle)
            req.alloc_len = 0
            return False
        req.table_idx = self.table.alloc_row()
        req.cache_handle, req.hit_len, req.locked_len, req.cached_len = (match.handle, *[match.length] * 3)
        if match.length:
            rows = torch.full((match.length,), req.table_idx, dtype=torch.int64)
            self.table.set_slots(rows, torch.arange(match.length), match.indices)
        self.table.set_tokens(req.table_idx, req.input_ids)
        return True
