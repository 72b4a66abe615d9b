"""Scheduling behaviour: chunked prefill, decode interleaving, admission, abort, prefix reuse."""

from __future__ import annotations

import pytest

from minisgl import LLM, SamplingParams
from minisgl.core import SamplingParams as SP
from minisgl.scheduler import OverlapLoop, PlainLoop


@pytest.fixture(scope="module")
def path(tiny_llama):
    return str(tiny_llama)


def record_batches(llm):
    """Wrap the engine so every batch's (phase, [(uid, start, end)]) is recorded."""
    log = []
    fwd = llm.scheduler.engine.forward_batch

    def wrapped(batch, info):
        log.append((batch.phase, [(r.uid, s, e) for r, s, e in zip(batch.reqs, batch.starts, batch.ends)]))
        return fwd(batch, info)

    llm.scheduler.engine.forward_batch = wrapped
    return log


def test_long_prompt_is_chunked_and_sampled_only_at_the_end(path):
    llm = LLM(path, dtype="float32", max_prefill_length=16)
    log = record_batches(llm)
    (out,) = llm.generate([list(range(3, 53))], SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
    prefills = [b for phase, b in log if phase == "prefill"]
    assert [(s, e) for b in prefills for _, s, e in b] == [(0, 16), (16, 32), (32, 48), (48, 50)]
    assert len(out.token_ids) == 3
    ref = LLM(path, dtype="float32", max_prefill_length=None)
    assert (
        ref.generate([list(range(3, 53))], SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)[0].token_ids
        == out.token_ids
    )


def _long_prompt_among_decodes(path, mixed: bool):
    """Four requests decode; a 97-token prompt arrives and is prefilled in chunks of 16. Returns
    the batches as (phase, [(uid, start, end)]) and every request's tokens."""
    llm = LLM(path, dtype="float32", max_prefill_length=16, mixed_chunk=mixed)
    sched = llm.scheduler
    log = record_batches(llm)
    tokens: dict[int, list[int]] = {}
    for uid in range(4):
        sched.add_request(uid, [3 + uid, 4, 5], SP(max_tokens=40, ignore_eos=True))
    for _ in range(3):
        for ev in sched.step():
            tokens.setdefault(ev.uid, []).append(ev.token_id)
    sched.add_request(99, list(range(200, 297)), SP(max_tokens=2, ignore_eos=True))
    while sched.has_work:
        for ev in sched.step():
            tokens.setdefault(ev.uid, []).append(ev.token_id)
    return log, tokens


def test_decodes_run_between_chunks(path):
    """Without mixed batches, running requests get a decode step between two chunks of a long prompt."""
    log, _ = _long_prompt_among_decodes(path, mixed=False)
    phases = [(phase, [u for u, _, _ in b]) for phase, b in log]
    chunk_steps = [i for i, (ph, uids) in enumerate(phases) if ph == "prefill" and 99 in uids]
    assert len(chunk_steps) == 7  # 97 tokens in chunks of 16
    for a, b in zip(chunk_steps, chunk_steps[1:]):
        between = phases[a + 1 : b]
        assert between and all(ph == "decode" and set(uids) == {0, 1, 2, 3} for ph, uids in between)


def test_decodes_ride_in_chunked_prefill_batches(path):
    """With mixed batches (the CPU default) every chunk of the long prompt carries one decode token of
    each running request: no batch leaves them waiting, and the tokens are those of separate steps."""
    log, tokens = _long_prompt_among_decodes(path, mixed=True)
    chunks = [rows for phase, rows in log if any(u == 99 and s < 97 for u, s, _ in rows)]  # its prompt's chunks
    assert [(s, e) for rows in chunks for u, s, e in rows if u == 99] == [
        (16 * i, min(16 * i + 16, 97)) for i in range(7)
    ]
    for rows in chunks:
        riders = {u: e - s for u, s, e in rows if u != 99}
        assert riders == {0: 1, 1: 1, 2: 1, 3: 1}, rows
    _, separate = _long_prompt_among_decodes(path, mixed=False)
    assert tokens == separate


def test_admission_respects_memory_reservation(path):
    """``reserve-all``: with room for two requests' full reservations, the third waits until one
    finishes, and no request is ever retracted."""
    llm = LLM(path, dtype="float32", num_pages=2 * 30, debug_checks=True, components={"admission": "reserve-all"})
    sched = llm.scheduler
    for uid in range(3):
        sched.add_request(uid, [3 + uid] * 10, SP(max_tokens=21, ignore_eos=True))  # needs 30 slots
    sched.step()
    assert sched.num_running == 2 and sched.num_waiting == 1
    while sched.has_work:
        sched.step()
        assert sched.num_running <= 2
    assert sched.stats.retracted == 0


LONG = SP(max_tokens=60, ignore_eos=True)


@pytest.mark.parametrize("loop", ["plain", "overlap"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_retraction_when_decodes_outgrow_their_reservation_keeps_the_tokens(path, loop, page_size):
    """A pool far too small for every request's max_tokens: the optimistic policy admits them all,
    decodes run out, the newest are retracted and later recomputed, and every request still gets
    exactly the tokens of a run with memory to spare (memory invariants checked after each step)."""
    prompts = [[3 + i] * (4 + 3 * i) for i in range(6)]
    big = LLM(path, dtype="float32", page_size=page_size, components={"loop": loop})
    want = [o.token_ids for o in big.generate(prompts, LONG, use_tqdm=False)]
    small = LLM(
        path,
        dtype="float32",
        page_size=page_size,
        num_pages=160 // page_size,
        debug_checks=True,
        components={"loop": loop},
    )
    events = []
    small.scheduler.observers.append(events.append)
    got = [o.token_ids for o in small.generate(prompts, LONG, use_tqdm=False)]
    assert got == want
    assert small.scheduler.stats.retracted > 0, "the pool was meant to run out"
    assert max(e.num_running for e in events) > 2, "reserve-all would run two at a time"
    assert [u for e in events for u in e.retracted], "observers see the retractions"
    assert not small.scheduler.has_work
    small.scheduler.check_memory()


def test_a_request_that_fits_does_not_wait_behind_one_that_does_not(path):
    """The small request behind a big one that does not fit starts at once; once AGING later
    requests have passed it, the big one is not passed any more, and it runs when memory frees."""
    from minisgl.scheduler import Optimistic

    llm = LLM(path, dtype="float32", num_pages=300, debug_checks=True, max_prefill_length=None)
    sched, events = llm.scheduler, []
    sched.observers.append(events.append)
    sched.add_request(0, [5] * 20, SP(max_tokens=200, ignore_eos=True))  # runs first, holds up to ~220 pages
    sched.step()
    sched.add_request(1, [6] * 150, SP(max_tokens=149, ignore_eos=True))  # does not fit beside it
    sched.add_request(2, [7] * 5, SP(max_tokens=4, ignore_eos=True))  # fits
    sched.step()
    assert sched.reqs[2].is_admitted and not sched.reqs[1].is_admitted, "the small one passed the big one"
    for uid in range(10, 10 + 2 * Optimistic.AGING):
        sched.add_request(uid, [8] * 5, SP(max_tokens=4, ignore_eos=True))
    while sched.has_work:
        sched.step()
    started = {}  # uid -> index of its first prefill batch
    for e in events:
        for uid in e.uids if e.kind == "prefill" else ():
            started.setdefault(uid, e.index)
    passed = sorted(u for u in started if u not in (0, 1) and started[u] < started[1])
    assert len(passed) == Optimistic.AGING, f"{len(passed)} requests passed the big one (aging: {Optimistic.AGING})"
    assert sched.stats.retracted == 0


def test_requests_without_max_tokens_do_not_cap_concurrency(tmp_path_factory):
    """A request that leaves max_tokens out may run to the end of the context (8192 here); reserving
    all of it (reserve-all) runs pool / context of them at once. The default policy reserves a share
    and runs more: here the answers end after three tokens, as chat answers end long before the
    context does."""
    from tiny_models import save_tiny_model

    model = str(save_tiny_model("llama", tmp_path_factory.mktemp("long-context"), max_position_embeddings=8192))
    prompts = [[3 + i, 4, 5] for i in range(16)]
    ref = LLM(model, dtype="float32").generate(prompts, SP(max_tokens=3, ignore_eos=True), use_tqdm=False)
    # each request's third token stops it
    params = [SP(max_tokens=None, stop_token_ids=[o.token_ids[2]]) for o in ref]
    peak = {}
    for policy in ("reserve-all", "default"):
        llm = LLM(model, dtype="float32", num_pages=16384, components={"admission": policy})
        events = []
        llm.scheduler.observers.append(events.append)
        outs = llm.generate(prompts, params, use_tqdm=False)
        assert all(o.finish_reason == "stop" and len(o.token_ids) <= 3 for o in outs)
        peak[policy] = max(e.num_running for e in events)
    assert peak["reserve-all"] == 16384 // 8191 and peak["default"] >= 2 * peak["reserve-all"], peak


def test_abort_frees_memory_at_once(path):
    llm = LLM(path, dtype="float32", max_prefill_length=8, debug_checks=True)
    sched = llm.scheduler
    total = sched.engine.num_pages
    sched.add_request(1, list(range(3, 40)), SP(max_tokens=50, ignore_eos=True))  # chunked
    sched.add_request(2, [5, 6, 7], SP(max_tokens=50, ignore_eos=True))
    sched.add_request(3, [8, 9], SP(max_tokens=50, ignore_eos=True))
    sched.step()
    assert sched.prefill.chunked is not None
    assert sched.abort(1) and sched.abort(3)  # a chunked one and a waiting one
    assert not sched.abort(1) and not sched.abort(12345)
    for _ in range(3):
        sched.step()
    assert sched.abort(2)
    assert not sched.has_work
    sched.check_memory()
    cache = sched.cache.cache
    assert sched.cache.allocator.num_free + cache.evictable_size == total


def test_full_prompt_hit_still_samples(path):
    llm = LLM(path, dtype="float32", cache_type="radix")
    p = SamplingParams(max_tokens=4, ignore_eos=True)
    (a,) = llm.generate([[3, 4, 5, 6, 7, 8]], p, use_tqdm=False)
    log = record_batches(llm)
    (b,) = llm.generate([[3, 4, 5, 6, 7, 8]], p, use_tqdm=False)
    assert a.token_ids == b.token_ids and b.cached_tokens == 5
    assert log[0] == ("prefill", [(1, 5, 6)])  # only the last prompt token is computed


def test_shared_prefix_workload_computes_fewer_prefill_tokens(path):
    prefix = list(range(3, 103))
    prompts = [prefix + [200 + i, 201 + i] for i in range(6)]
    p = SamplingParams(max_tokens=2, ignore_eos=True)
    stats = {}
    for cache in ("radix", "naive"):
        llm = LLM(path, dtype="float32", cache_type=cache, max_running_requests=1)
        outs = llm.generate(prompts, p, use_tqdm=False)
        stats[cache] = (llm.cache_stats.prefill_tokens, [o.token_ids for o in outs], llm.cache_stats.hit_rate)
    assert stats["radix"][1] == stats["naive"][1]
    assert stats["naive"][0] == 6 * 102 and stats["radix"][0] == 102 + 5 * 2
    assert stats["radix"][2] == pytest.approx(5 * 100 / (6 * 102)) and stats["naive"][2] == 0


@pytest.mark.parametrize("page_size", [1, 16])
def test_overlap_loop_gives_the_same_tokens(path, page_size):
    """The one-step-behind loop (forced on, on CPU) equals the plain loop, with EOS finishes,
    chunked prompts, prefix hits and requests joining mid-run."""
    prompts = [[3 + i % 5] * (5 + 7 * i) for i in range(10)]
    params = [
        SamplingParams(max_tokens=3 + i, ignore_eos=i % 2 == 0, temperature=0.8 * (i % 3 == 0), seed=i)
        for i in range(10)
    ]
    outs = {}
    for overlap in (False, True):
        llm = LLM(
            path,
            dtype="float32",
            components={"loop": "overlap" if overlap else "plain"},
            page_size=page_size,
            max_prefill_length=16,
            max_running_requests=4,
            debug_checks=True,
        )
        assert isinstance(llm.scheduler.loop, OverlapLoop if overlap else PlainLoop)
        # a token the model likes to emit becomes EOS, so some requests stop early
        llm.scheduler.eos_ids.add(_likely_token(llm, prompts[1]))
        outs[overlap] = [(o.token_ids, o.finish_reason) for o in llm.generate(prompts, params, use_tqdm=False)]
        outs[overlap] += [(o.token_ids, o.finish_reason) for o in llm.generate(prompts[:3], params[:3], use_tqdm=False)]
        assert not llm.scheduler.has_work
        llm.scheduler.check_memory()
    assert outs[True] == outs[False]
    assert any(r == "stop" for _, r in outs[True]) and any(r == "length" for _, r in outs[True])


def _likely_token(llm, prompt: list[int]) -> int:
    """The third greedy token of ``prompt``: made an EOS, it stops that (EOS-respecting) request early."""
    (out,) = llm.generate([prompt], SamplingParams(max_tokens=6, ignore_eos=True), use_tqdm=False)
    return out.token_ids[2]


def test_requests_sent_together_share_a_prefix_computed_in_their_batch(path):
    """All six arrive at once: the first computes the shared 100 tokens; the others wait one batch
    (instead of computing them again) and then prefill only their own two tokens."""
    prefix = list(range(3, 103))
    prompts = [prefix + [200 + i, 201 + i] for i in range(6)]
    p = SamplingParams(max_tokens=3, ignore_eos=True)
    radix = LLM(path, dtype="float32", cache_type="radix", debug_checks=True)
    log = record_batches(radix)
    outs = radix.generate(prompts, p, use_tqdm=False)
    naive = LLM(path, dtype="float32", cache_type="naive").generate(prompts, p, use_tqdm=False)
    assert [o.token_ids for o in outs] == [o.token_ids for o in naive]
    assert radix.cache_stats.prefill_tokens == 102 + 5 * 2
    assert [o.cached_tokens for o in outs] == [0] + [100] * 5
    first_prefill = next(b for phase, b in log if phase == "prefill")
    assert [u for u, _, _ in first_prefill] == [0]


def test_the_overlap_loop_waits_for_a_prefix_its_batch_in_flight_computes(path):
    """The overlap loop schedules the next batch before the last one is processed, so the first request's
    prompt is not in the prefix cache yet when the others are admitted: they wait for it (one batch
    later than the plain loop would admit them) instead of computing the shared 100 tokens again. The
    first prefill batch holds only the first request: one prompt of 102 tokens fits the batch's budget."""
    prefix = list(range(3, 103))
    prompts = [prefix + [200 + i, 201 + i] for i in range(6)]
    p = SamplingParams(max_tokens=3, ignore_eos=True)
    llm = LLM(path, dtype="float32", components={"loop": "overlap"}, max_prefill_length=110, debug_checks=True)
    outs = llm.generate(prompts, p, use_tqdm=False)
    plain = LLM(path, dtype="float32").generate(prompts, p, use_tqdm=False)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    assert [o.cached_tokens for o in outs] == [0] + [100] * 5
    assert llm.cache_stats.prefill_tokens == 102 + 5 * 2


def test_default_cpu_budget_keeps_running_streams_moving(path):
    """On a CPU a prefill batch's time is a pause of every running stream (an 8,000-token prompt
    paused them 32.6 s with one batch). By default, while requests decode, a prefill batch computes
    at most CPU_PREFILL_LENGTH prompt tokens and the decodes run between two chunks; with nothing
    decoding, nobody waits, and one batch may take a whole long prompt (throughput)."""
    from minisgl.engine.config import CPU_PREFILL_LENGTH, GPU_PREFILL_LENGTH

    llm = LLM(path, dtype="float32", num_pages=4096)
    assert llm.config.max_prefill_length == CPU_PREFILL_LENGTH
    sched, events = llm.scheduler, []
    sched.observers.append(events.append)
    long = list(range(3, 3 + 900))
    sched.add_request(0, long, SP(max_tokens=2, ignore_eos=True))  # nothing decodes yet: one batch
    while sched.has_work:
        sched.step()
    assert [e.prefill_tokens for e in events if e.kind == "prefill"] == [900] and 900 <= GPU_PREFILL_LENGTH
    assert llm.config.idle_prefill_length == GPU_PREFILL_LENGTH
    events.clear()
    for uid in range(1, 5):
        sched.add_request(uid, [5 + uid, 6, 7], SP(max_tokens=200, ignore_eos=True))
    for _ in range(3):
        sched.step()
    sched.add_request(9, list(range(1000, 1900)), SP(max_tokens=2, ignore_eos=True))
    while 9 in sched.reqs:
        sched.step()
    chunks = [e for e in events if e.kind == "prefill" and 9 in e.uids]
    assert len(chunks) == -(-900 // CPU_PREFILL_LENGTH) and all(e.prefill_tokens <= CPU_PREFILL_LENGTH for e in chunks)
    for a, b in zip(chunks, chunks[1:]):  # the streams get a token between two chunks
        between = events[a.index - events[0].index + 1 : b.index - events[0].index]
        assert any(e.kind == "decode" and {1, 2, 3, 4} <= set(e.uids) for e in between)
