"""What the scheduler reports: a token per request per step (``TokenEvent``), a record per batch
for observers (``BatchEvent``), and prefix-cache counters (``CacheStats``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass
class TokenEvent:
    """One sampled token of a request; ``finish_reason`` is set on its last one."""

    uid: int
    token_id: int
    finish_reason: str | None = None
    # with SamplingParams.logprobs / top_logprobs: this token's logprob and the most likely tokens'
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None
    # with SamplingParams.prompt_logprobs_from (on the first token): (logprob, top) per scored prompt token
    prompt_logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None


@dataclass
class BatchEvent:
    """One batch, as an observer sees it once its tokens reached the host (``Scheduler.observers``).

    Memory is counted in pages right after the batch's KV was allocated; times are
    ``time.perf_counter()`` seconds: scheduling began, the forward pass was launched (on a GPU it
    runs asynchronously after that), its tokens were processed."""

    index: int  # batches run so far, from 0
    kind: Literal["prefill", "decode", "verify"]  # verify: speculative decoding's pass (scheduler/speculate.py)
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

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def batch_event(sched: Any, batch: Any, index: int) -> BatchEvent:
    """The record of a batch just prepared (``Scheduler.prepare``; ``sched`` is the scheduler)."""
    p, cache = sched.page_size, sched.cache.cache
    cached = (cache.evictable_size + cache.protected_size) // p
    free = sched.cache.allocator.num_free
    hits = sum(r.hit_len for r, s in zip(batch.reqs, batch.starts) if batch.is_prefill and s == r.hit_len)
    return BatchEvent(
        index=index,
        kind="verify" if batch.spec is not None else batch.phase,
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
        t_scheduled=sched._t_schedule,
        retracted=sched._retracted,
    )
