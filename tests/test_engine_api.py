"""The offline API: outputs, finish reasons, bad input, memory accounting (property test)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minisgl import LLM, SamplingParams
from minisgl.core import RequestError


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(str(tiny_llama), dtype="float32", debug_checks=True, num_pages=512)


def test_text_and_token_prompts(llm):
    outs = llm.generate(["Hello there", [1, 2, 3]], SamplingParams(max_tokens=5, ignore_eos=True), use_tqdm=False)
    assert [len(o.token_ids) for o in outs] == [5, 5]
    assert outs[0].prompt == "Hello there" and outs[1].prompt is None
    assert outs[0].text == llm.tokenizer.decode(outs[0].token_ids, skip_special_tokens=True)
    assert all(o.finish_reason == "length" for o in outs)


def test_single_prompt_and_chat(llm):
    (out,) = llm.generate("Hello", SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert len(out.token_ids) == 3
    (chat,) = llm.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=3, ignore_eos=True))
    ids = llm.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert chat.prompt_token_ids == list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_stop_token_and_eos_finish_with_stop(llm):
    (free,) = llm.generate([[7, 8, 9]], SamplingParams(max_tokens=6, ignore_eos=True), use_tqdm=False)
    stop = free.token_ids[2]
    (out,) = llm.generate([[7, 8, 9]], SamplingParams(max_tokens=6, stop_token_ids=[stop]), use_tqdm=False)
    assert out.finish_reason == "stop"
    assert out.token_ids == free.token_ids[: free.token_ids.index(stop) + 1]
    llm.scheduler.eos_ids.add(stop)
    try:
        (eos,) = llm.generate([[7, 8, 9]], SamplingParams(max_tokens=6), use_tqdm=False)
        (ign,) = llm.generate([[7, 8, 9]], SamplingParams(max_tokens=6, ignore_eos=True), use_tqdm=False)
    finally:
        llm.scheduler.eos_ids.discard(stop)
    assert eos.finish_reason == "stop" and eos.token_ids[-1] == stop
    assert ign.token_ids == free.token_ids and ign.finish_reason == "length"


def test_output_stops_at_the_context(tiny_llama):
    """A prompt + max_tokens past the context is refused (as OpenAI does), and so is a prompt that
    fills it; max_tokens=None (left out) runs to the end of the context. The same rule and text as
    the server's."""
    llm = LLM(str(tiny_llama), dtype="float32", max_seq_len=20)
    with pytest.raises(RequestError, match="the prompt has 15 tokens and max_tokens is 6, 21 in all") as e:
        llm.generate([[1] * 15], SamplingParams(max_tokens=6), use_tqdm=False)
    assert e.value.param == "max_tokens" and e.value.code == "context_length_exceeded"
    assert "context is 20 tokens" in str(e.value)
    assert not llm.scheduler.reqs, "a refused request must queue nothing"
    (out,) = llm.generate([[1] * 15], SamplingParams(max_tokens=5, ignore_eos=True), use_tqdm=False)
    assert len(out.token_ids) == 5 and out.finish_reason == "length", "prompt + max_tokens == context fits"
    with pytest.raises(RequestError, match="context is 20 tokens") as e:
        llm.generate([[1] * 20], SamplingParams(max_tokens=1), use_tqdm=False)
    assert e.value.code == "context_length_exceeded" and e.value.param == "prompt"
    (out,) = llm.generate([[1] * 15], SamplingParams(max_tokens=None, ignore_eos=True), use_tqdm=False)
    assert len(out.token_ids) == 5 and out.finish_reason == "length", "max_tokens=None: the rest of the context"


BAD = [
    ([[]], SamplingParams(), "empty"),
    ([[1] * 1024], SamplingParams(), "context"),
    ([[1, 2]], SamplingParams(max_tokens=0), "max_tokens"),
    ([[1, 2]], SamplingParams(max_tokens=-3), "max_tokens"),
    ([[1, 2]], SamplingParams(temperature=-0.5), "temperature"),
    ([[1, 2]], SamplingParams(top_p=0.0), "top_p"),
    ([[1, 2]], SamplingParams(top_p=1.5), "top_p"),
    ([[1, 2]], SamplingParams(seed=-1), "seed"),
    ([[1, 10**9]], SamplingParams(), "token ids"),
    ([[1, 2]], [SamplingParams(), SamplingParams()], "sampling params"),
    ([[1, 2], [], [3]], SamplingParams(), "empty"),
]


