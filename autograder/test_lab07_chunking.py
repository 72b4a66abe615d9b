"""Lab 07 (chunks of equal time): ``chunk_time`` and ``fit_cost`` on fixed cases, each ``TimedChunking``
method on fixed cases (costs and times exact in binary floating point), random workloads on the real
scheduler (a model-free engine) batch by batch against the engine's ``TimedChunking``, then the real engine
running your policy on a tiny model. Run: ``python -m autograder lab07``.

Nothing here reads a clock: a batch's "time" is a cost model's (``chunk_time``), and every engine test
watches the batches through the scheduler's observer (one ``BatchEvent`` per batch: its kind, the requests
and the positions ``[start, end)`` each computed), so a busy machine cannot fail it."""

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
from minisgl.scheduler.chunking import PrefillCost
from minisgl.scheduler.timed import TimedChunking, chunk_time

INF = math.inf
COST = PrefillCost(per_token=1.0, per_pair=0.125)  # exact in binary: every time below is exact
FLAT = PrefillCost(per_token=1.0, per_pair=0.0)  # no attention cost: chunks of equal size


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


def fresh(cost: PrefillCost = COST, batch: tuple | None = None):
    """A new lab policy; ``batch``: (busy, idle, num_decoding) passed to ``budget`` first (starts the clock)."""
    policy = lab.make_policy(cost)
    if batch is not None:
        policy.budget(*batch)
    return policy


def reference(cost: PrefillCost = COST, batch: tuple | None = None) -> TimedChunking:
    policy = TimedChunking(cost)
    if batch is not None:
        policy.budget(*batch)
    return policy


def end_hint(r: Req, left: float, got, time_left: float = INF, cost: PrefillCost = COST) -> str:
    """The usual cause of a wrong ``extend_end`` answer ``got``."""
    want = reference(cost)
    want.time_left = time_left
    want = want.extend_end(r, left)
    if isinstance(got, bool) or not isinstance(got, int | float):
        return f": return a position (an int), got {type(got).__name__}"
    if got == want and not isinstance(got, int):
        return ": the right position but a float; return an int (a position indexes the token pool)"
    if got <= r.cached_len:
        return ": an empty extend (or a backward one): at least one token, cached_len + 1, even if it does not fit"
    if got == want - r.cached_len and r.cached_len:
        return (
            ": that is the length of the extend, not its end position (it starts at req.cached_len, so the end "
            "is cached_len + length)"
        )
    if r.output_ids and got == min(r.prompt_len, want):
        return (
            ": you stop at prompt_len instead of device_len: a retracted request must prefill its prompt and its "
            "outputs so far (device_len) before it decodes on"
        )
    if got == r.device_len - 1 and want == r.device_len:
        return ": one short of device_len: a request whose extend never reaches device_len never samples"
    if got > r.device_len:
        return ": past device_len: positions beyond it have no tokens yet (the end is at most req.device_len)"
    if got - r.cached_len > left:
        return f": {got - r.cached_len} tokens, but only {left:g} are left in the batch: extend_end ignores tokens_left"
    if chunk_time(cost, r.cached_len, got) > time_left and got > r.cached_len + 1:
        t = chunk_time(cost, r.cached_len, got)
        return (
            f": [{r.cached_len}, {got}) takes {t:g} under the cost model, past the {time_left:g} left on the batch's "
            "clock: a cut past the time left (count every (query, key) pair from cached_len, not from 0)"
        )
    if got == want - 1 and chunk_time(cost, r.cached_len, want) == time_left:
        return (
            f": [{r.cached_len}, {want}) takes exactly the {time_left:g} left, which is allowed (<=, not <): "
            "one token short of the time left"
        )
    if got < want:
        return ": shorter than what fits (the largest end within tokens_left, time_left and device_len)"
    return ""


def expect_ends(cases, why: str, cost: PrefillCost = COST) -> None:
    """``cases``: (request, tokens_left, batch or None); each answer must be the reference's, from a fresh
    policy (after ``budget(*batch)`` when a batch is given)."""
    for r, left, batch in cases:
        got = fresh(cost, batch).extend_end(r, left)
        ref = reference(cost, batch)
        time_left = ref.time_left
        want = ref.extend_end(r, left)
        ok = type(got) is int and got == want
        hint = "" if ok else end_hint(r, left, got, time_left, cost)
        clock = f" after budget{batch} (time_left {time_left:g})" if batch else " on a fresh policy (time_left inf)"
        assert ok, (
            f"extend_end({shown(r)}, tokens_left={left!r}){clock}, cost {cost}, returned {got!r}, expected {want} "
            f"({why})" + ("\n" + hint.removeprefix(": ") if hint else "")  # its own line: the report cuts long ones
        )


