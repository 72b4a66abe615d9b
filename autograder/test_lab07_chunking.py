"""Lab 07 (the chunking policy): each method on fixed cases, random workloads on the real scheduler (a
model-free engine) batch by batch against the engine's ``GreedyChunking``, then the real engine running
your policy on a tiny model. Run: ``python -m autograder lab07``.

Every engine test watches the batches through the scheduler's observer (one ``BatchEvent`` per batch:
its kind, the requests and the positions ``[start, end)`` each computed) and counts in batches, never in
seconds, so a busy machine cannot fail it."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from autograder import scheduler_sim as sim
from autograder.adapters import lab07 as lab
from autograder.checks import first_token_difference
from autograder.engine_runs import engine_failure
from autograder.points import engine, points
from minisgl.core import Req, SamplingParams
from minisgl.engine.config import EngineConfig
from minisgl.scheduler import Scheduler
from minisgl.scheduler.chunking import CHUNKING_POLICIES, GreedyChunking

INF = math.inf


def req(prompt_len: int, cached_len: int = 0, outputs: int = 0, uid: int = 7) -> Req:
    """A request as the scheduler hands it to ``extend_end``: admitted with ``cached_len`` positions of KV
    written (a cached prefix, or the chunks before); ``outputs`` > 0: retracted after generating that many
    tokens, so it must prefill them too (``device_len = prompt_len + outputs``)."""
    r = Req(uid, list(range(100, 100 + prompt_len)), SamplingParams(max_tokens=64), seed=0)
    if outputs:
        r.output_ids = list(range(500, 500 + outputs))
        r.retract()
    r.admit(0, cached_len, None)
    return r


def shown(r: Req) -> str:
    extra = f", {len(r.output_ids)} outputs before a retraction" if r.output_ids else ""
    return f"a request with prompt_len={r.prompt_len}{extra}, cached_len={r.cached_len}, device_len={r.device_len}"


def end_hint(r: Req, left: float, got) -> str:
    """The usual cause of a wrong ``extend_end`` answer ``got``."""
    want = int(min(r.device_len, r.cached_len + left))
    if isinstance(got, bool) or not isinstance(got, int | float):
        return f": return a position (an int), got {type(got).__name__}"
    if got == want and not isinstance(got, int):
        return ": the right position but a float; return an int (a position indexes the token pool)"
    if got == want - r.cached_len and r.cached_len:
        return (
            ": that is the length of the extend, not its end position (it starts at req.cached_len, so the end "
            "is cached_len + length)"
        )
    if r.output_ids and got == min(r.prompt_len, r.cached_len + left):
        return (
            ": you stop at prompt_len instead of device_len: a retracted request must prefill its prompt and its "
            "outputs so far (device_len) before it decodes on"
        )
    if got == r.device_len - 1 and want == r.device_len:
        return (
            ": one short of device_len: a request whose extend never reaches device_len never samples its first "
            "token (the whole request fits here)"
        )
    if got > r.device_len:
        return ": past device_len: positions beyond it have no tokens yet (the end is at most req.device_len)"
    if got == r.device_len and got > r.cached_len + left:
        return (
            f": the whole request, but only {left:g} tokens are left in the batch: extend_end ignores tokens_left "
            "(the budget)"
        )
    if got == want + 1:
        return ": one token past the budget (cached_len + tokens_left is the last end allowed)"
    if got == want - 1:
        return ": one token short of what the budget allows"
    return ""


def expect_ends(cases, why: str) -> None:
    """``cases``: (request, tokens_left); each answer must be the reference's, from a fresh policy."""
    for r, left in cases:
        got = lab.make_policy().extend_end(r, left)
        want = GreedyChunking().extend_end(r, left)
        ok = type(got) is int and got == want
        assert ok, (
            f"extend_end({shown(r)}, tokens_left={left!r}) returned {got!r}, expected {want} ({why})"
            f"{end_hint(r, left, got)}"
        )


