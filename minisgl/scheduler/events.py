"""What the scheduler reports: a token per request per step (``TokenEvent``), a record per batch
for observers (``BatchEvent``, made by a ``Recorder``), and prefix-cache counters (``CacheStats``)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from minisgl.core import TokenEvent  # (its home: what a step yields, next to the request)


@dataclass
class BatchEvent:
    """One batch, as an observer sees it once its tokens reached the host (``Scheduler.observers``).

    Memory is counted in pages right after the batch's KV was allocated; times are
    ``time.perf_counter()`` seconds: scheduling began, the forward pass was launched (on a GPU it
    runs asynchronously after that), its tokens were processed."""

    index: int  # batches run so far, from 0
    kind: str  # "prefill", "decode", or a feature's own pass (``Batch.label``, e.g. "verify")
    uids: list[int]
    starts: list[int]  # request i computes positions [starts[i], ends[i])
    ends: list[int]
    riders: int  # a prefill batch's last ``riders`` rows are decodes riding along (mixed chunk)
    hit_tokens: int  # prompt tokens of the requests admitted by this batch served from the prefix cache
    pages_used: int  # held by running requests
    pages_cached: int  # held by the prefix cache (evictable or locked)
    pages_free: int
    num_waiting: int  # after this batch was planned
    num_running: int
    t_scheduled: float
    t_launched: float = 0.0
    t_done: float = 0.0
    finished: dict[int, str] = field(default_factory=dict)  # uid -> finish reason, for requests done here
    retracted: list[int] = field(default_factory=list)  # uids sent back to wait to make room for this batch

    @property
    def num_tokens(self) -> int:
        return sum(e - s for s, e in zip(self.starts, self.ends))

    @property
    def prefill_tokens(self) -> int:
        """Prompt tokens computed (a decode batch's tokens are not, nor the riders of a prefill batch)."""
        return self.num_tokens - self.riders if self.kind == "prefill" else 0


BatchObserver = Callable[[BatchEvent], None]


@dataclass
class CacheStats:
    prompt_tokens: int = 0  # prompt tokens of admitted requests
    hit_tokens: int = 0  # of which served from the prefix cache
    prefill_tokens: int = 0  # tokens computed by prefill batches
    retracted: int = 0  # times a running request was sent back to wait because memory ran out

    def count(self, extends: list[Any]) -> None:
        """A prefill batch's extends (``admission.Extend``) were scheduled."""
        for x in extends:
            self.prefill_tokens += x.end - x.start
            if x.start == x.req.hit_len and x.req.epoch == 0:  # first chunk of a newly admitted request
                self.prompt_tokens += x.req.prompt_len
                self.hit_tokens += x.req.hit_len

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def batch_event(sched: Any, batch: Any, index: int, t_scheduled: float) -> BatchEvent:
    """The record of a batch just prepared (``Scheduler.prepare``; ``sched`` is the scheduler)."""
    p, cache = sched.page_size, sched.cache.cache
    cached = (cache.evictable_size + cache.protected_size) // p
    free = sched.cache.allocator.num_free
    hits = sum(r.hit_len for r, s in zip(batch.reqs, batch.starts) if batch.is_prefill and s == r.hit_len)
    return BatchEvent(
        index=index,
        kind=batch.label or batch.phase,
        uids=[r.uid for r in batch.reqs],
        starts=list(batch.starts),
        ends=list(batch.ends),
        riders=batch.riders,
        hit_tokens=hits,
        pages_used=sched.engine.num_pages - free - cached,
        pages_cached=cached,
        pages_free=free,
        num_waiting=sched.num_waiting,
        num_running=sched.num_running,
        t_scheduled=t_scheduled,
        retracted=sched._retracted,
    )


class Recorder:
    """The scheduler's batch events, handed to its ``observers`` once each batch was processed. With no
    observer nothing is built (a step pays nothing)."""

    def __init__(self):
        self.observers: list[BatchObserver] = []
        self._events: deque[BatchEvent] = deque()  # prepared, not yet processed
        self._count, self._t_scheduled = 0, 0.0

    def scheduling(self) -> None:
        if self.observers:
            self._t_scheduled = time.perf_counter()

    def prepared(self, sched: Any, batch: Any) -> None:
        if self.observers:
            self._events.append(batch_event(sched, batch, self._count, self._t_scheduled))
            self._count += 1

    def launched(self) -> None:
        if self.observers:
            self._events[-1].t_launched = time.perf_counter()

    def processed(self, tokens: list[TokenEvent]) -> None:
        if self.observers and self._events:
            ev = self._events.popleft()
            ev.t_done = time.perf_counter()
            ev.finished = {e.uid: e.finish_reason for e in tokens if e.finish_reason is not None}
            for observe in self.observers:
                observe(ev)