@pytest.mark.parametrize("prompts,params,words", BAD, ids=[b[2] + str(i) for i, b in enumerate(BAD)])
def test_bad_input_raises_value_error_and_engine_keeps_serving(llm, prompts, params, words):
    with pytest.raises(ValueError, match=words):
        llm.generate(prompts, params, use_tqdm=False)
    assert not llm.scheduler.reqs, "a rejected batch must queue nothing"
    (ok,) = llm.generate([[4, 5]], SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    assert len(ok.token_ids) == 2


def test_request_larger_than_the_pool_is_rejected(tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float32", num_pages=8, page_size=4)
    with pytest.raises(ValueError, match="KV pool"):
        llm.generate([[1] * 20], SamplingParams(max_tokens=20), use_tqdm=False)
    (ok,) = llm.generate([[1] * 20], SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)
    assert len(ok.token_ids) == 8


def test_default_page_size_follows_the_decode_backend():
    """64-token pages where FlashInfer decodes, 1-token pages for the torch backend (the CPU path)."""
    from minisgl.engine.config import EngineConfig

    assert EngineConfig(device="cpu").page_size == 1
    assert EngineConfig(attention_backend="torch").page_size == 1
    assert EngineConfig(attention_backend="fi").page_size == 64
    assert EngineConfig(attention_backend="torch,fi").page_size == 64
    assert EngineConfig(attention_backend="fa3,torch").page_size == 1
    assert EngineConfig(attention_backend="fi", page_size=4).page_size == 4


def test_unsplit_graph_plan_sets_the_grid_to_the_batch():
    """The no-split CUDA-graph decode plan's grid (FlashInfer's ``plan_info[0]``) becomes the batch
    size, the other plan fields and the container type stay; a plan with fewer blocks is refused.
    (On the GPU: test_gpu.py::test_unsplit_decode_graphs_match_torch.)"""
    from minisgl.attention.flashinfer_backend import unsplit_graph_plan

    class Wrapper:
        _plan_info = (287, 1, 16, 99)

    w = Wrapper()
    unsplit_graph_plan(w, 256)
    assert w._plan_info == (256, 1, 16, 99)
    with pytest.raises(RuntimeError, match="planned 256 blocks for 300 requests"):
        unsplit_graph_plan(w, 300)


def test_unknown_model_and_bad_engine_args(tiny_llama):
    with pytest.raises(ValueError, match="not found"):
        LLM("/no/such/model")
    with pytest.raises(ValueError, match="config.json"):
        LLM(str(tiny_llama.parent))
    with pytest.raises(TypeError, match="unknown engine argument"):
        LLM(None, page_sise=4)
    with pytest.raises(ValueError, match="page_size"):
        LLM(None, page_size=0)
    with pytest.raises(ValueError, match="cache type"):
        LLM(str(tiny_llama), cache_type="lru")
    with pytest.raises(ValueError, match="attention backend"):
        LLM(str(tiny_llama), attention_backend="nope")


request_mix = st.lists(st.tuples(st.integers(1, 60), st.integers(1, 24), st.integers(0, 3)), min_size=1, max_size=12)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    mix=request_mix,
    page_size=st.sampled_from([1, 4, 16]),
    max_running=st.integers(1, 5),
    chunk=st.sampled_from([None, 7, 32]),
    cache=st.sampled_from(["radix", "naive"]),
)
def test_memory_accounting_property(tiny_llama, mix, page_size, max_running, chunk, cache):
    """Random request mixes on a small pool: invariants hold after every step (debug_checks), no
    request holds more than it reserved, at most max_running run at once, every request gets
    exactly its tokens, and at the end every slot is free or in the cache (then all free after
    evicting everything)."""
    llm = _cached_llm(tiny_llama, page_size, max_running, chunk, cache)
    sched = llm.scheduler
    prompts = [
        [(7 * i + j) % 97 + 3 for j in range(n)] if share == 0 else [5 + share] * n
        for i, (n, _, share) in enumerate(mix)
    ]
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for _, m, _ in mix]
    peak = 0
    orig_step = sched.step

    def step():
        nonlocal peak
        events = orig_step()
        peak = max(peak, sched.num_running)
        return events

    sched.step = step
    try:
        outs = llm.generate(prompts, params, use_tqdm=False)
    finally:
        del sched.step
    assert [len(o.token_ids) for o in outs] == [m for _, m, _ in mix]
    assert peak <= max_running
    cache_obj = sched.cache.cache
    total = sched.engine.num_pages * page_size
    assert sched.cache.allocator.num_free * page_size + cache_obj.evictable_size == total
    assert cache_obj.protected_size == 0
    sched.cache.free_slots(cache_obj.evict(cache_obj.evictable_size))
    assert sched.cache.allocator.num_free == sched.engine.num_pages
    cache_obj.check_integrity()


_LLMS: dict = {}


def _cached_llm(path, page_size, max_running, chunk, cache):
    """One engine per config (building one per hypothesis example would dominate the run time)."""
    key = (page_size, max_running, chunk, cache)
    if key not in _LLMS:
        _LLMS[key] = LLM(
            str(path),
            dtype="float32",
            page_size=page_size,
            max_running_requests=max_running,
            max_prefill_length=chunk,
            cache_type=cache,
            num_pages=96 // page_size + 8,
            debug_checks=True,
        )
    return _LLMS[key]
