"""The real scheduler on a model-free engine, for lab 05 (admission policies).

Everything but the model is the engine's own: ``Scheduler``, its prefill and decode managers, the
KV page allocator, the radix prefix cache, the request table and ``debug_checks`` after every step.
The model is replaced by a function of each request's last token and position, so a batch costs
microseconds and a request's tokens never depend on what it is batched with: hundreds of random
workloads run in seconds.

``watched(cls)`` is the policy under test, watched at every call: each ``ctx.admit`` must happen
while ``ctx.has_room``, in waiting order, without over-committing memory, and no refused request
may keep its prefix locked. A broken rule raises ``Violation`` at once, naming it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from minisgl.core import Req, SamplingParams
from minisgl.engine.config import EngineConfig
from minisgl.kvcache import REQ_TABLES
from minisgl.scheduler import Scheduler
from minisgl.scheduler.admission import ADMISSION_POLICIES, AdmissionContext, AdmissionPolicy, Optimistic

VOCAB = 1000


class Reference(Optimistic):
    """The contract of lab 05, from the engine's own code: ``Optimistic``'s skip-ahead with aging,
    reserving every request's whole ``max_tokens`` (a fixed share of 100%)."""

    AGING = 4

    def reserved_len(self, req: Req) -> int:
        return req.max_device_len - 1

    def on_batch(self) -> None:
        pass

    def on_retract(self, reqs: list[Req]) -> None:
        pass


def reference_fits(req: Req, ctx: AdmissionContext) -> bool:
    """The memory test of ``Reference.admit``: match (lock) the cached prefix, then compare what is
    left; a request that does not fit is unmatched."""
    ctx.match(req)
    if ctx.pages_needed(req) > ctx.available_pages() - ctx.reserved_pages:
        ctx.unmatch(req)
        return False
    return True


class FakeEngine:
    """What the scheduler uses of an ``Engine``, with a model that is a hash of (token, position)."""

    def __init__(self, config: EngineConfig, num_pages: int, max_seq_len: int = 1024):
        self.device = torch.device("cpu")
        self.num_pages, self.max_seq_len = num_pages, max_seq_len
        self.model_config = SimpleNamespace(vocab_size=VOCAB, eos_token_ids=[0])
        table_cls = REQ_TABLES.get(config.components.req_table)
        self.table = table_cls(config.max_running_requests, max_seq_len, config.page_size, self.device)

    def forward_batch(self, batch, info) -> torch.Tensor:
        last = batch.input_ids[batch.logit_idx].long()
        pos = batch.positions[batch.logit_idx].long()
        return (last * 31 + pos * 7 + 3) % (VOCAB - 1) + 1  # never 0, the EOS id


class Violation(AssertionError):
    """The policy broke a rule of the admission contract (the message says which)."""


def _uid_list(reqs) -> list[int]:
    return [r.uid for r in reqs]


def watched(cls: type[AdmissionPolicy]) -> type[AdmissionPolicy]:
    """``cls`` with every ``admit`` call checked and recorded in ``self.calls``: one list of admitted
    uids per call (the waiting queue it saw, too, in ``self.queues``)."""

    class Watched(cls):  # type: ignore[valid-type, misc]
        def __init__(self):
            super().__init__()
            self.calls: list[list[int]] = []
            self.queues: list[list[int]] = []

        def admit(self, waiting, ctx: AdmissionContext) -> None:
            waiting = list(waiting)
            order = {id(r): i for i, r in enumerate(waiting)}
            admitted: list[int] = []
            real_admit = ctx.admit

            def admit(req: Req) -> None:
                why = None
                if ctx.tokens_left <= 0:
                    why = "the batch's token budget is spent (ctx.tokens_left <= 0): admitting past the token budget"
                elif ctx.rows_left <= 0:
                    why = "no request-table row is left (ctx.rows_left == 0): admission ignoring rows_left"
                elif ctx.cut is not None:
                    why = "a prompt was cut in this batch (ctx.cut), which ends the batch"
                if why:
                    raise Violation(f"request {req.uid} was admitted while ctx.has_room was False: {why}")
                if admitted and order.get(id(req), -1) < order[id(admitted[-1])]:
                    raise Violation(
                        f"request {req.uid} was admitted after request {admitted[-1].uid}, which arrived later "
                        f"(waiting order {_uid_list(waiting)}): admitting out of arrival order; admit in FIFO "
                        "order among the requests that fit"
                    )
                if ctx.waits_for_batch_prefix(req):
                    raise Violation(
                        f"request {req.uid} was admitted although it shares a longer prefix with a prompt of this "
                        "batch than the cache holds: it must wait one batch (ctx.waits_for_batch_prefix), then it "
                        "reuses that prefix instead of computing it again"
                    )
                real_admit(req)
                admitted.append(req)
                if ctx.reserved_pages > ctx.available_pages():
                    raise Violation(
                        f"admitting request {req.uid} over-commits the KV pool: the admitted requests now hold "
                        f"{ctx.reserved_pages} reserved pages but only {ctx.available_pages()} are free or "
                        "evictable. A request fits only if ctx.pages_needed(req) <= ctx.available_pages() - "
                        "ctx.reserved_pages, both read after ctx.match(req)"
                    )

            ctx.admit = admit  # type: ignore[method-assign]
            try:
                super().admit(waiting, ctx)
            finally:
                del ctx.admit
            leaked = [r.uid for r in ctx._matches]
            if leaked:
                raise Violation(
                    f"request(s) {leaked} were matched (ctx.match) but neither admitted nor unmatched: a leaked "
                    "lock keeps their cached prefix locked, never evictable; ctx.unmatch(req) a refused request"
                )
            self.calls.append([r.uid for r in admitted])
            self.queues.append(_uid_list(waiting))

    Watched.__name__ = f"Watched{cls.__name__}"
    return Watched


