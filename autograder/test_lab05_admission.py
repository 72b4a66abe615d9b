"""Lab 05 (the admission policy): fixed scheduler states against the reference policy, random
workloads on the real scheduler (a model-free engine, ``debug_checks=True``), then the real engine
running your policy. Run: ``python -m autograder lab05``.

Every ``ctx.admit`` your policy makes is watched (``autograder/scheduler_sim.py``): admitting while
``ctx.has_room`` is False, out of waiting order, or past the memory left, and a refused request left
matched, fail at once with a message naming the rule."""

from __future__ import annotations

import math
import random

from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from autograder import scheduler_sim as sim
from autograder.adapters import lab05 as lab
from autograder.checks import first_token_difference
from autograder.originality import original
from autograder.points import engine, points
from minisgl.models.config import ModelConfig

AGING = sim.Reference.AGING


def only(part: str):
    """The lab's class with every method but ``part`` (``fits`` or ``admit``) the reference's, so each
    method earns its points on its own."""
    base = lab.policy_class()
    # the references themselves, unguarded (originality.original): the grader puts them there, not the student
    methods = {"reserved_len": original(sim.Reference.reserved_len)}
    if part == "admit":
        reference_fits = original(sim.reference_fits)
        methods["fits"] = lambda self, req, ctx: reference_fits(req, ctx)
    return type(f"Only{part.title()}{base.__name__}", (base,), methods)


def state(num_pages: int = 40, running=(), cached=(), max_running: int = 8, page_size: int = 1):
    """A scheduler (reference policy) with requests ``cached`` run to the end (their tokens stay in the
    prefix cache, evictable) and then ``running`` (prompt, max_tokens) prefilled and decoding. Request
    uids count from 0 in that order; the prompts of ``running`` are shared into the cache (locked)."""
    sched = sim.make_scheduler(sim.Reference, num_pages, page_size, max_running=max_running, budget=None)
    uid = 0
    for prompt, max_tokens in cached:
        sched.add(sim.request(sched, uid, prompt, max_tokens))
        uid += 1
        while sched.has_work:
            sched.step()
    for prompt, max_tokens in running:
        sched.add(sim.request(sched, uid, prompt, max_tokens))
        uid += 1
    if running:
        sched.step()
        assert sched.num_running == len(running) and sched.num_waiting == 0
    return sched


def decide(policy_cls, build, waiting, tokens_left=math.inf, calls=1):
    """Build a state, hand ``policy_cls`` (watched) ``calls`` successive admit calls on it (each with
    the requests of ``waiting`` not admitted yet), and return the uids admitted per call."""
    sched = build()
    policy = sim.watched(policy_cls)()
    queue = [sim.request(sched, uid, prompt, m) for uid, prompt, m in waiting]
    for _ in range(calls):
        ctx = sim.context(sched, policy, tokens_left)
        policy.admit(list(queue), ctx)
        done = {x.req.uid for x in ctx.extends}
        for x in ctx.extends:  # the next call sees them admitted (holding their reservation)
            sched.decode.add(x.req)
        queue = [r for r in queue if r.uid not in done]
    return policy.calls


def expect_same_decisions(build, waiting, tokens_left=math.inf, calls=1, why=""):
    got = decide(only("admit"), build, waiting, tokens_left, calls)
    want = decide(sim.Reference, build, waiting, tokens_left, calls)
    for k, (g, w) in enumerate(zip(got, want)):
        if g != w:
            raise AssertionError(f"admit call {k + 1}: you admitted requests {g}, expected {w} ({why})")
    return got


def ids(seed: int, n: int, first: int | None = None) -> list[int]:
    rng = random.Random(seed)
    body = [rng.randrange(1, 900) for _ in range(n)]
    return body if first is None else [first, *body[1:]]