# ---- chunk_time and fit_cost ----------------------------------------------------------------------
@points(5)
def test_chunk_time_fixed_cases():
    """Per new token per_token, per (query, key) pair per_pair; the token at p attends to the p + 1 keys [0, p],
    so a chunk after a cached prefix pays for the prefix's keys; inf stays inf (never nan); an empty chunk is 0."""
    cases = [
        (COST, 0, 8, 12.5),  # 8 tokens, 36 pairs
        (COST, 0, 1, 1.125),  # one token attends to itself
        (COST, 8, 13, 11.875),  # after 8 cached: 5 tokens, 55 pairs
        (COST, 30, 31, 4.875),  # one token after 30 cached: 31 keys
        (PrefillCost(0.5, 0.25), 4, 6, 1.0 + 0.25 * 11),
        (COST, 5, 5, 0.0),
        (FLAT, 0, INF, INF),  # 0 * inf is nan: the time of an unlimited chunk is inf
        (COST, 3, INF, INF),
    ]
    for cost, start, end, want in cases:
        got = lab.chunk_time(cost, start, end)
        if got == want:
            continue
        n = end - start
        hint = "per_token * tokens + per_pair * pairs, the token at p attending to p + 1 keys"
        if isinstance(got, float) and math.isnan(got):
            hint = "nan: 0 * inf; an unlimited chunk takes inf whatever the cost"
        elif start and got == cost.per_token * n + cost.per_pair * n * (n + 1) / 2:
            hint = (
                "pairs counted from 0 instead of from start: the chunk's queries attend to the cached prefix's keys "
                "too (a chunk after a cached prefix is costlier than the first)"
            )
        elif got == cost.per_token * n + cost.per_pair * n * (start + end - 1) / 2:
            hint = "p keys instead of p + 1: the token at position p attends to itself too"
        raise AssertionError(f"chunk_time({cost}, {start}, {end}) returned {got!r}, expected {want}: {hint}")


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def expect_fit(samples, want: PrefillCost, why: str) -> None:
    try:
        got = lab.fit_cost(samples)
    except ZeroDivisionError:
        raise AssertionError(
            f"fit_cost({samples}) divided by zero ({why}): when the samples cannot tell the two coefficients apart "
            "(the determinant of the normal equations is 0), fit per_token alone"
        ) from None
    ok = isinstance(got, PrefillCost) and close(got.per_token, want.per_token) and close(got.per_pair, want.per_pair)
    hint = ""
    if isinstance(got, PrefillCost) and (got.per_token < 0 or got.per_pair < 0):
        hint = ": a negative coefficient (fit the other one alone instead: a cost is never negative)"
    assert ok, f"fit_cost({samples}) returned {got!r}, expected {want} ({why}){hint}"


@points(3)
def test_fit_cost_exact_samples():
    """Samples made by a cost model give that model back (least squares, no intercept)."""
    for cost in (COST, PrefillCost(2.0, 0.0625), PrefillCost(0.5, 0.0)):
        spans = [(0, 8), (0, 32), (16, 20), (100, 164), (7, 8)]
        expect_fit([(s, e, chunk_time(cost, s, e)) for s, e in spans], cost, "samples made by that cost model")


@points(3)
def test_fit_cost_never_negative_never_crashes():
    """A fit that would give a negative coefficient fits the other alone; samples that cannot tell the two apart
    (one sample, or every sample with the same pairs per token) fit per_token alone, without dividing by 0."""
    expect_fit([(0, 10, 20.0)], PrefillCost(2.0, 0.0), "one sample: per_token alone")
    expect_fit([(0, 10, 20.0), (0, 10, 30.0)], PrefillCost(2.5, 0.0), "the same span twice: per_token alone")
    expect_fit([(2, 6, 8.0), (1, 7, 12.0)], PrefillCost(2.0, 0.0), "the same pairs per token (s + e alike)")
    # longer-context chunks measured cheaper per token: the 2-feature fit gives per_pair < 0
    samples = [(0, 4, 8.0), (100, 104, 6.0)]
    nn, pt = 32.0, 4 * 8.0 + 4 * 6.0
    expect_fit(samples, PrefillCost(pt / nn, 0.0), "the fit's per_pair < 0: per_token alone")
    # time that grows faster than the pairs alone explain: the fit's per_token < 0, so per_pair alone
    samples = [(0, 1, 0.0), (0, 2, 3.0), (0, 3, 6.5)]
    rows = [(e - s, (e - s) * (s + e + 1) / 2, t) for s, e, t in samples]
    b = sum(p * t for _, p, t in rows) / sum(p * p for _, p, _ in rows)
    expect_fit(samples, PrefillCost(0.0, b), "the fit's per_token < 0: per_pair alone")