# ---- budget ---------------------------------------------------------------------------------------------
@points(7)
def test_budget_busy_while_decoding_idle_when_not():
    """The busy budget while any request decodes (exactly one, too), the idle one while none does, whichever
    of the two is larger (a configuration may give an idle budget below the busy one)."""
    policy = lab.make_policy()
    for busy, idle, n in [
        (16, 64, 3),
        (16, 64, 0),
        (16, 64, 1),  # one decoding request is enough: num_decoding > 0, not > 1
        (128, INF, 0),
        (128, INF, 5),
        (8, 8, 0),
        (INF, INF, 2),
        (64, 16, 0),  # idle below busy: min() / max() of the two choose wrong here
        (64, 16, 1),
        (INF, 32, 0),
    ]:
        got = policy.budget(busy, idle, n)
        want = busy if n else idle
        if got == want:
            continue
        if got == min(busy, idle) and idle < busy:
            hint = (
                "that is the smaller of the two budgets, not the one num_decoding chooses: never assume "
                "idle >= busy (min/max of the two instead of choosing by num_decoding)"
            )
        elif got == max(busy, idle) and idle < busy:
            hint = (
                "that is the larger of the two budgets, not the one num_decoding chooses: never assume "
                "idle >= busy (min/max of the two instead of choosing by num_decoding)"
            )
        elif n == 1 and got == idle:
            hint = (
                "with exactly 1 request decoding you chose the idle budget: that one request waits for this batch "
                "too, so busy whenever num_decoding > 0, not > 1 (idle here stalls every stream)"
            )
        elif n and got == idle:
            hint = (
                f"with {n} request(s) decoding you chose the idle budget: idle here stalls every stream (a long "
                "prompt runs in one batch and each decoding request waits for all of it)"
            )
        elif not n and got == busy:
            hint = (
                "nothing decodes, so nobody waits for this batch: the busy budget here cuts prompts into needless "
                "chunks (slower first tokens, nothing gained); choose the idle budget"
            )
        else:
            hint = "choose by num_decoding: busy if it is > 0, else idle"
        raise AssertionError(
            f"budget(busy={busy}, idle={idle}, num_decoding={n}) returned {got!r}, expected {want}: {hint}"
        )


# ---- extend_end ---------------------------------------------------------------------------------------
@points(5)
def test_extend_end_whole_prompt_when_it_fits():
    """With enough tokens left, the extend runs to device_len: the request then samples its first token."""
    cases = [(req(10), 64), (req(10), INF), (req(1), 1), (req(30), 30), (req(12, cached_len=3), 9)]
    expect_ends(cases, "the rest of the request fits in the tokens left: the extend ends at device_len")


@points(7)
def test_extend_end_cuts_at_the_budget():
    """A request that does not fit is cut exactly where the batch's tokens run out."""
    cases = [(req(100), 16), (req(100), 1), (req(17), 16), (req(40), 39), (req(9, cached_len=2), 5)]
    expect_ends(cases, "the request does not fit: it is cut at cached_len + tokens_left, the rest runs later")


@points(7)
def test_extend_end_from_a_cached_prefix():
    """The extend starts at cached_len (a prefix-cache hit, or the chunks before): its end counts from there."""
    cases = [
        (req(40, cached_len=16), 16),  # the second chunk of a 40-token prompt
        (req(40, cached_len=32), 16),  # the last chunk
        (req(40, cached_len=39), 1),  # a full-prompt hit: only the last token is computed
        (req(50, cached_len=20), INF),
        (req(64, cached_len=8), 24),
    ]
    expect_ends(cases, "the extend is [cached_len, end)")


@points(5)
def test_extend_end_returns_an_int():
    """The end is a position, an int, even when tokens_left is a float (inf, or a budget given as 7.0)."""
    cases = [(req(20, cached_len=3), 7.0), (req(30), 12.5), (req(5), 9.0), (req(6), INF)]
    expect_ends(cases, "an int position")