# ---- reserved_len ---------------------------------------------------------------------------------------
@points(6)
def test_reserved_len_covers_max_tokens():
    """reserved_len reserves the prompt and every token the request may generate."""
    policy = lab.make_policy()
    sched = state(200)
    for n, m in [(10, 1), (5, 20), (1, 7), (33, 64)]:
        req = sim.request(sched, 99, ids(n, n), m)
        got = policy.reserved_len(req)
        if got == req.max_device_len - 1:
            continue
        guess = (
            "it reserves only the prompt, nothing for the outputs: decodes then run out of memory and the "
            "scheduler must retract requests"
            if got in (req.device_len, req.prompt_len, req.device_len - 1)
            else "all positions it may ever feed: the prompt and max_tokens outputs, minus the last sampled token "
            "(never fed back)"
        )
        raise AssertionError(
            f"reserved_len of a request with a {n}-token prompt and max_tokens={m} returned {got}, expected "
            f"{req.max_device_len - 1} (max_device_len - 1): {guess}"
        )


# ---- fits ------------------------------------------------------------------------------------------------
def _fits(sched, uid, prompt, max_tokens):
    policy = only("fits")()
    ctx = sim.context(sched, policy)
    req = sim.request(sched, uid, prompt, max_tokens)
    before = (ctx.available_pages(), ctx.reserved_pages, ctx.pages_needed(req))
    return policy.fits(req, ctx), ctx, req, before


@points(8)
def test_fits_respects_reservations():
    """A request fits only in the pages that running requests have not reserved, counted in whole pages
    (with 4-token pages a partial last page is a page): fits exactly when it needs every page left."""
    # one running request: 10-token prompt prefilled (10 pages held), max_tokens 10: 9 more pages reserved
    build = lambda: state(40, running=[(ids(1, 10), 10)])  # noqa: E731
    for max_tokens, want in [(20, False), (15, True), (17, True), (18, False)]:
        sched = build()
        ok, ctx, req, _ = _fits(sched, 5, ids(2, 5), max_tokens)
        need, avail, reserved = ctx.pages_needed(req), ctx.available_pages(), ctx.reserved_pages
        if ok is want:
            continue
        if want:
            raise AssertionError(
                f"fits() refused a request needing {need} pages while {avail} are free or evictable and running "
                f"requests reserved {reserved} of them: {need} <= {avail} - {reserved}, so it fits"
            )
        hint = (
            f"ignoring ctx.reserved_pages over-commits: the {reserved} pages promised to running requests would "
            "be promised twice"
            if need <= avail
            else "compare ctx.pages_needed(req) with ctx.available_pages() - ctx.reserved_pages"
        )
        raise AssertionError(
            f"fits() accepted a request needing {need} pages (5-token prompt, max_tokens={max_tokens}) while "
            f"{avail} pages are free or evictable and running requests reserved {reserved} of them: {hint}"
        )
    # 4-token pages: a running request holds 2 pages and reserves 2 more, so 8 of the 12 are left
    for max_tokens, want in [(24, True), (28, False)]:
        sched = state(12, running=[(ids(72, 8), 9)], page_size=4)
        ok, ctx, req, _ = _fits(sched, 5, ids(73, 6, first=907), max_tokens)
        positions, left = req.max_device_len - 1, ctx.available_pages() - ctx.reserved_pages
        if ok is want:
            continue
        cause = (
            f"the reservation counted in tokens ({positions}) instead of pages"
            if want
            else f"the partial last page not counted ({positions} // 4 = {positions // 4} pages, rounded down)"
        )
        raise AssertionError(
            f"page_size 4: fits() returned {ok} for a request reserving {positions} positions, that is "
            f"{-(-positions // 4)} whole pages, with {left} pages left; expected {want}: {cause}. Count the "
            "reservation in whole pages, rounded up: ctx.pages_needed(req)"
        )