@points(2)
def test_fit_cost_rejects_bad_samples():
    """ValueError for no samples, and for a sample whose end <= start (each checked alone: end == start too)."""
    for samples in ([], [(0, 8, 1.0), (5, 5, 1.0)], [(9, 3, 1.0)]):
        try:
            got = lab.fit_cost(samples)
        except ValueError:
            continue
        except ZeroDivisionError:
            raise AssertionError(f"fit_cost({samples}) divided by zero: raise ValueError for it instead") from None
        raise AssertionError(
            f"fit_cost({samples}) returned {got!r}: raise ValueError for no samples or a sample with end <= start "
            "(an empty or backward extend measures nothing)"
        )


# ---- budget ---------------------------------------------------------------------------------------------
@points(4)
def test_budget_busy_while_decoding_idle_when_not():
    """The busy token budget while any request decodes (exactly one, too), the idle one while none does,
    whichever of the two is larger (a configuration may give an idle budget below the busy one)."""
    policy = lab.make_policy(COST)
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
            hint = "the smaller of the two budgets, not the one num_decoding chooses: never assume idle >= busy"
        elif got == max(busy, idle) and idle < busy:
            hint = "the larger of the two budgets, not the one num_decoding chooses: never assume idle >= busy"
        elif n == 1 and got == idle:
            hint = (
                "with exactly 1 request decoding you chose the idle budget: that one request waits for this batch "
                "too, so busy whenever num_decoding > 0, not > 1 (idle here stalls every stream)"
            )
        elif n and got == idle:
            hint = f"with {n} request(s) decoding you chose the idle budget: idle here stalls every stream"
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


@points(5)
def test_budget_starts_the_clock():
    """budget sets self.time_left: the time of a busy-token chunk from position 0 while requests decode, inf
    while none does; inf for busy = inf even when per_pair = 0; each call starts afresh."""
    for cost, batch, want in [
        (COST, (8, 64, 2), 12.5),
        (COST, (8, 64, 1), 12.5),
        (COST, (8, 64, 0), INF),
        (COST, (1, 1, 3), 1.125),
        (PrefillCost(0.5, 0.25), (4, 4, 1), 2.0 + 0.25 * 10),
        (FLAT, (INF, 64, 2), INF),
    ]:
        policy = lab.make_policy(cost)
        policy.budget(*batch)
        policy.time_left = 0.0  # as if the batch had spent its time: the next budget() starts afresh
        policy.budget(*batch)
        got = policy.time_left
        if got == want:
            continue
        busy, idle, n = batch
        if isinstance(got, float) and math.isnan(got):
            hint = "nan: per_pair * inf with per_pair = 0; an unlimited busy budget is an unlimited clock"
        elif n and got == INF:
            hint = "no clock while requests decode: each waits for this batch, so its time is the gap to bound"
        elif not n and got != INF:
            hint = "a clock while nothing decodes: nobody waits, so no time limit (needless chunks otherwise)"
        elif got == 0.0:
            hint = (
                "the clock was not started afresh: the first batch left 0 s (set here by the test) and this budget() "
                "kept it, so every batch after the first gets less time"
            )
        elif got == cost.per_token * busy:
            hint = (
                "the clock left out the attention term: a busy-token chunk from position 0 also pays per_pair for "
                "each of its (query, key) pairs"
            )
        elif got == chunk_time(cost, 0, idle):
            hint = "the clock is the idle budget's time: while requests decode it is the time of a busy-token chunk"
        else:
            hint = "while requests decode the clock is the modelled time of a busy-token chunk from position 0"
        raise AssertionError(f"after budget{batch} with cost {cost}, time_left is {got!r}, expected {want}: {hint}")


# ---- extend_end ---------------------------------------------------------------------------------------
@points(3)
def test_extend_end_whole_prompt_when_it_fits():
    """With enough tokens (and time) left, the extend runs to device_len: the request then samples."""
    cases = [(req(10), 64, None), (req(10), INF, None), (req(1), 1, None), (req(30), 30, None)]
    cases += [(req(12, cached_len=3), 9, None), (req(6), 6, (8, 8, 2)), (req(40), INF, (8, INF, 0))]
    expect_ends(cases, "the rest of the request fits: the extend ends at device_len")