def make_scheduler(
    policy: type[AdmissionPolicy] | str = "default",
    num_pages: int = 64,
    page_size: int = 1,
    max_running: int = 8,
    budget: int | None = 32,
    debug_checks: bool = True,
) -> Scheduler:
    """A scheduler on the model-free engine; ``policy`` is a registered name or a class."""
    name = policy if isinstance(policy, str) else f"_sim_{policy.__name__}"
    if not isinstance(policy, str):
        ADMISSION_POLICIES.register(name, policy)
    config = EngineConfig(
        device="cpu",
        dtype="float32",
        page_size=page_size,
        num_pages=num_pages,
        max_running_requests=max_running,
        max_prefill_length=budget,
        idle_prefill_length=budget,
        debug_checks=debug_checks,
        components={"admission": name},
    )
    try:
        return Scheduler(config, FakeEngine(config, num_pages))  # type: ignore[arg-type]
    finally:
        if not isinstance(policy, str):
            ADMISSION_POLICIES.unregister(name)


def context(sched: Scheduler, policy: AdmissionPolicy, tokens_left: float = math.inf) -> AdmissionContext:
    """The context the scheduler would hand ``policy`` for its next prefill batch."""
    running = list(sched.decode.running) + ([sched.prefill.chunked] if sched.prefill.chunked else [])
    return AdmissionContext(sched.cache, sched.table, policy, sched.chunking, running, tokens_left)


def request(sched: Scheduler, uid: int, prompt: list[int], max_tokens: int) -> Req:
    return sched.make_request(uid, list(prompt), SamplingParams(max_tokens=max_tokens, ignore_eos=True))


@dataclass
class Workload:
    """Requests ``(arrival step, prompt, max_tokens)`` and the engine they run on."""

    reqs: list[tuple[int, list[int], int]]
    num_pages: int = 64
    page_size: int = 1
    max_running: int = 8
    budget: int | None = 32

    def describe(self) -> str:
        shown = ", ".join(
            f"#{i}: at step {a}, {len(p)}-token prompt, max_tokens {m}" for i, (a, p, m) in enumerate(self.reqs[:12])
        )
        more = f", ... ({len(self.reqs)} requests)" if len(self.reqs) > 12 else ""
        return (
            f"KV pool of {self.num_pages} pages of {self.page_size} token(s), max {self.max_running} running, "
            f"budget {self.budget} prompt tokens per batch; requests: {shown}{more}"
        )


@dataclass
class Run:
    outputs: dict[int, list[int]] = field(default_factory=dict)
    calls: list[list[int]] = field(default_factory=list)  # admitted uids, per admit() call
    queues: list[list[int]] = field(default_factory=list)  # the waiting queue of each call
    events: list = field(default_factory=list)  # BatchEvents
    retracted: int = 0
    steps: int = 0
    finished: bool = True
    stuck: list[int] = field(default_factory=list)  # uids waiting when the step limit hit


def run(cls: type[AdmissionPolicy], w: Workload, max_steps: int | None = None) -> Run:
    """Play ``w`` on a scheduler whose admission policy is ``watched(cls)``; stops at ``max_steps``
    (default: far more than any fair policy needs) and says who was still waiting."""
    sched = make_scheduler(watched(cls), w.num_pages, w.page_size, w.max_running, w.budget)
    out = Run()
    sched.observers.append(out.events.append)
    todo = sorted(range(len(w.reqs)), key=lambda i: w.reqs[i][0])
    limit = max_steps or 50 + 4 * sum(len(p) + m for _, p, m in w.reqs)
    while todo or sched.has_work:
        while todo and w.reqs[todo[0]][0] <= out.steps:
            i = todo.pop(0)
            _, prompt, max_tokens = w.reqs[i]
            sched.add(request(sched, i, prompt, max_tokens))
        if out.steps >= limit:
            out.finished = False
            out.stuck = [r.uid for r in sched.prefill.pending]
            break
        for e in sched.step():
            out.outputs.setdefault(e.uid, []).append(e.token_id)
        out.steps += 1
        ev = out.events[-1] if out.events else None
        if ev is not None and (ev.pages_free < 0 or ev.pages_used + ev.pages_cached + ev.pages_free != w.num_pages):
            raise AssertionError(f"the KV pool's pages do not add up after batch {ev.index}: {ev}")
    policy = sched.admission
    out.calls, out.queues, out.retracted = policy.calls, policy.queues, sched.stats.retracted
    return out