@points(8)
def test_fits_matches_first():
    """The memory check comes after ctx.match: the matched prefix is neither needed nor available."""
    shared = ids(3, 12)
    # a finished request left 15 tokens in the cache (evictable): the new one matches 12 of them; a running
    # request holds 4 pages and reserves 6 more
    sched = state(40, cached=[(shared, 4)], running=[(ids(6, 4, first=906), 7)])
    ok, ctx, req, (avail_before, _, _) = _fits(sched, 9, shared + ids(4, 3), 20)
    if ok:
        raise AssertionError(
            f"fits() accepted a request that needs {ctx.pages_needed(req)} pages once its 12-token cached prefix is "
            f"matched, while only {ctx.available_pages()} pages are available after the match locks that prefix "
            f"({avail_before} before): available_pages() read before ctx.match(req) counts the matched prefix twice, "
            "as available and as already held (over-commit). Read both after the match"
        )
    # a running request holds (locked) a 12-token prompt: a request sharing it needs 12 pages less
    sched = state(40, running=[(shared, 4)])
    ok, ctx, req, (_, reserved, need_unmatched) = _fits(sched, 9, shared + ids(5, 3), 20)
    if not ok:
        raise AssertionError(
            f"fits() refused a request that shares a 12-token prefix with a running request: after ctx.match(req) "
            f"it needs {ctx.pages_needed(req)} pages and {ctx.available_pages()} - {reserved} are left, so it fits "
            f"(unmatched it would need {need_unmatched}). Match first: check memory only after ctx.match(req)"
        )
    assert req in ctx._matches, (
        "fits() returned True but the request's match is gone: keep it locked for ctx.admit (do not unmatch a "
        "request that fits)"
    )


@points(6)
def test_fits_unmatches_refused():
    """A request that does not fit gives its lock back: its cached prefix stays evictable."""
    shared = ids(3, 12)
    sched = state(40, cached=[(shared, 4)], running=[(ids(6, 4, first=906), 7)])
    cache = sched.cache.cache
    sizes = (cache.evictable_size, cache.protected_size)
    ok, ctx, req, _ = _fits(sched, 9, shared + ids(4, 3), 20)
    assert not ok, "fits() accepted a request that does not fit (see test_fits_matches_first)"
    after = (cache.evictable_size, cache.protected_size)
    assert after == sizes and req not in ctx._matches, (
        f"after fits() refused a request whose 12-token prefix is cached, (evictable, protected) cache sizes are "
        f"{after}, were {sizes}: a leaked lock. A refused request must be ctx.unmatch(req)-ed, or its prefix "
        "stays locked, never evictable"
    )


# ---- admit -----------------------------------------------------------------------------------------------
@points(7)
def test_admit_respects_budget():
    """No request is admitted once the batch's token budget is spent (the last one may be cut)."""
    waiting = [(i, ids(10 + i, 10, first=900 + i), 5) for i in range(5)]
    for budget in (25, 20, 1):
        expect_same_decisions(
            lambda: state(200), waiting, tokens_left=budget, why=f"10-token prompts, a budget of {budget} tokens"
        )


@points(6)
def test_admit_respects_rows():
    """No request is admitted without a free request-table row (max_running_requests)."""
    waiting = [(i + 1, ids(20 + i, 4, first=900 + i), 3) for i in range(5)]
    build = lambda: state(200, running=[(ids(30, 4), 3)], max_running=3)  # noqa: E731
    expect_same_decisions(build, waiting, why="3 rows, 1 in use: 2 requests start")


@points(8)
def test_admit_skips_ahead():
    """A request that does not fit does not block the requests behind it that do."""
    big = (1, ids(40, 8, first=901), 40)
    small = [(i, ids(40 + i, 6, first=900 + i), 6) for i in range(2, 5)]
    build = lambda: state(60, running=[(ids(41, 6), 30)])  # noqa: E731
    got = decide(only("admit"), build, [big, *small])
    if got[0] == []:
        raise AssertionError(
            "request 1 (needs 47 pages, 25 are left) does not fit, and nothing was admitted after it although "
            "requests 2, 3 (11 pages each) fit: head-of-line blocking. Skip-ahead: pass over one that does not fit"
        )
    expect_same_decisions(build, [big, *small], why="request 1 does not fit; 2 and 3 fit behind it, 4 does not")