@points(3)
def test_extend_end_cuts_at_the_budget():
    """A request that does not fit in the tokens left is cut exactly where they run out."""
    cases = [(req(100), 16, None), (req(100), 1, None), (req(17), 16, None), (req(40), 39, None)]
    cases += [(req(9, cached_len=2), 5, None), (req(40), 4, (8, 8, 2))]
    expect_ends(cases, "the request does not fit: cut at cached_len + tokens_left, the rest runs later")


@points(3)
def test_extend_end_from_a_cached_prefix():
    """The extend starts at cached_len (a prefix-cache hit, or the chunks before): its end counts from there."""
    cases = [
        (req(40, cached_len=16), 16, None),
        (req(40, cached_len=32), 16, None),
        (req(40, cached_len=39), 1, None),  # a full-prompt hit: only the last token is computed
        (req(50, cached_len=20), INF, None),
        (req(64, cached_len=8), 24, None),
    ]
    expect_ends(cases, "the extend is [cached_len, end)")


@points(2)
def test_extend_end_returns_an_int():
    """The end is a position, an int, even when tokens_left is a float (inf, or a budget given as 7.0)."""
    cases = [(req(20, cached_len=3), 7.0, None), (req(30), 12.5, None), (req(5), 9.0, None), (req(6), INF, None)]
    expect_ends(cases + [(req(30), 16.0, (16.0, 16.0, 1))], "an int position")


@points(3)
def test_extend_end_retracted_request():
    """A retracted request prefills its prompt and its outputs so far: up to device_len, not prompt_len."""
    cases = [
        (req(6, outputs=5), 64, None),
        (req(6, cached_len=6, outputs=10), 4, None),
        (req(6, outputs=10), 8, None),
        (req(6, cached_len=13, outputs=10), INF, None),
    ]
    expect_ends(cases, "a retracted request: device_len = prompt_len + its outputs")


@points(6)
def test_extend_end_cuts_at_the_time_left():
    """While requests decode the extend is the longest whose chunk_time fits the clock (exactly on it allowed):
    cost 1 per token and 1/8 per pair, busy 8, so 12.5 per batch. From 0: 8 tokens (12.5, exactly); after 8
    cached: 5 (11.875; 6 would take 14.625); after 16: 4; the token budget still caps it."""
    d = (8, 64, 2)
    cases = [
        (req(40), 64, d),  # [0, 8): 12.5, exactly the clock
        (req(40, cached_len=8), 64, d),  # [8, 13)
        (req(40, cached_len=16), 64, d),  # [16, 19): 9.75 (20 would take 13.25)
        (req(12, cached_len=8), 64, d),  # the rest [8, 12) fits: 4 + 42/8 = 9.25
        (req(40, cached_len=8), 3, d),  # tokens_left caps it first
        (req(40), 64, (16, 64, 1)),  # 16 + 136/8 = 33: from 0, the busy budget exactly
        (req(100, cached_len=40), 64, (16, 64, 1)),
    ]
    expect_ends(cases, "the longest extend whose time fits the clock")


@points(3)
def test_extend_end_at_least_one_token():
    """When not even one token fits in the time left (a target below one token's cost: busy 1, a request
    30 tokens in), the extend is that one token: progress, never an empty extend."""
    cases = [
        (req(40, cached_len=30), 64, (1, 64, 2)),  # one token costs 4.875, the clock holds 1.125
        (req(40, cached_len=1), 64, (1, 64, 2)),  # 1.25 > 1.125
        (req(2), 64, (1, 64, 1)),  # [0, 1): 1.125, exactly
    ]
    expect_ends(cases, "at least cached_len + 1")


