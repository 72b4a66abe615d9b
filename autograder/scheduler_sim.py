"""The real scheduler on a model-free engine, for lab 05 (admission policies) and lab 07 (chunking).

Everything but the model is the engine's own: ``Scheduler``, its prefill and decode managers, the
KV page allocator, the radix prefix cache, the request table and ``debug_checks`` after every step.
The model is replaced by a function of each request's last token and position, so a batch costs
microseconds and a request's tokens never depend on what it is batched with: hundreds of random
workloads run in seconds.

Lab 05's contract is checked as it happens, not by comparing with one reference's decisions:
``watched(cls)`` is the policy under test with every ``ctx.admit`` watched. The grader keeps its own
count of how often each waiting request was *passed* (a request that arrived after it was admitted
while it waited) and its own read-only view of each request's cached prefix and whether it could
start now (``Probe``), and raises ``Violation`` at the first broken rule, naming it: admitting
without room, a request that waits for this batch's prefix, over-committed memory, out of rank
(aged first, then longest cached prefix), a lock left behind, or a call that stops while a request
could still start. ``Reference`` is the grader's own policy (its hit rate is the bar of the
shared-prefix workload).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from minisgl.core import Req, SamplingParams
from minisgl.engine.config import EngineConfig
from minisgl.kvcache import REQ_TABLES
from minisgl.kvcache.radix import common_prefix_len
from minisgl.scheduler import Scheduler
from minisgl.scheduler.admission import ADMISSION_POLICIES, AdmissionContext, AdmissionPolicy

VOCAB = 1000
AGING = 4  # lab 05's: a request passed this many times is aged


class Reference(AdmissionPolicy):
    """Lab 05's contract, the grader's way: at each step the best-ranked request that can start
    (aged first, oldest first; then the longest cached prefix, oldest first), until none can or an
    aged one cannot; every admission passes the older requests still waiting."""

    AGING = AGING

    def __init__(self):
        self.passes: dict[int, int] = {}

    def reserved_len(self, req: Req) -> int:
        return req.max_device_len - 1

    @staticmethod
    def _starts(r: Req, ctx: AdmissionContext) -> bool:
        """The contract's "can start": it does not wait for the batch's prefix and, its cached prefix
        locked, needs no more pages than are left unpromised. Leaves it locked exactly when True."""
        if ctx.waits_for_batch_prefix(r):
            return False
        ctx.match(r)
        left = ctx.available_pages() - ctx.reserved_pages
        fits = left >= ctx.pages_needed(r)
        if not fits:
            ctx.unmatch(r)
        return fits

    def admit(self, waiting, ctx: AdmissionContext) -> None:
        order = list(waiting)
        self.passes = {r.uid: self.passes.get(r.uid, 0) for r in order}
        prefix = {}
        for r in order:
            prefix[r.uid] = ctx.match(r)
            ctx.unmatch(r)
        out: set[int] = set()  # cannot start in this call (monotone: memory only shrinks, prefixes only join)
        while ctx.has_room:
            ranked = sorted(
                (r for r in order if r.uid not in out),
                key=lambda r: (0, 0) if self.passes[r.uid] >= self.AGING else (1, -prefix[r.uid]),
            )  # sorted() is stable: oldest first within a rank
            pick = None
            for r in ranked:
                if self._starts(r, ctx):
                    pick = r
                    break
                if self.passes[r.uid] >= self.AGING:
                    return  # an aged request cannot start: the call ends
                out.add(r.uid)
            if pick is None:
                return
            ctx.admit(pick)
            i = order.index(pick)
            del order[i]
            del self.passes[pick.uid]
            for r in order[:i]:
                self.passes[r.uid] += 1


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


# ---- the grader's read-only view of a context --------------------------------------------------------
class Probe:
    """What a request would see in ``ctx`` now, computed without touching the cache (no lock, no LRU
    stamp, no split): its cached prefix, the pages it needs, whether it fits with its own prefix
    locked and every other lock the policy holds dropped, whether it waits for this batch's prefix."""

    def __init__(self, ctx: AdmissionContext):
        self.ctx = ctx
        self.cache = ctx._cache.cache  # the engine's RadixPrefixCache
        self.page = ctx.page_size

    def _path(self, ids: list[int]) -> tuple[int, int]:
        """(matched length, matched tokens in nodes no lock holds) of ``ids`` in the tree."""
        cache, p = self.cache, self.page
        if not getattr(cache, "shares_prefixes", False) or not hasattr(cache, "root"):
            return 0, 0
        end = len(ids) - len(ids) % p
        node, pos, free = cache.root, 0, 0
        while pos < end:
            child = node.children.get(tuple(ids[pos : pos + p]))
            if child is None:
                break
            n = common_prefix_len(child.key, ids[pos:end])
            n -= n % p
            if child.ref == 0:
                free += n
            pos += n
            if n < len(child.key):
                break
            node = child
        return pos, free

    def cached(self, req: Req) -> int:
        """The length ``ctx.match(req)`` would return."""
        return self._path(req.fill_ids[: req.match_limit])[0]

    def waits(self, req: Req) -> bool:
        """``ctx.waits_for_batch_prefix(req)``, without touching the cache."""
        ctx = self.ctx
        if not ctx._cache.shares_prefixes or not ctx.extends:
            return False
        fill = req.fill_ids
        matchable = fill[: len(fill) - 1]
        shared = max(common_prefix_len(x.req.fill_ids, matchable) for x in ctx.extends)
        return shared - shared % self.page > self._path(matchable)[0]

    def need_and_left(self, req: Req) -> tuple[int, int]:
        """(pages ``req`` needs with its prefix locked, pages left for it then): it fits when need <= left.
        Locks the policy holds on other requests (matched, not yet admitted) are not counted."""
        ctx, cache = self.ctx, self.ctx._cache
        held = [m.handle for r, m in ctx._matches.items() if r is not req]
        for h in held:
            cache.unlock(h)
        try:
            length, unlocked = self._path(req.fill_ids[: req.match_limit])
            if req in ctx._matches:  # its own lock is already taken
                length, unlocked = ctx._matches[req].length, 0
            evictable = cache.cache.evictable_size - unlocked
            left = cache.allocator.num_free + evictable // self.page - ctx.reserved_pages
            return ctx._reservation(req, length), left
        finally:
            for h in held:
                cache.lock(h)

    def fits(self, req: Req) -> bool:
        need, left = self.need_and_left(req)
        return need <= left