@points(8)
def test_admit_ages():
    """After AGING admissions past a request that does not fit, nobody passes it any more."""
    big = (1, ids(50, 8, first=901), 40)
    small = [(i, ids(50 + i, 3, first=900 + i), 2) for i in range(2, 12)]
    build = lambda: state(70, running=[(ids(51, 6), 30)])  # noqa: E731
    for calls, budget in ((1, math.inf), (3, 7)):
        got = decide(only("admit"), build, [big, *small], budget, calls)
        want = decide(sim.Reference, build, [big, *small], budget, calls)
        passed = sum(len(g) for g in got)
        if passed > AGING:
            raise AssertionError(
                f"request 1 does not fit, and {passed} requests were admitted past it in {calls} admit call(s) "
                f"{got}: skip-ahead without aging starves a big request behind a stream of small ones. After "
                f"AGING = {AGING} admissions past it (counted in self.passed_over, across calls), nobody passes it"
            )
        assert got == want, (
            f"{calls} admit call(s) with a budget of {budget} tokens admitted {got}, expected {want}: request 1 "
            f"(too big) is passed over {AGING} times, then nobody passes it"
        )
    # two requests too big: each admission past them counts once for each; the stop comes when one of them
    # has been passed AGING times (each request's own count, not their sum)
    bigs = [(1, ids(50, 8, first=901), 40), (2, ids(52, 8, first=902), 40)]
    small = [(i, ids(50 + i, 3, first=900 + i), 2) for i in range(3, 12)]
    got = decide(only("admit"), build, [*bigs, *small])
    want = decide(sim.Reference, build, [*bigs, *small])
    assert got == want, (
        f"requests 1 and 2 do not fit and requests 3.. do: you admitted {got}, expected {want}. Each admission "
        f"past them adds one to the count of each of them; stop once one of them has a count of AGING = {AGING} "
        "(a sum of the counts reaches it too soon; the count of only one of them, too late or never)"
    )


@points(6)
def test_admit_fifo():
    """Among the requests that fit, the first to arrive is the first admitted."""
    waiting = [(1, ids(60, 30, first=901), 4), (2, ids(61, 3, first=902), 4), (3, ids(62, 12, first=903), 4)]
    expect_same_decisions(lambda: state(200), waiting, why="all three fit, in arrival order")
    expect_same_decisions(lambda: state(200), waiting, tokens_left=20, why="the budget cuts the first one")