@points(5)
def test_extend_end_charges_the_clock():
    """Requests of one batch share its clock: each extend's time is charged to time_left. Busy 16 (33 per batch
    under the cost): a 4-token request whole (5.25), then a long prompt gets what is left (27.75); the next
    batch, after budget(), gets the whole 33 again; a batch that spent all its time gives the next request one
    token."""
    steps = [
        ("budget", (16, 64, 2)),
        (req(4, uid=1), 64),
        (req(60, uid=2), 60),
        ("budget", (16, 64, 2)),
        (req(60, cached_len=12, uid=2), 64),
        ("budget", (8, 64, 1)),
        (req(8, uid=3), 64),  # exactly the clock: 12.5
        (req(30, uid=4), 56),  # nothing left: one token
    ]
    mine, ref = lab.make_policy(COST), TimedChunking(COST)
    history = []
    for step in steps:
        if step[0] == "budget":
            mine.budget(*step[1])
            ref.budget(*step[1])
            history.append(f"budget{step[1]}")
            continue
        r, left = step
        before = ref.time_left
        got, want = mine.extend_end(r, left), ref.extend_end(r, left)
        history.append(f"extend_end(#{r.uid} cached_len={r.cached_len}, {left}) -> {got!r} (time left {before:g})")
        if type(got) is int and got == want:
            continue
        probe = fresh(COST)
        probe.time_left = before
        if probe.extend_end(r, left) != want:
            hint = end_hint(r, left, got, before)
        elif got > want:
            hint = (
                f": a policy whose clock shows {before:g} answers {want}, so yours had more time left: charge each "
                "extend's chunk_time to self.time_left (requests of one batch share its time)"
            )
        else:
            hint = (
                f": a policy whose clock shows {before:g} answers {want}, so yours had less time left: budget() "
                "must start the clock afresh for every batch (not keep what the last batch left)"
            )
        raise AssertionError(
            f"extend_end({shown(r)}, tokens_left={left}) returned {got!r}, expected {want}; the calls on one "
            "policy:\n  " + "\n  ".join(history) + f"\n{hint.lstrip(': ')}"
        )


@points(3)
def test_extend_end_keeps_no_state():
    """One policy follows a request the way the scheduler does: two chunks, a retraction, a readmission with a
    4-token prefix hit, the rest in chunks. Every answer comes from req.cached_len, tokens_left and the clock."""
    policy = lab.make_policy(FLAT)
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
        policy.budget(8, 8, 1)
        got = policy.extend_end(q, left)
        want = reference(FLAT, (8, 8, 1)).extend_end(q, left)
        history.append(f"budget(8, 8, 1); extend_end(#{q.uid} cached_len={q.cached_len}, {left}) -> {got!r} ({what})")
        if not (type(got) is int and got == want):
            raise AssertionError(
                f"extend_end({shown(q)}, tokens_left={left!r}) returned {got!r}, expected {want} ({what}); the calls "
                "so far on one policy:\n  " + "\n  ".join(history) + "\nit kept progress of its own (where it cut a "
                "request): the scheduler owns every counter, and a retracted request starts over from req.cached_len"
            )
        q.extend_to(got)


# ---- decode_first -------------------------------------------------------------------------------------
@points(3)
def test_decode_first_only_between_chunks():
    """A decode step right after a cut prompt when something can decode; else prefill first."""
    policy = lab.make_policy(COST)
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
            hint = "no decode step between two chunks: the running streams stall for the whole prompt"
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
    cost: PrefillCost = COST

    def describe(self) -> str:
        shown = ", ".join(
            f"#{i}: at step {a}, {len(p)}-token prompt, {m} tokens" for i, (a, p, m) in enumerate(self.reqs)
        )
        return (
            f"cost {self.cost}, budgets busy={self.busy} idle={self.idle} (None: no limit), pages of {self.page_size}, "
            f"max {self.max_running} running; requests: {shown}"
        )