# ---- the watcher ------------------------------------------------------------------------------------
def _uids(reqs) -> list[int]:
    return [r.uid for r in reqs]


@dataclass
class Record:
    """What the watcher saw of one ``admit`` call."""

    queue: list[int]  # the waiting queue, oldest first
    admitted: list[int]  # in the order admitted
    cached: dict[int, int]  # uid -> cached prefix at the start of the call
    passes: dict[int, int]  # uid -> the grader's count of passes at the end of the call


def watched(cls: type[AdmissionPolicy], aging: int = AGING) -> type[AdmissionPolicy]:
    """``cls`` with every ``admit`` call checked against lab 05's contract (``Violation`` at the first
    broken rule) and recorded in ``self.ag_records`` (``Record``); ``self.ag_passes`` is the grader's count
    (the policy keeps its own, under any name but these)."""

    class Watched(cls):  # type: ignore[valid-type, misc]
        def __init__(self):
            super().__init__()
            self.ag_records: list[Record] = []
            self.ag_passes: dict[int, int] = {}
            self.ag_max_passes = 0

        def admit(self, waiting, ctx: AdmissionContext) -> None:
            watch_call(self, super().admit, list(waiting), ctx, aging)

    Watched.__name__ = f"Watched{cls.__name__}"
    return Watched