# ---- random workloads on the real scheduler -------------------------------------------------------------
def random_workload(seed: int, page_size: int = 1) -> sim.Workload:
    rng = random.Random(seed)
    systems = [[rng.randrange(1, 900) for _ in range(rng.randint(3, 10))] for _ in range(2)]
    reqs = []
    for i in range(rng.randint(4, 16)):
        prefix = rng.choice(systems) if rng.random() < 0.4 else [900 + i]
        prompt = prefix + [rng.randrange(1, 900) for _ in range(rng.randint(1, 12))]
        reqs.append((rng.randint(0, 25), prompt, rng.randint(1, 24)))
    biggest = max(len(p) + m - 1 for _, p, m in reqs)
    num_pages = -(-rng.randint(biggest, 3 * biggest) // page_size)
    return sim.Workload(reqs, num_pages, page_size, rng.randint(1, 6), rng.choice([8, 16, 32, None]))


def check_workload(w: sim.Workload) -> None:
    """Your policy on ``w``: every rule holds, and every decision is the reference's."""
    cls = lab.policy_class()
    where = f"\nworkload: {w.describe()}"
    try:
        got = sim.run(cls, w)
    except sim.Violation as e:
        raise sim.Violation(f"{e}{where}") from None
    except AssertionError as e:
        raise AssertionError(f"the scheduler's memory checks failed with your policy: {e}{where}") from None
    except Exception as e:
        raise AssertionError(f"the scheduler failed with your policy: {type(e).__name__}: {e}{where}") from None
    want = sim.run(sim.Reference, w)
    if not got.finished:
        raise AssertionError(
            f"requests {got.stuck} were still waiting after {got.steps} steps (the reference finished all in "
            f"{want.steps}): a request that never starts is starved (skip-ahead without aging?) or deadlocked{where}"
        )
    if got.retracted:
        raise AssertionError(
            f"the scheduler retracted running requests {got.retracted} times (decodes ran out of memory): the "
            f"reservation must cover every token a request may generate (reserved_len = max_device_len - 1){where}"
        )
    for ev in got.events:
        if w.budget is not None and ev.prefill_tokens > w.budget:
            raise AssertionError(
                f"prefill batch {ev.index} computed {ev.prefill_tokens} prompt tokens, over the budget of "
                f"{w.budget}: admitting past the token budget (stop when not ctx.has_room){where}"
            )
    for k, (g, r, q) in enumerate(zip(got.calls, want.calls, want.queues)):
        if g != r:
            hint = ""
            if set(g) == set(r):
                hint = ": the same requests in another order (FIFO among those that fit)"
            elif g == r[: len(g)]:
                hint = ": you stopped early (head-of-line blocking? aging counted too soon?)"
            elif r == g[: len(r)]:
                hint = ": you admitted more (aging: after AGING passes nobody passes a waiting request)"
            raise AssertionError(
                f"admit call {k + 1} (waiting queue {q}): you admitted {g}, the reference {r}{hint}{where}"
            )
    diff = first_token_difference(
        [got.outputs.get(i, []) for i in range(len(w.reqs))], [want.outputs.get(i, []) for i in range(len(w.reqs))]
    )
    assert diff is None, f"the requests' tokens differ from the reference run: {diff}{where}"


@points(15, timeout=120)
def test_random_workloads():
    """Random workloads (prompts, max_tokens, arrival steps, small KV pools of 1-, 2- and 4-token pages,
    budgets, row limits) on the real scheduler with debug_checks: no over-commit, no retraction, the
    budget and rows respected, everyone finishes, and every admission decision equals the reference
    policy's."""
    lab.make_policy().reserved_len(sim.request(sim.make_scheduler(), 0, [1, 2, 3], 4))  # a stub fails here
    check_workload(random_workload(0))
    _random_workloads()


@settings(max_examples=40, phases=[Phase.explicit, Phase.generate])
@given(seed=st.integers(0, 2**32 - 1), page_size=st.sampled_from([1, 2, 4]))
def _random_workloads(seed, page_size):
    check_workload(random_workload(seed, page_size))


# ---- the engine on your policy ----------------------------------------------------------------------------
@points(12, timeout=180)
@engine
def test_engine_runs_your_policy(tiny_llama):
    """The engine with components={"admission": "lab05"} on a small KV pool generates the reference
    tokens, admits requests in the reference's batches, never retracts and passes its memory checks."""
    from minisgl import LLM, SamplingParams

    cls = lab.policy_class()
    cls().reserved_len(sim.request(sim.make_scheduler(), 0, [1, 2, 3], 4))  # a stub fails here
    vocab = ModelConfig.from_path(tiny_llama).vocab_size
    rng = random.Random(5)
    prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in (30, 6, 40, 8, 12, 5, 25, 7)]
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for m in (40, 6, 30, 12, 4, 20, 9, 14)]

    def play(policy):
        with lab.registered_policy(policy, "lab05-graded") as name:
            args = dict(num_pages=96, max_running_requests=4, max_prefill_length=32, debug_checks=True)
            llm = LLM(
                str(tiny_llama),
                device="cpu",
                dtype="float32",
                attention_backend="torch",
                **args,
                components={"admission": name},
            )
            try:
                events = []
                llm.scheduler.observers.append(events.append)
                outs = llm.generate(prompts, params, use_tqdm=False)
                batches = [ev.uids for ev in events if ev.kind == "prefill"]
                return [o.token_ids for o in outs], batches, llm.cache_stats.retracted
            finally:
                llm.shutdown()

    try:
        got, got_batches, retracted = play(cls)
    except (NotImplementedError, AssertionError) as e:
        raise type(e)(f"the engine failed with your policy: {e}") from e
    except Exception as e:
        raise AssertionError(f"the engine failed with your policy: {type(e).__name__}: {e}") from e
    want, want_batches, _ = play(sim.Reference)
    assert retracted == 0, f"the engine retracted requests {retracted} times with your policy: reserve all max_tokens"
    assert got_batches == want_batches, (
        f"the prefill batches (request uids) with your policy were {got_batches}, with the reference {want_batches}"
    )
    diff = first_token_difference(got, want)
    assert diff is None, f"with your policy the engine generated other tokens than the reference: {diff}"
