"""Steps bounded in time (``--step-time``, ``AdaptiveChunking``): the prefill speed is measured as the
engine runs and sizes every prefill batch to the target, idle or not; short prompts arriving behind a
long one start beside its next chunk. The scheduler tests fix the measured speed (``set_pace``, as a
tensor-parallel rank applies rank 0's), so the batches they check do not depend on this machine's speed."""

from __future__ import annotations

import math

import pytest

from minisgl import LLM
from minisgl.core import SamplingParams as SP
from minisgl.scheduler.events import BatchEvent
from minisgl.scheduler.replicated import Command, ReplicatedScheduler, apply
from minisgl.scheduler.scheduler import Scheduler
from minisgl.scheduler.timed import AdaptiveChunking, chunk_time, tokens_in

TARGET_S = 0.1
SCALE = TARGET_S / 40  # seconds per cost unit: a batch of the target holds 40 units (~40 tokens from 0)


@pytest.fixture(scope="module")
def path(tiny_llama):
    return str(tiny_llama)


def paced(path, **kw) -> LLM:
    """An engine whose chunking runs at the fixed speed SCALE (its own measurements ignored)."""
    llm = LLM(path, dtype="float32", step_time=TARGET_S, num_pages=4096, **kw)
    sched = llm.scheduler
    assert isinstance(sched.chunking, AdaptiveChunking) and sched.chunking.target_s == TARGET_S
    sched.chunking.measures = False
    sched.chunking.calibrate(SCALE)
    return llm


def prefill_events(llm) -> list[BatchEvent]:
    events: list[BatchEvent] = []
    llm.scheduler.observers.append(events.append)
    return events


def test_the_offline_engine_keeps_token_budgets_and_the_server_defaults_to_auto():
    from minisgl.engine.config import CPU_PREFILL_LENGTH, CPU_STEP_TIME_S, GPU_PREFILL_LENGTH, EngineConfig
    from minisgl.server.args import parse_args

    plain = EngineConfig(device="cpu")
    assert plain.step_time is None and plain.max_prefill_length == CPU_PREFILL_LENGTH
    timed = EngineConfig(device="cpu", step_time="auto")
    assert timed.step_time == CPU_STEP_TIME_S and timed.max_prefill_length == GPU_PREFILL_LENGTH  # time bounds it
    assert EngineConfig(device="cpu", step_time=0.5, max_prefill_length=64).max_prefill_length == 64  # as given
    assert parse_args([]).engine["step_time"] == "auto"
    assert parse_args(["--step-time", "0.25"]).engine["step_time"] == 0.25
    none = parse_args(["--step-time", "none"]).engine["step_time"]
    assert EngineConfig(device="cpu", step_time=none).step_time is None
    with pytest.raises(ValueError, match="step_time"):
        EngineConfig(device="cpu", step_time=-1.0)


def test_the_scale_is_measured_from_prefill_batches_and_weighs_large_ones_more():
    policy = AdaptiveChunking(target_s=0.5)
    first = AdaptiveChunking.FIRST_TOKENS
    assert policy.budget(8192, 8192, 0) == first and math.isinf(policy.time_left)  # not measured: small first
    ev = lambda kind, s, e, secs: BatchEvent(0, kind, [1], [s], [e], 0, 0, 0, 0, 0, 0, 0, 10.0, 10.0, 10.0 + secs)  # noqa: E731
    policy.observe(ev("decode", 9, 10, 5.0))  # decode steps say nothing about prefill speed
    # the first prefill waited for what a first step waits for (8.2 s for 37 tokens, with an empty kernel cache)
    policy.observe(ev("prefill", 0, 37, 8.2))
    assert policy.seconds_per_unit is None
    small, large = chunk_time(policy.cost, 0, 10), chunk_time(policy.cost, 0, 1000)
    policy.observe(ev("prefill", 0, 10, 0.02))
    assert policy.seconds_per_unit == pytest.approx(0.02 / small)
    policy.observe(ev("prefill", 0, 1000, 1.0))
    scale = policy.seconds_per_unit
    assert scale == pytest.approx(1.02 / (small + large))
    # idle: bounded too, by as many tokens as the target's time holds from position 0 (FIRST_TOKENS at least)
    held = tokens_in(policy.cost, 0.5 / scale)
    assert policy.budget(64, 8192, 0) == max(first, held) and policy.time_left == pytest.approx(0.5 / scale)
    assert policy.budget(64, 8192, 3) == 64 and policy.time_left == pytest.approx(0.5 / scale)