def watch_call(policy, admit, waiting: list[Req], ctx: AdmissionContext, aging: int) -> None:
    """Run ``admit(waiting, ctx)`` with each ``ctx.admit`` checked; ``policy.ag_passes`` holds the grader's
    counts of passes (uid -> passes, for the requests still waiting)."""
    probe = Probe(ctx)
    index = {id(r): i for i, r in enumerate(waiting)}
    grader = dict(policy.ag_passes)
    for r in waiting:
        grader.setdefault(r.uid, 0)
    cached = {r.uid: probe.cached(r) for r in waiting}
    admitted: list[Req] = []
    real_admit = ctx.admit

    def aged(r: Req) -> bool:
        return grader[r.uid] >= aging

    def rank(r: Req) -> tuple:
        return (0, index[id(r)]) if aged(r) else (1, -cached[r.uid])

    def describe(r: Req) -> str:
        return f"request {r.uid} (cached prefix {cached[r.uid]} tokens, passed {grader[r.uid]} times)"

    def check_admit(req: Req) -> None:
        if id(req) not in index:
            raise Violation(f"request {req.uid} was admitted but is not in the waiting queue {_uids(waiting)}")
        if any(r is req for r in admitted):
            raise Violation(f"request {req.uid} was admitted twice in one call")
        why = None
        if ctx.tokens_left <= 0:
            why = "the batch's token budget is spent (ctx.tokens_left <= 0): admitting past the token budget"
        elif ctx.rows_left <= 0:
            why = "no request-table row is left (ctx.rows_left == 0): admitting with no row left"
        elif ctx.cut is not None:
            why = "a prompt was cut in this batch (ctx.cut), which ends the batch"
        if why:
            raise Violation(f"room: request {req.uid} was admitted while ctx.has_room was False: {why}")
        if probe.waits(req):
            raise Violation(
                f"batch prefix: request {req.uid} was admitted although it shares a longer prefix with a prompt of "
                "this batch than the cache holds (ctx.waits_for_batch_prefix)\n"
                "it must wait one batch, then it reuses that prefix instead of computing it a second time"
            )
        others = [r for r in waiting if r is not req and not any(a is r for a in admitted)]
        for r in sorted(others, key=rank):
            if rank(r) >= rank(req):
                break
            if aged(r):
                if probe.fits(r) and not probe.waits(r):
                    raise Violation(
                        f"aging: {describe(req)} was admitted while {describe(r)} could start: after AGING = {aging} "
                        "passes nobody passes it (an aged request ranks first, oldest first)\n"
                        "a request is passed each time a request that arrived after it is admitted, whatever keeps it "
                        "waiting: no room, not fitting, a batch prefix, its rank"
                    )
                raise Violation(
                    f"aging: {describe(req)} was admitted while {describe(r)} cannot start, which ends the call: the "
                    "memory that frees up is its (an aged request that cannot start is not skipped)\n"
                    "a request is passed each time a request that arrived after it is admitted, whatever keeps it "
                    f"waiting: no room, not fitting, a batch prefix, its rank; after AGING = {aging} passes it is aged"
                )
            if probe.fits(r) and not probe.waits(r):
                early = ""
                if cached[req.uid] < cached[r.uid]:
                    early = (
                        f"\nif you took request {req.uid} for aged: it was passed {grader[req.uid]} times, and only "
                        "requests that arrived after it pass it"
                    )
                raise Violation(
                    f"longest cached prefix first: {describe(req)} was admitted while {describe(r)} could start\n"
                    "requests that are not aged start longest cached prefix first (the length ctx.match returns; ties "
                    f"in any order){early}"
                )
        real_admit(req)
        admitted.append(req)
        if ctx.reserved_pages > ctx.available_pages():
            raise Violation(
                f"memory: admitting request {req.uid} over-commits the KV pool: the admitted requests now hold "
                f"{ctx.reserved_pages} reserved pages but only {ctx.available_pages()} are free or evictable\n"
                "a request starts only if, with its cached prefix locked, the pages it needs are among those left "
                "after what is promised to admitted requests\n"
                "memory promised twice (reservations ignored?), a matched prefix counted as free (pages left read "
                "before ctx.match?), or a partial last page not counted?"
            )
        for r in waiting[: index[id(req)]]:
            if not any(a is r for a in admitted):
                grader[r.uid] += 1
                policy.ag_max_passes = max(policy.ag_max_passes, grader[r.uid])

    ctx.admit = check_admit  # type: ignore[method-assign]
    try:
        admit(waiting, ctx)
    finally:
        del ctx.admit
    leaked = [r.uid for r in ctx._matches]
    if leaked:
        raise Violation(
            f"locks: request(s) {leaked} were matched (ctx.match) but neither admitted nor unmatched when admit "
            "returned\na leaked lock keeps their cached prefix locked, never evictable: a refused request leaves no "
            "lock behind"
        )
    if ctx.has_room:
        rest = [r for r in waiting if not any(a is r for a in admitted)]
        blocked = [r for r in rest if aged(r) and not (probe.fits(r) and not probe.waits(r))]
        first_blocked = min(map(rank, blocked)) if blocked else None
        for r in sorted(rest, key=rank):
            if first_blocked is not None and first_blocked <= rank(r):
                break
            if probe.waits(r):
                continue
            need, left = probe.need_and_left(r)
            if need <= left:
                raise Violation(
                    f"skip-ahead: admit returned with room left (ctx.has_room) while {describe(r)} could start: it "
                    f"needs {need} pages with its cached prefix locked, and {left} are left\n"
                    "only an aged request that cannot start ends a call early; any other that cannot start is skipped\n"
                    "head-of-line blocking? or a request refused although it fits: memory checked before ctx.match, "
                    "in tokens instead of whole pages, `<` where a request that needs exactly the pages left fits, or "
                    "with other requests' prefixes still locked?"
                )
    for r in admitted:
        grader.pop(r.uid, None)
    policy.ag_passes = grader
    policy.ag_records.append(Record(_uids(waiting), _uids(admitted), cached, dict(grader)))