@points(4)
def test_extend_end_keeps_no_state():
    """One policy follows a request the way the scheduler does: two chunks, a retraction, a readmission with a
    4-token prefix hit, the rest in chunks. Every answer comes from req.cached_len and tokens_left alone."""
    policy = lab.make_policy()
    r, other = req(20), req(10, uid=8)
    steps: list[tuple[Req, float, str]] = [
        (r, 8, "the first chunk"),
        (r, 8, "the second chunk"),
        (other, 8, "another request, cut at the budget"),
        (r, 8, "after the retraction, readmitted with a 4-token prefix hit"),
        (r, 5, "the next chunk"),
        (r, INF, "the rest"),
        (other, 8, "the other request's rest, from its own cached_len"),
    ]
    history = []
    for k, (q, left, what) in enumerate(steps):
        if k == 3:  # out of memory: the scheduler retracts r (its KV freed), then admits it again
            r.retract()
            r.admit(0, 4, None)
        got = policy.extend_end(q, left)
        want = GreedyChunking().extend_end(q, left)
        history.append(f"extend_end(#{q.uid} cached_len={q.cached_len}, {left}) -> {got!r} ({what})")
        if not (type(got) is int and got == want):
            fresh = lab.make_policy().extend_end(q, left)
            cause = (
                "a fresh policy answers this call right, so this one kept progress of its own (where it cut a "
                "request, or what it handed out): the scheduler owns every counter, and a retracted request starts "
                "over from req.cached_len. Answer from the arguments and the request's lengths only"
                if type(fresh) is int and fresh == want
                else "a fresh policy answers it wrong too" + end_hint(q, left, fresh)
            )
            raise AssertionError(
                f"extend_end({shown(q)}, tokens_left={left!r}) returned {got!r}, expected {want} ({what}); the calls "
                "so far on one policy:\n  " + "\n  ".join(history) + f"\n{cause}"
            )
        q.extend_to(got)


@points(4)
def test_extend_end_retracted_request():
    """A retracted request prefills its prompt and its outputs so far: up to device_len, not prompt_len."""
    cases = [
        (req(6, outputs=5), 64),
        (req(6, cached_len=6, outputs=10), 4),
        (req(6, outputs=10), 8),
        (req(6, cached_len=13, outputs=10), INF),
    ]
    expect_ends(cases, "a retracted request: device_len = prompt_len + its outputs")


# ---- decode_first -------------------------------------------------------------------------------------
@points(7)
def test_decode_first_only_between_chunks():
    """A decode step right after a cut prompt when something can decode; else prefill first."""
    policy = lab.make_policy()
    cases = [(after_chunk, n) for after_chunk in (True, False) for n in (0, 1, 3)]  # n exactly 0 and 1 included
    answers = {case: policy.decode_first(*case) for case in cases}
    if all(bool(got) == (not a and n > 0) for (a, n), got in answers.items()):
        raise AssertionError(
            f"decode_first answered {answers} ((after_chunk, num_decodable) -> answer): the order swapped, a decode "
            "step when no prompt was cut and a prefill right after a cut. Right after a cut prompt the running "
            "requests decode once (True), then the next chunk; otherwise prefill first (False)"
        )
    for after_chunk, n in cases:
        got = answers[after_chunk, n]
        want = after_chunk and n > 0
        if bool(got) == want:
            continue
        if want:
            hint = (
                "no decode step between two chunks: the running streams stall for the whole prompt, one chunk "
                "after another"
            )
        elif not after_chunk:
            hint = (
                "no prompt was cut: prefill first, or waiting requests starve while others decode (a decode "
                "step before every prefill lets nobody new start until the running requests finish)"
            )
        else:
            hint = "nothing can decode: the next chunk would wait a step for nothing"
        raise AssertionError(
            f"decode_first(after_chunk={after_chunk}, num_decodable={n}) returned {got!r}, expected {want}: {hint}"
        )


# ---- random workloads on the real scheduler ---------------------------------------------------------
@dataclass
class Workload:
    reqs: list[tuple[int, list[int], int]]  # (arrival step, prompt, max_tokens)
    busy: int | None
    idle: int | None
    page_size: int = 1
    max_running: int = 8

    def describe(self) -> str:
        shown = ", ".join(
            f"#{i}: at step {a}, {len(p)}-token prompt, {m} tokens" for i, (a, p, m) in enumerate(self.reqs)
        )
        return (
            f"budgets busy={self.busy} idle={self.idle} (None: no limit), pages of {self.page_size}, "
            f"max {self.max_running} running; requests: {shown}"
        )


