"""Speculative decoding's back-off (minisgl/speculative/backoff.py): a request whose drafts keep being
rejected stops asking its drafter for a while, is asked again once the wait is over, and drafts at every step
again after an accepted draft; the tokens stay the plain engine's (float32, greedy), and no per-request
state outlives a request (finished, aborted, retracted)."""

from __future__ import annotations

import random

import pytest

from minisgl import LLM, SamplingParams
from minisgl.speculative import DRAFTERS, Drafter
from minisgl.speculative.backoff import FIRST_WAIT, Backoff

VOCAB = 49152
N_NEW = 40


def prompts() -> list[list[int]]:
    rng = random.Random(7)
    return [[rng.randrange(3, VOCAB) for _ in range(n)] for n in (9, 14, 6, 11)]


@pytest.fixture(scope="module")
def refs(tiny_llama) -> dict[tuple[int, ...], list[int]]:
    llm = LLM(str(tiny_llama), dtype="float32")
    outs = llm.generate(prompts(), SamplingParams(max_tokens=N_NEW, ignore_eos=True), use_tqdm=False)
    return {tuple(p): o.token_ids for p, o in zip(prompts(), outs)}


class Scripted(Drafter):
    """Drafts the plain continuation (``refs``) when ``right(req)`` says so, else that continuation with every
    token shifted by one (always rejected); records each call as (uid, outputs so far, drafts) and releases."""

    refs: dict[tuple[int, ...], list[int]] = {}
    right = staticmethod(lambda req: False)
    calls: list[tuple[int, int, list[int]]] = []
    released: list[int] = []

    def propose(self, req, k):
        n = len(req.output_ids)
        good = self.refs[tuple(req.input_ids)][n : n + k]
        drafts = good if self.right(req) else [(t + 1) % VOCAB for t in good]
        self.calls.append((req.uid, n, drafts))
        return drafts

    def release(self, req):
        self.released.append(req.uid)


def scripted_llm(path, refs, right, **kw) -> LLM:
    Scripted.refs, Scripted.right, Scripted.calls, Scripted.released = refs, staticmethod(right), [], []
    with DRAFTERS.registered("test-scripted", Scripted):
        return LLM(str(path), dtype="float32", debug_checks=True, speculative_algorithm="test-scripted", **kw)


def expected_calls(n_new: int, max_wait: int) -> list[int]:
    """Output counts at which an always-wrong request is asked, by the policy's definition: at every decode
    step it may draft in (the first comes after the prefill's token; none when no draft fits: the last step),
    then not for 2, 4, 8, ... (at most ``max_wait``) steps after each failure."""
    out, n, wait = [], 1, FIRST_WAIT
    while n < n_new - 1:
        out.append(n)
        n += 1 + (min(wait, max_wait) if max_wait else 0)
        wait *= 2
    return out


def test_policy_waits_double_cap_and_reset():
    b, req = Backoff(max_wait=5), object()
    assert b.should_draft(req), "a request with no failure drafts"
    waits = []
    for _ in range(4):
        b.observe(req, accepted=0)
        n = 0
        while not b.should_draft(req):
            n += 1
        waits.append(n)
    assert waits == [2, 4, 5, 5], f"waits after failures in a row: {waits} (2, doubling, capped at 5)"
    b.observe(req, accepted=0)
    b.observe(req, accepted=2)
    assert b.should_draft(req) and req not in b.state, "an accepted draft resets the streak"
    b.observe(req, accepted=0)
    assert [b.should_draft(req) for _ in range(3)] == [False, False, True], "after a reset the wait is 2 again"
    b.release(req)
    assert not b.state
    off = Backoff(max_wait=0)
    off.observe(req, accepted=0)
    assert off.should_draft(req) and not off.state, "max_wait 0: back-off off"


@pytest.mark.parametrize("max_wait", [64, 5, 0])
def test_always_wrong_drafter_stops_being_asked(tiny_llama, refs, max_wait):
    llm = scripted_llm(tiny_llama, refs, right=lambda req: False, speculative_backoff=max_wait)
    p = prompts()[0]
    out = llm.generate([p], SamplingParams(max_tokens=N_NEW, ignore_eos=True), use_tqdm=False)[0]
    assert out.token_ids == refs[tuple(p)], "back-off changed the tokens"
    asked = [n for _, n, _ in Scripted.calls]
    assert asked == expected_calls(N_NEW, max_wait), f"asked at output counts {asked}"
    st = llm.scheduler.feature("speculative").stats
    assert st.accepted_tokens == 0 and st.verify_rows == len(asked)