def random_workload(seed: int) -> Workload:
    """Prompts of 1 to 60 tokens (some sharing a prefix: cache hits start mid-prompt), arriving over 30
    steps; a busy budget of 1 to 16 tokens and an idle budget the same, larger, unlimited or smaller; a cost
    model with no, a little or much attention cost (exact in binary)."""
    rng = random.Random(seed)
    system = [rng.randrange(1, 900) for _ in range(rng.randint(4, 20))]
    reqs = []
    for i in range(rng.randint(2, 10)):
        head = system if rng.random() < 0.3 else [900 + i]
        body = [rng.randrange(1, 900) for _ in range(rng.choice([1, 3, 8, 20, 40, 59]) - 1)]
        reqs.append((rng.randint(0, 30), head + body, rng.randint(1, 12)))
    busy = rng.choice([1, 3, 8, 16])
    idle = rng.choice([busy, 4 * busy, None, max(1, busy // 4)])  # an idle budget below busy, too
    cost = PrefillCost(rng.choice([1.0, 0.5, 2.0]), rng.choice([0.0, 1 / 64, 1 / 8, 1.0]))
    return Workload(reqs, busy, idle, rng.choice([1, 1, 4]), rng.randint(2, 8), cost)


@dataclass
class SimRun:
    batches: list[tuple] = field(default_factory=list)  # (step, kind, uids, starts, ends)
    outputs: dict[int, list[int]] = field(default_factory=dict)
    steps: int = 0


def play_sim(cls: type, w: Workload) -> SimRun:
    """``w`` on the real scheduler (model-free engine, reserve-all admission: never retracts)."""
    longest = max(len(p) + m for _, p, m in w.reqs)
    num_pages = -(-2 * longest // w.page_size) + 8
    with lab.registered_policy(cls, w.cost, "_lab07_sim"):
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
    want = play_sim(TimedChunking, w)
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
            hint = ": more prompt tokens than the budget and the clock allow"
        elif g[1] == "prefill":
            hint = ": fewer prompt tokens than the budget and the clock allow"
        raise AssertionError(
            f"batch {k} differs from the reference (the engine's TimedChunking):\n  yours:     {batch_text(g)}\n"
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


@points(6, timeout=120)
def test_random_workloads():
    """Random workloads (prompt lengths, shared prefixes, arrivals, budgets, cost models, pages, rows) on the
    real scheduler with debug_checks: every batch (kind, requests, positions) equals TimedChunking's."""
    fresh(COST, (4, 4, 1)).extend_end(req(3), 4)  # a stub fails here
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
    cost: PrefillCost | None = None,
    **engine_args,
) -> EngineRun:
    """The real engine on ``model`` (float32, torch attention, ``debug_checks``) with chunking policy
    ``cls(cost)`` (None: the engine's ``TimedChunking``; cost: ``ENGINE_COST``), requests added at their
    arrival step; ``abort``: a uid aborted right after its first chunk. Afterwards, checks that every row and
    page came back."""
    from minisgl import LLM

    arrivals = arrivals or [0] * len(prompts)
    args = dict(device="cpu", dtype="float32", attention_backend="torch", debug_checks=True, **engine_args)
    name = "lab07-graded"
    with lab.registered_policy(cls or TimedChunking, cost or ENGINE_COST, name):
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
    """The lab's class, once its budget and extend_end answer (a stub fails here at once, with its hint)."""
    cls = lab.policy_class()
    policy = cls(ENGINE_COST)
    policy.budget(4, 4, 1)
    policy.extend_end(req(3), 4)
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


ENGINE_COST = PrefillCost(per_token=1.0, per_pair=1 / 16)  # a key costs 1/16 of a token: chunks shrink fast


def batch_time(e, cost: PrefillCost = ENGINE_COST) -> float:
    """A prefill batch's time under ``cost``: its extends' chunk_time (riders excluded: they decode)."""
    n = len(e.uids) - e.riders
    return sum(chunk_time(cost, s, t) for s, t in zip(e.starts[:n], e.ends[:n]))


LONG_WORKLOAD = dict(  # two long prompts arrive while short requests decode; more join mid-run
    lengths=[6, 9, 5, 70, 12, 45, 3, 20],
    max_tokens=[30, 26, 28, 4, 10, 6, 12, 8],
    arrivals=[0, 0, 1, 3, 5, 6, 9, 14],
)


@points(7, timeout=120)
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


@points(7, timeout=120)
@engine
def test_engine_keeps_the_gap(tiny_llama):
    """Every prefill batch planned while requests decode takes at most the gap (a 16-token chunk from 0 under
    ENGINE_COST: 24.5; one token more only where not even one fitted) and at most 16 tokens, at most the idle
    budget (40) while none decodes, and the batches are TimedChunking's."""
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
        if not decoding:
            continue
        gap, n = chunk_time(ENGINE_COST, 0, 16), len(e.uids) - e.riders
        t = batch_time(e)
        one_more = e.ends[n - 1] - e.starts[n - 1] == 1  # the at-least-one-token rule may pass the gap
        before = t - chunk_time(ENGINE_COST, e.starts[n - 1], e.ends[n - 1])
        assert t <= gap or (one_more and before <= gap), (
            f"prefill batch {e.index} {list(zip(e.uids, e.starts, e.ends))} (request, start, end) takes {t:g} under "
            f"{ENGINE_COST} while requests {sorted(decoding)} decoded: past the gap of {gap:g} (a cut past the time "
            "left: count each chunk's pairs from its start, and charge every extend to the batch's clock)"
        )
    want = play_engine(tiny_llama, None, prompts, w["max_tokens"], w["arrivals"], **args)
    expect_same_batches(got, want, "with your policy")


@points(5, timeout=120)
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


@points(5, timeout=120)
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


@points(4, timeout=120)
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