# ---- schedulers, requests, workloads ------------------------------------------------------------------
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


def context(
    sched: Scheduler, policy: AdmissionPolicy, tokens_left: float = math.inf, chunked: Req | None = None
) -> AdmissionContext:
    """The context the scheduler would hand ``policy`` for its next prefill batch (``chunked``: a cut
    prompt that continues first in it)."""
    running = list(sched.decode.running) + ([chunked] if chunked else [])
    ctx = AdmissionContext(sched.cache, sched.table, policy, sched.chunking, running, tokens_left)
    if chunked is not None:
        ctx.add_extend(chunked)
    return ctx


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
    records: list[Record] = field(default_factory=list)  # one per admit() call (watched policies)
    events: list = field(default_factory=list)  # BatchEvents
    retracted: int = 0
    steps: int = 0
    finished: bool = True
    stuck: list[int] = field(default_factory=list)  # uids waiting when the step limit hit
    hit_rate: float = 0.0  # prompt tokens served from the prefix cache / prompt tokens admitted
    prefill_tokens: int = 0  # prompt tokens computed
    max_passes: int = 0  # the grader's count: the most times one request was passed

    @property
    def calls(self) -> list[list[int]]:
        return [r.admitted for r in self.records]


def run(cls: type[AdmissionPolicy], w: Workload, max_steps: int | None = None, watch: bool = False) -> Run:
    """Play ``w`` on a scheduler whose admission policy is ``cls`` (``watched(cls)`` with ``watch``: lab 05's
    rules checked at every call); stops at ``max_steps`` (default: far more than any fair policy needs) and
    says who was still waiting."""
    sched = make_scheduler(watched(cls) if watch else cls, w.num_pages, w.page_size, w.max_running, w.budget)
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
    out.records = getattr(policy, "ag_records", [])
    out.max_passes = getattr(policy, "ag_max_passes", 0)
    out.retracted, out.hit_rate = sched.stats.retracted, sched.stats.hit_rate
    out.prefill_tokens = sched.stats.prefill_tokens
    return out