def test_drafter_that_becomes_right_is_asked_again(tiny_llama, refs):
    """Request A's drafts are wrong until it has 12 outputs, right after; B's are always right; C's always
    wrong; D opts out. One batch: each request's back-off is its own."""
    ps = prompts()
    uid_of = {}
    right = lambda req: uid_of[req.uid] == "B" or (uid_of[req.uid] == "A" and len(req.output_ids) >= 12)
    llm = scripted_llm(tiny_llama, refs, right=right)
    sched = llm.scheduler
    params = SamplingParams(max_tokens=N_NEW, ignore_eos=True)
    reqs = {}
    for name, p in zip("ABCD", ps):
        uid_of[len(reqs)] = name
        reqs[name] = sched.add_request(len(reqs), p, params if name != "D" else SamplingParams(
            max_tokens=N_NEW, ignore_eos=True, speculative=False))  # fmt: skip
    while sched.has_work:
        sched.step()
    for name, p in zip("ABCD", ps):
        assert reqs[name].output_ids == refs[tuple(p)], f"request {name}: tokens differ from plain decoding"
    by = {name: [(n, d) for uid, n, d in Scripted.calls if uid_of[uid] == name] for name in "ABCD"}
    assert by["D"] == [], "an opted-out request was asked"
    assert [n for n, _ in by["C"]] == expected_calls(N_NEW, 64)
    for name in "AB":
        calls = by[name]
        ok = [i for i, (n, _) in enumerate(calls) if n >= 12] if name == "A" else list(range(len(calls)))
        assert ok, f"request {name} was never asked once its drafts were right: {calls}"
        for (n, d), (n2, _) in zip([calls[i] for i in ok], [calls[i + 1] for i in ok[:-1]]):
            assert n2 == n + len(d) + 1, f"request {name}: accepted {d} at {n}, but was next asked at {n2}"
    a_first_ok = next(n for n, _ in by["A"] if n >= 12)
    assert a_first_ok in expected_calls(N_NEW, 64), "A should come back when its wait ended"
    assert not sched.feature("speculative").backoff.state, "per-request state left behind"
    assert sorted(Scripted.released) == [0, 1, 2, 3], "release once per finished request"


def test_no_state_left_after_abort(tiny_llama, refs):
    ps = prompts()
    llm = scripted_llm(tiny_llama, refs, right=lambda req: req.uid % 2 == 0)
    sched, spec = llm.scheduler, llm.scheduler.feature("speculative")
    params = SamplingParams(max_tokens=N_NEW, ignore_eos=True)
    reqs = [sched.add_request(i, p, params) for i, p in enumerate(ps)]
    victim = reqs[3]  # always-wrong drafts: backing off when aborted
    while victim not in spec.backoff.state:
        sched.step()
    assert sched.abort(victim.uid)
    assert victim not in spec.backoff.state
    assert Scripted.released == [victim.uid]
    while sched.has_work:
        sched.step()
    for r, p in zip(reqs[:3], ps):
        assert r.output_ids == refs[tuple(p)], f"request {r.uid}: tokens differ from plain decoding"
    assert victim.output_ids == refs[tuple(ps[3])][: len(victim.output_ids)]
    assert not spec.backoff.state and not spec._drafts
    assert sorted(Scripted.released) == [0, 1, 2, 3]


def test_no_state_left_after_retraction(tiny_llama, refs):
    """A pool of 72 pages makes this run retract a request (checked); odd requests back off."""
    ps = prompts()
    llm = scripted_llm(tiny_llama, refs, right=lambda req: req.uid % 2 == 0, num_pages=72)
    sched, spec = llm.scheduler, llm.scheduler.feature("speculative")
    outs = llm.generate(ps, SamplingParams(max_tokens=N_NEW, ignore_eos=True), use_tqdm=False)
    assert sched.stats.retracted > 0, "the small pool should have forced a retraction"
    assert [o.token_ids for o in outs] == [refs[tuple(p)] for p in ps], "tokens differ from plain decoding"
    twice = [u for u in set(Scripted.released) if Scripted.released.count(u) > 1]
    assert twice, f"a retracted request is released when retracted and when finished: {Scripted.released}"
    assert not spec.backoff.state and not spec._drafts
