"""``PrefillManager``: the waiting queue, the request whose prompt is being chunked, and the
building of a prefill batch from the admission policy (who starts) and the chunking policy (how
much of each prompt runs now)."""

from __future__ import annotations

from collections import deque

from minisgl.core import Batch, Req
from minisgl.kvcache import ReqTable
from minisgl.scheduler.admission import AdmissionContext, AdmissionPolicy, Extend
from minisgl.scheduler.cache import CacheManager
from minisgl.scheduler.chunking import ChunkingPolicy


class PrefillManager:
    def __init__(
        self,
        cache: CacheManager,
        table: ReqTable,
        budgets: tuple[int | None, int | None],
        admission: AdmissionPolicy,
        chunking: ChunkingPolicy,
    ):
        """``budgets``: prompt tokens per batch while requests decode, and while none does (None: no limit)."""
        self.cache, self.table = cache, table
        self.budgets = tuple(float("inf") if b is None else b for b in budgets)
        self.admission, self.chunking = admission, chunking
        self.pending: deque[Req] = deque()
        self.chunked: Req | None = None  # admitted, prompt partly prefilled: first in the next batch
        # prompts completed by a launched batch, not yet in the prefix cache (only the overlap loop schedules
        # between its launch and its processing): a request sharing a prefix with one waits for it
        self.computing: dict[Req, None] = {}

    @property
    def has_work(self) -> bool:
        return bool(self.pending) or self.chunked is not None

    def add(self, req: Req) -> None:
        self.pending.append(req)

    def launching(self, batch: Batch, shares_prefixes: bool) -> None:
        """``batch`` is prepared: the prompts it completes (a kept sample, no output yet) are computing."""
        if shares_prefixes:
            self.computing.update((r, None) for r, k in zip(batch.reqs, batch.sample_mask) if k and not r.output_ids)

    def processed(self, batch: Batch) -> None:
        """``batch``'s outputs are processed: the prompts it completed are in the prefix cache now."""
        for req in batch.reqs:
            self.computing.pop(req, None)

    def remove(self, req: Req) -> bool:
        """Drop a request that is waiting (not admitted); False if it is not waiting."""
        try:
            self.pending.remove(req)
            return True
        except ValueError:
            return False

    def schedule(self, running: list[Req], num_decoding: int) -> list[Extend]:
        """Extends of the next prefill batch (a newly admitted request's starts at its ``hit_len``).
        ``running``: the admitted requests, whose reservations stand; ``num_decoding`` of them decode
        (and wait for this batch)."""
        budget = self.chunking.budget(*self.budgets, num_decoding)
        ctx = AdmissionContext(
            self.cache, self.table, self.admission, self.chunking, running, budget, list(self.computing)
        )
        # AdaptiveChunking: while a prompt is chunked, the waiting ones that fit whole in half the batch go
        # first (none is cut), then the chunk takes what is left; then, if its last piece leaves room, the rest
        joiners = self.chunking.alongside(list(self.pending)) if self.chunked and self.pending else []
        if joiners:
            self.admission.admit(joiners, ctx)
            assert ctx.cut is None and ctx.tokens_left > 0, "a prompt joining a chunk must fit whole"
        if self.chunked is not None:
            ctx.add_extend(self.chunked)
        rest = [r for r in self.pending if not r.is_admitted]
        if ctx.has_room and rest:
            self.admission.admit(rest, ctx)
        admitted = {id(x.req) for x in ctx.extends if x.req is not self.chunked}
        if admitted:
            self.pending = deque(r for r in self.pending if id(r) not in admitted)
        self.chunked = ctx.cut
        return ctx.extends