@pytest.mark.parametrize("decoding", [False, True])
def test_every_prefill_batch_is_the_longest_that_fits_the_target(path, decoding):
    llm = paced(path)
    sched, events = llm.scheduler, prefill_events(llm)
    if decoding:
        for uid in range(3):
            sched.add_request(uid, [5 + uid, 6, 7], SP(max_tokens=400, ignore_eos=True))
        sched.step()
    sched.add_request(9, list(range(100, 700)), SP(max_tokens=1, ignore_eos=True))
    while 9 in sched.reqs:
        sched.step()
    chunks = [
        (e.starts[e.uids.index(9)], e.ends[e.uids.index(9)]) for e in events if e.kind == "prefill" and 9 in e.uids
    ]
    assert chunks[0][0] == 0 and chunks[-1][1] == 600 and all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))
    cost, budget = sched.chunking.cost, TARGET_S / SCALE
    for start, end in chunks[:-1]:  # each the longest that fits: one token more would not
        assert chunk_time(cost, start, end) <= budget < chunk_time(cost, start, end + 1), (start, end)
    # later chunks attend to more keys: shorter, same time
    assert chunks[0][1] - chunks[0][0] > chunks[-2][1] - chunks[-2][0]


def test_short_prompts_behind_a_long_one_start_beside_its_next_chunk(path):
    """The freeze: a long prompt on an idle engine, then short ones. Without joiners they waited for
    the whole long prefill; here each gets its first token in the next step."""
    llm = paced(path)
    sched, events = llm.scheduler, prefill_events(llm)
    sched.add_request(1, list(range(100, 900)), SP(max_tokens=1, ignore_eos=True))
    sched.step()
    assert sched.prefill.chunked is not None
    for uid in (2, 3, 4):
        sched.add_request(uid, [7 + uid, 8, 9, 10], SP(max_tokens=2, ignore_eos=True))
    firsts = {ev.uid for ev in sched.step()}
    assert {2, 3, 4} <= firsts, f"the short prompts got no token in the step after they arrived: {firsts}"
    batch = events[-1]
    assert batch.kind == "prefill" and batch.uids[-1] == 1 and set(batch.uids[:-1]) == {2, 3, 4}
    assert 1 in sched.reqs and sched.prefill.chunked is not None  # the long one goes on, chunk by chunk
    while sched.has_work:
        sched.step()
    sched.check_memory()


def test_a_prompt_too_long_to_join_waits_for_the_chunk(path):
    llm = paced(path)
    sched, events = llm.scheduler, prefill_events(llm)
    sched.add_request(1, list(range(100, 900)), SP(max_tokens=1, ignore_eos=True))
    sched.step()
    sched.add_request(2, list(range(1000, 1100)), SP(max_tokens=1, ignore_eos=True))  # more than half a step
    sched.step()
    assert events[-1].uids == [1]
    while sched.has_work:
        sched.step()
    assert 2 not in sched.reqs


def test_bounded_steps_give_the_same_greedy_tokens(path):
    prompts = [list(range(100, 700)), [5, 6, 7], list(range(40, 140))]
    sp = SP(max_tokens=6, ignore_eos=True)
    plain = LLM(path, dtype="float32").generate(prompts, sp, use_tqdm=False)
    timed = paced(path).generate(prompts, sp, use_tqdm=False)
    assert [o.token_ids for o in timed] == [o.token_ids for o in plain]