def random_workload(seed: int) -> Workload:
    """Prompts of 1 to 60 tokens (some sharing a prefix: cache hits start mid-prompt), arriving over 30
    steps; a busy budget of 1 to 16 tokens and an idle budget the same, larger, unlimited or smaller."""
    rng = random.Random(seed)
    system = [rng.randrange(1, 900) for _ in range(rng.randint(4, 20))]
    reqs = []
    for i in range(rng.randint(2, 10)):
        head = system if rng.random() < 0.3 else [900 + i]
        body = [rng.randrange(1, 900) for _ in range(rng.choice([1, 3, 8, 20, 40, 59]) - 1)]
        reqs.append((rng.randint(0, 30), head + body, rng.randint(1, 12)))
    busy = rng.choice([1, 3, 8, 16])
    idle = rng.choice([busy, 4 * busy, None, max(1, busy // 4)])  # an idle budget below busy, too
    return Workload(reqs, busy, idle, rng.choice([1, 1, 4]), rng.randint(2, 8))


@dataclass
class SimRun:
    batches: list[tuple] = field(default_factory=list)  # (step, kind, uids, starts, ends)
    outputs: dict[int, list[int]] = field(default_factory=dict)
    steps: int = 0


def play_sim(cls: type, w: Workload) -> SimRun:
    """``w`` on the real scheduler (model-free engine, reserve-all admission: never retracts)."""
    longest = max(len(p) + m for _, p, m in w.reqs)
    num_pages = -(-2 * longest // w.page_size) + 8
    with CHUNKING_POLICIES.registered("_lab07_sim", cls):
        config = EngineConfig(
            device="cpu",
            dtype="float32",
            page_size=w.page_size,
            num_pages=num_pages,
            max_running_requests=w.max_running,
            max_prefill_length=w.busy,
            idle_prefill_length=w.idle,
            debug_checks=True,
            components={"admission": "reserve-all", "chunking": "_lab07_sim"},
        )
        sched = Scheduler(config, sim.FakeEngine(config, num_pages))  # type: ignore[arg-type]
    out = SimRun()
    sched.observers.append(lambda e: out.batches.append((out.steps, e.kind, e.uids, e.starts, e.ends)))
    todo = sorted(range(len(w.reqs)), key=lambda i: w.reqs[i][0])
    limit = 100 + 4 * sum(len(p) + m for _, p, m in w.reqs)
    while todo or sched.has_work:
        while todo and w.reqs[todo[0]][0] <= out.steps:
            i = todo.pop(0)
            sched.add(sim.request(sched, i, w.reqs[i][1], w.reqs[i][2]))
        if out.steps >= limit:
            raise AssertionError(f"requests {sorted(sched.reqs)} were not done after {limit} steps: starved?")
        for e in sched.step():
            out.outputs.setdefault(e.uid, []).append(e.token_id)
        out.steps += 1
    return out


def batch_text(b) -> str:
    step, kind, uids, starts, ends = b
    return f"step {step}: {kind} " + ", ".join(f"#{u} [{s}, {e})" for u, s, e in zip(uids, starts, ends))


def check_workload(w: Workload) -> None:
    where = f"\nworkload: {w.describe()}"
    try:
        got = play_sim(lab.policy_class(), w)
    except NotImplementedError:
        raise
    except AssertionError as e:
        raise AssertionError(f"the scheduler failed with your policy: {e}{where}") from None
    except Exception as e:
        raise AssertionError(
            f"the scheduler failed with your policy: {type(e).__name__}: {e} (an extend must end in "
            f"(cached_len, device_len]){where}"
        ) from None
    want = play_sim(GreedyChunking, w)
    for k, (g, r) in enumerate(zip(got.batches, want.batches)):
        if g == r:
            continue
        hint = ""
        if g[1] != r[1]:
            hint = (
                ": a decode step where the reference prefills (a decode step only right after a cut prompt, and "
                "only when something decodes)"
                if g[1] == "decode"
                else ": a prefill where the reference decodes (no decode step between two chunks?)"
            )
        elif g[0] != r[0]:
            hint = ": the same batch a step later (a step with no batch: a decode step when nothing can decode?)"
        elif g[1] == "prefill" and sum(g[4]) - sum(g[3]) > sum(r[4]) - sum(r[3]):
            hint = ": more prompt tokens than the budget allows"
        raise AssertionError(
            f"batch {k} differs from the reference (GreedyChunking):\n  yours:     {batch_text(g)}\n"
            f"  reference: {batch_text(r)}{hint}{where}"
        )
    assert len(got.batches) == len(want.batches), (
        f"your run has {len(got.batches)} batches, the reference {len(want.batches)}{where}"
    )
    assert got.steps == want.steps, (
        f"your run took {got.steps} steps for the reference's {want.steps} batches: steps without a batch (a decode "
        f"step chosen when nothing can decode?){where}"
    )
    diff = first_token_difference(
        [got.outputs.get(i, []) for i in range(len(w.reqs))], [want.outputs.get(i, []) for i in range(len(w.reqs))]
    )
    assert diff is None, f"the requests' tokens differ from the reference run: {diff}{where}"


@points(8, timeout=120)
def test_random_workloads():
    """Random workloads (prompt lengths, shared prefixes, arrivals, budgets, pages, rows) on the real scheduler
    with debug_checks: every batch (kind, requests, positions) equals GreedyChunking's."""
    lab.make_policy().extend_end(req(3), 4)  # a stub fails here
    check_workload(random_workload(0))
    _random_workloads()


@settings(max_examples=40, phases=[Phase.explicit, Phase.generate], deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def _random_workloads(seed):
    check_workload(random_workload(seed))


# ---- the engine on your policy --------------------------------------------------------------------------
@dataclass
class EngineRun:
    tokens: dict[int, list[int]]
    events: list  # BatchEvents
    arrivals: dict[int, int]  # uid -> the step it was added at
    prompt_lens: dict[int, int]
    retracted: int = 0
    memory: str | None = None  # what is wrong with the memory after the run (None: all given back)


def play_engine(
    model,
    cls: type | None,
    prompts: list[list[int]],
    max_tokens: list[int],
    arrivals: list[int] | None = None,
    abort: int | None = None,
    **engine_args,
) -> EngineRun:
    """The real engine on ``model`` (float32, torch attention, ``debug_checks``) with chunking policy
    ``cls`` (None: the engine's own), requests added at their arrival step; ``abort``: a uid aborted
    right after its first chunk. Afterwards, checks that every row and page came back."""
    from minisgl import LLM

    arrivals = arrivals or [0] * len(prompts)
    args = dict(device="cpu", dtype="float32", attention_backend="torch", debug_checks=True, **engine_args)
    name = "lab07-graded"
    with CHUNKING_POLICIES.registered(name, cls or GreedyChunking):
        llm = LLM(str(model), **args, components={"chunking": name})
    try:
        sched = llm.scheduler
        events: list = []
        sched.observers.append(events.append)
        tokens: dict[int, list[int]] = {}
        todo, step = sorted(range(len(prompts)), key=lambda i: arrivals[i]), 0
        while todo or sched.has_work:
            while todo and arrivals[todo[0]] <= step:
                i = todo.pop(0)
                sched.add_request(i, prompts[i], SamplingParams(max_tokens=max_tokens[i], ignore_eos=True))
            for e in sched.step():
                tokens.setdefault(e.uid, []).append(e.token_id)
            step += 1
            if abort is not None and abort in sched.reqs and any(abort in e.uids for e in events):
                sched.abort(abort)
            if step > 2000:
                raise AssertionError(f"requests {sorted(sched.reqs)} were not done after 2000 steps: starved?")
        run = EngineRun(tokens, events, dict(enumerate(arrivals)), {i: len(p) for i, p in enumerate(prompts)})
        run.retracted = sched.stats.retracted
        run.memory = leftover_memory(sched)
        return run
    finally:
        llm.shutdown()


def leftover_memory(sched) -> str | None:
    """What the engine still holds after every request is done (None: every row and page is back)."""
    rows = sched.config.max_running_requests
    if sched.table.num_free_rows != rows:
        return f"{rows - sched.table.num_free_rows} request-table row(s) still taken"
    try:
        sched.cache.check([])
    except AssertionError as e:
        return f"the KV accounting is broken: {e}"
    sched.flush_cache()
    free, total = sched.cache.allocator.num_free, sched.engine.num_pages
    return None if free == total else f"{total - free} of {total} KV pages still taken after flushing the prefix cache"


def your_class() -> type:
    """The lab's class, once its extend_end answers (a stub fails here at once, with its hint)."""
    cls = lab.policy_class()
    cls().extend_end(req(3), 4)
    return cls


def run_yours(model, *args, **kwargs) -> EngineRun:
    cls = your_class()
    with engine_failure("your chunking policy"):
        return play_engine(model, cls, *args, **kwargs)


def prompts_of(model, lengths: list[int], seed: int = 5) -> list[list[int]]:
    from minisgl.models.config import ModelConfig

    vocab = ModelConfig.from_path(model).vocab_size
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]


def decoding_sets(run: EngineRun) -> list[set[int]]:
    """For each batch of ``run``, the requests that were decoding when it was planned (no retraction)."""
    prefilled: set[int] = set()
    finished: set[int] = set()
    out = []
    for e in run.events:
        out.append(prefilled - finished)
        if e.kind == "prefill":
            prefilled |= {u for u, end in zip(e.uids, e.ends) if end == run.prompt_lens[u]}
        finished |= set(e.finished)
    return out


def expect_same_batches(got: EngineRun, want: EngineRun, what: str) -> None:
    g = [(e.kind, e.uids, e.starts, e.ends) for e in got.events]
    w = [(e.kind, e.uids, e.starts, e.ends) for e in want.events]
    for k, (a, b) in enumerate(zip(g, w)):
        assert a == b, (
            f"{what}: batch {k} was {a[0]} {list(zip(a[1], a[2], a[3]))}, the reference's {b[0]} "
            f"{list(zip(b[1], b[2], b[3]))} (request, start, end)"
        )
    assert len(g) == len(w), f"{what}: {len(g)} batches, the reference ran {len(w)}"


LONG_WORKLOAD = dict(  # two long prompts arrive while short requests decode; more join mid-run
    lengths=[6, 9, 5, 70, 12, 45, 3, 20],
    max_tokens=[30, 26, 28, 4, 10, 6, 12, 8],
    arrivals=[0, 0, 1, 3, 5, 6, 9, 14],
)


@points(8, timeout=120)
@engine
def test_engine_tokens_match_unchunked(tiny_llama):
    """The engine with components={"chunking": "lab07"} generates, token for token, what the unchunked engine
    generates (pages of 1 token with budgets 16/32, pages of 4 with a budget of 7 that cuts mid-page)."""
    your_class()
    w = LONG_WORKLOAD
    prompts = prompts_of(tiny_llama, w["lengths"])
    want = play_engine(tiny_llama, None, prompts, w["max_tokens"], w["arrivals"], max_prefill_length=None)
    for args in (dict(max_prefill_length=16, idle_prefill_length=32), dict(max_prefill_length=7, page_size=4)):
        got = run_yours(tiny_llama, prompts, w["max_tokens"], w["arrivals"], **args)
        diff = first_token_difference([got.tokens.get(i) for i in range(8)], [want.tokens.get(i) for i in range(8)])
        assert diff is None, f"with your policy ({args}) the tokens differ from the unchunked engine's: {diff}"


@points(8, timeout=120)
@engine
def test_engine_respects_the_budget(tiny_llama):
    """Every prefill batch computes at most the busy budget (16) while requests decode and the idle budget
    (40) while none does, and the batches are GreedyChunking's."""
    your_class()
    w = LONG_WORKLOAD
    prompts = prompts_of(tiny_llama, w["lengths"])
    args = dict(max_prefill_length=16, idle_prefill_length=40)
    got = run_yours(tiny_llama, prompts, w["max_tokens"], w["arrivals"], **args)
    for e, decoding in zip(got.events, decoding_sets(got)):
        if e.kind != "prefill":
            continue
        limit, which = (16, "busy") if decoding else (40, "idle")
        assert e.prefill_tokens <= limit, (
            f"prefill batch {e.index} computed {e.prefill_tokens} prompt tokens "
            f"{list(zip(e.uids, e.starts, e.ends))} (request, start, end) while "
            + (f"requests {sorted(decoding)} decoded" if decoding else "nothing decoded")
            + f": over the {which} budget of {limit}"
            + (
                " (the idle budget while requests decode: idle here stalls every stream)"
                if decoding and e.prefill_tokens <= 40
                else ""
            )
        )
    want = play_engine(tiny_llama, None, prompts, w["max_tokens"], w["arrivals"], **args)
    expect_same_batches(got, want, "with your policy")


@points(8, timeout=120)
@engine
def test_engine_starves_nobody(tiny_llama):
    """While a long prompt is prefilled in chunks, every running stream gets a token between two chunks; a
    request that arrives while others decode starts as soon as the reference lets it."""
    your_class()
    w = LONG_WORKLOAD
    prompts = prompts_of(tiny_llama, w["lengths"])
    args = dict(max_prefill_length=8, idle_prefill_length=8)
    got = run_yours(tiny_llama, prompts, w["max_tokens"], w["arrivals"], **args)
    want = play_engine(tiny_llama, None, prompts, w["max_tokens"], w["arrivals"], **args)

    def first_batch(run: EngineRun) -> dict[int, int]:
        first: dict[int, int] = {}
        for k, e in enumerate(run.events):
            for u in e.uids:
                first.setdefault(u, k)
        return first

    # the streams: between two prefill batches of a chunked prompt, a decode step of everyone decoding
    for k, (e, decoding) in enumerate(zip(got.events, decoding_sets(got))):
        nxt = got.events[k + 1] if k + 1 < len(got.events) else None
        cut = e.kind == "prefill" and any(end < got.prompt_lens[u] for u, end in zip(e.uids, e.ends))
        if cut and decoding and nxt is not None and nxt.kind == "prefill":
            waited = 1
            for later in got.events[k + 1 :]:
                if later.kind == "decode":
                    break
                waited += 1
            raise AssertionError(
                f"batch {k} cut a prompt while requests {sorted(decoding)} decoded, and batch {k + 1} was another "
                f"prefill: they got no token for {waited} batches in a row (the reference: 1). No decode step between "
                "two chunks: the running streams stall for the whole prompt"
            )
    # the waiting requests: each starts no later (in batches after its arrival) than with the reference
    g_first, w_first = first_batch(got), first_batch(want)
    for u in range(len(prompts)):
        g, r = g_first.get(u), w_first.get(u)
        assert g is not None and g <= r, (
            f"request {u} ({got.prompt_lens[u]}-token prompt, added at step {w['arrivals'][u]}) first ran in batch "
            f"{g}, with the reference in batch {r}: waiting requests starve while others decode (a decode step "
            "before every prefill lets nobody start until the running requests finish; prefill first, with one "
            "decode step only right after a cut prompt)"
        )


@points(7, timeout=120)
@engine
def test_engine_gives_memory_back(tiny_llama):
    """After the run (one long prompt aborted after its first chunk) every request-table row and KV page is
    back, the KV accounting holds after every step (debug_checks), and the others' tokens are the reference's."""
    your_class()
    w = LONG_WORKLOAD
    prompts = prompts_of(tiny_llama, w["lengths"])
    args = dict(max_prefill_length=12, idle_prefill_length=24, num_pages=512)
    got = run_yours(tiny_llama, prompts, w["max_tokens"], w["arrivals"], abort=3, **args)
    assert got.memory is None, f"after every request finished or was aborted with your policy: {got.memory}"
    want = play_engine(tiny_llama, None, prompts, w["max_tokens"], w["arrivals"], abort=3, **args)
    assert want.memory is None, want.memory
    keep = [i for i in range(len(prompts)) if i != 3]
    diff = first_token_difference([got.tokens.get(i) for i in keep], [want.tokens.get(i) for i in keep])
    assert diff is None, f"with your policy the tokens differ from the reference run: {diff}"


RETRACT_WORKLOAD = dict(  # 6 requests that outgrow a small KV pool: the engine retracts some of them
    lengths=[14, 5, 9, 3, 12, 8],
    max_tokens=[40, 44, 36, 48, 30, 40],
)


@points(5, timeout=120)
@engine
def test_engine_retracted_request_continues(tiny_llama):
    """On a KV pool too small for every answer the engine retracts requests; each prefills its prompt and its
    outputs so far when readmitted and decodes on: the tokens of a roomy pool."""
    your_class()
    w = RETRACT_WORKLOAD
    prompts = prompts_of(tiny_llama, w["lengths"], seed=6)
    roomy = play_engine(tiny_llama, None, prompts, w["max_tokens"], max_prefill_length=None)
    args = dict(max_prefill_length=64, num_pages=150, max_running_requests=6)
    want = play_engine(tiny_llama, None, prompts, w["max_tokens"], **args)
    assert want.retracted > 0, "the workload no longer makes the engine retract: fix the test"
    got = run_yours(tiny_llama, prompts, w["max_tokens"], **args)
    diff = first_token_difference([got.tokens.get(i) for i in range(6)], [roomy.tokens.get(i) for i in range(6)])
    assert diff is None, f"with your policy and {got.retracted} retraction(s) the tokens differ: {diff}"
    expect_same_batches(got, want, "with retracted requests")