def test_an_engine_measures_its_own_speed(path):
    llm = LLM(path, dtype="float32", step_time=0.05)
    sched, events = llm.scheduler, prefill_events(llm)
    assert sched.chunking.seconds_per_unit is None
    llm.generate([list(range(100, 900))], SP(max_tokens=1, ignore_eos=True), use_tqdm=False)
    first = [e for e in events if e.kind == "prefill"][0]
    assert first.prefill_tokens == AdaptiveChunking.FIRST_TOKENS  # before any measurement: a small step
    assert sched.chunking.seconds_per_unit is not None and sched.chunking.seconds_per_unit > 0


def test_tensor_parallel_ranks_take_rank_0s_pace(path):
    """Rank 0 logs every scale it measures; a follower applies it from the log and never measures."""
    leader = ReplicatedScheduler(LLM(path, dtype="float32", step_time=TARGET_S).config)
    leader.add_request(1, list(range(100, 400)), SP(max_tokens=1, ignore_eos=True))
    leader._log.clear()
    Scheduler.step(leader)  # steps without the broadcast (no process group here); the first is not measured
    Scheduler.step(leader)
    (cmd,) = [c for c in leader._log if c.kind == "pace"]
    assert cmd.arg == leader.chunking.seconds_per_unit and cmd.arg > 0
    follower = LLM(path, dtype="float32", step_time=TARGET_S).scheduler
    follower.chunking.measures = False
    apply(follower, Command("pace", SCALE))
    follower.add_request(1, list(range(100, 400)), SP(max_tokens=1, ignore_eos=True))
    while follower.has_work:
        follower.step()
    assert follower.chunking.seconds_per_unit == SCALE  # its own steps changed nothing


@pytest.mark.parametrize("traffic", ["slow", "fast"])
def test_a_short_prompt_is_never_cut_by_the_measured_speed(path, traffic):
    """What the traffic before it left behind, the speed measured (an absurdly slow one: a first step that
    waited for a kernel compile, 8.2 s for 37 tokens; or a fast one), does not cut a prompt of at most
    FIRST_TOKENS: it is one extend, and its greedy tokens (bfloat16, where cuts change them) do not change.
    A longer prompt's cuts follow the speed."""
    short, long = list(range(300, 300 + AdaptiveChunking.FIRST_TOKENS)), list(range(500, 900))
    sp = SP(max_tokens=8, ignore_eos=True)
    llm = LLM(path, dtype="bfloat16", step_time=TARGET_S, num_pages=4096)
    events = prefill_events(llm)
    pace = {"slow": 8.2 / chunk_time(llm.scheduler.chunking.cost, 0, 37), "fast": SCALE}[traffic]
    results = []
    for scale in (SCALE, pace):
        llm.scheduler.chunking.calibrate(scale)
        llm.scheduler.flush_cache()
        events.clear()
        results.append([o.token_ids for o in llm.generate([short, long], sp, use_tqdm=False)][:1])
        extends = [(e.starts[e.uids.index(u)], e.ends[e.uids.index(u)]) for e in events for u in e.uids]
        assert extends[0] == (0, len(short)), f"the short prompt was cut: {extends}"
        llm.generate([long], sp, use_tqdm=False)  # traffic
    assert results[0] == results[1]


def test_a_step_never_waits_for_the_kernels_compile_and_says_so(monkeypatch):
    """The server and the shell wait for the C++ kernels' build before the first step, saying what they
    wait for; once built, nothing is said and nothing waits."""
    from minisgl.kernels import jit

    said, built = [], []
    monkeypatch.setattr(jit, "cpu_module", lambda: built.append(True))
    monkeypatch.setattr(jit, "_BUILT", {})
    jit.wait_built(said.append)
    assert built and said == ["compiling the CPU kernels (once per machine) ..."]
    monkeypatch.setattr(jit, "_BUILT", {jit.isa(): object()})
    jit.wait_built(said.append)
    assert len(said) == 1 and len(built) == 1


def test_the_warm_up_is_no_measure_of_speed(path):
    from minisgl.scheduler.warmup import warm_up

    llm = LLM(path, dtype="float32", step_time=TARGET_S)
    warm_up(llm.scheduler)
    assert llm.scheduler.chunking.seconds_per_unit is None
