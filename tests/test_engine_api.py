"""The offline API: outputs, finish reasons, bad input, memory accounting (property test)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
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


# ---- vLLM's conventions: RequestOutput.outputs, n, stop strings, min_tokens, penalties, logprobs counts ----
def test_vllm_style_script_runs_unchanged(llm):
    outs = llm.generate(
        ["Hello, my name is", "The capital of France is"],
        SamplingParams(n=2, temperature=0.8, stop=["\n"], max_tokens=16, seed=5),
        use_tqdm=False,
    )
    assert [o.prompt for o in outs] == ["Hello, my name is", "The capital of France is"]
    for o in outs:
        assert [c.index for c in o.outputs] == [0, 1] and o.finished
        assert all("\n" not in c.text and c.finish_reason in ("stop", "length") for c in o.outputs)
        assert o.text == o.outputs[0].text and o.token_ids == o.outputs[0].token_ids  # the flat fields: sample 0's
        assert o.outputs[0].token_ids != o.outputs[1].token_ids, "a seeded request's n samples must differ"
    again = llm.generate(["Hello, my name is"], SamplingParams(n=2, temperature=0.8, stop="\n", max_tokens=16, seed=5))
    assert [c.token_ids for c in again[0].outputs] == [c.token_ids for c in outs[0].outputs], "and be repeatable"


def test_stop_strings_cut_the_text(llm):
    sp = SamplingParams(max_tokens=12, ignore_eos=True)
    (free,) = llm.generate([[11, 12, 13]], sp, use_tqdm=False)
    text = free.text
    stop = next(text[i : i + 2] for i in range(3, len(text) - 2) if text.find(text[i : i + 2]) == i and text[i] != " ")
    cut = text.index(stop)
    (out,) = llm.generate([[11, 12, 13]], replace(sp, stop=[stop, "\x00never"]), use_tqdm=False)
    c = out.outputs[0]
    assert c.text == text[:cut] and c.finish_reason == "stop" and c.stop_reason == stop
    assert len(c.token_ids) < 12 and c.token_ids == free.token_ids[: len(c.token_ids)], "it stops generating there"
    (inc,) = llm.generate([[11, 12, 13]], replace(sp, stop=stop, include_stop_str_in_output=True), use_tqdm=False)
    assert inc.text == text[:cut] + stop
    (late,) = llm.generate([[11, 12, 13]], replace(sp, stop=stop, min_tokens=12), use_tqdm=False)
    assert late.text == text and late.finish_reason == "length", "no stop string ends a sample before min_tokens"
    assert not llm.scheduler.reqs, "a sample cut at a stop string leaves the scheduler"


def test_min_tokens_keeps_eos_and_stop_tokens_away(llm):
    (free,) = llm.generate([[7, 8, 9]], SamplingParams(max_tokens=10, ignore_eos=True), use_tqdm=False)
    stop = free.token_ids[2]
    first = free.token_ids.index(stop)
    (short,) = llm.generate([[7, 8, 9]], SamplingParams(max_tokens=10, stop_token_ids=[stop]), use_tqdm=False)
    assert len(short.token_ids) == first + 1 and short.outputs[0].stop_reason == stop
    (held,) = llm.generate([[7, 8, 9]], SamplingParams(max_tokens=10, stop_token_ids=[stop], min_tokens=6))
    assert stop not in held.token_ids[:6] and len(held.token_ids) >= 6
    assert held.token_ids[:first] == free.token_ids[:first], "tokens other than the banned ones are unchanged"
    llm.scheduler.eos_ids.add(stop)
    try:
        (eos,) = llm.generate([[7, 8, 9]], SamplingParams(max_tokens=10, min_tokens=6), use_tqdm=False)
    finally:
        llm.scheduler.eos_ids.discard(stop)
    assert stop not in eos.token_ids[:6] and len(eos.token_ids) >= 6
    assert eos.token_ids == held.token_ids[: len(eos.token_ids)] and eos.outputs[0].stop_reason is None


def test_logprobs_count_is_vllms_shape_of_the_engines_logprobs(llm):
    prompt = [21, 22, 23, 24]
    hot = dict(max_tokens=5, temperature=1.3, seed=2, ignore_eos=True)
    (ours,) = llm.generate([prompt], SamplingParams(**hot, logprobs=True, top_logprobs=2), use_tqdm=False)
    (vllm,) = llm.generate([prompt], SamplingParams(**hot, logprobs=2), use_tqdm=False)
    c = vllm.outputs[0]
    assert c.token_ids == ours.token_ids and len(c.logprobs) == 5
    for tok, lp, top, step in zip(c.token_ids, ours.logprobs, ours.top_logprobs, c.logprobs):
        assert len(step) == (2 if tok in dict(top) else 3), "the 2 most likely, and the sampled token"
        assert step[tok].logprob == pytest.approx(lp)
        for rank, (t, v) in enumerate(top, 1):
            assert step[t].rank == rank and step[t].logprob == pytest.approx(v)
            assert step[t].decoded_token == llm.tokenizer.decode([t])
    assert c.cumulative_logprob == pytest.approx(sum(ours.logprobs))
    (zero,) = llm.generate([prompt], SamplingParams(**hot, logprobs=0, prompt_logprobs=1), use_tqdm=False)
    assert [list(s) for s in zero.outputs[0].logprobs] == [[t] for t in c.token_ids], "logprobs=0: the sampled one"
    assert zero.prompt_logprobs[0] is None and len(zero.prompt_logprobs) == len(prompt)
    assert all(len(s) in (1, 2) and t in s for t, s in zip(prompt[1:], zero.prompt_logprobs[1:]))
    (none,) = llm.generate([prompt], SamplingParams(**hot), use_tqdm=False)
    assert none.outputs[0].logprobs is None and none.outputs[0].cumulative_logprob is None


@pytest.mark.parametrize(
    "kwargs, param",
    [
        (dict(min_p=0.1), "min_p"),
        (dict(best_of=2), "best_of"),
        (dict(logit_bias={5: 1.0}), "logit_bias"),
        (dict(n=0), "n"),
        (dict(logprobs=21), "logprobs"),
        (dict(prompt_logprobs=-1), "prompt_logprobs"),
        (dict(stop=["ok", ""]), "stop"),
        (dict(min_tokens=9, max_tokens=8), "min_tokens"),
        (dict(presence_penalty=2.5), "presence_penalty"),
        (dict(frequency_penalty=float("nan")), "frequency_penalty"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
    ],
)
def test_unsupported_or_bad_vllm_params_raise_value_error(llm, kwargs, param):
    with pytest.raises(ValueError, match=param) as e:
        llm.generate([[1, 2]], SamplingParams(**kwargs), use_tqdm=False)
    assert e.value.param == param and not llm.scheduler.reqs


@torch.inference_mode()
def penalized_reference(path, prompt, tokens, rep, freq, pres):
    """Check each of ``tokens`` against HF's logits at its step, penalized by hand: the engine's choice must be
    the penalized maximum (within float32 noise); returns how many steps the penalty changed HF's argmax."""
    from hf_ref import hf_model

    logits = hf_model(path)(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 :].float()
    changed = 0
    for j, tok in enumerate(tokens):
        x, out = logits[j].clone(), torch.tensor(tokens[:j], dtype=torch.int64)
        seen = torch.tensor(sorted(set(prompt + tokens[:j])))
        x[seen] = torch.where(x[seen] > 0, x[seen] / rep, x[seen] * rep)
        count = torch.bincount(out, minlength=len(x)).float()
        x -= freq * count + pres * (count > 0)
        assert float(x[tok]) >= float(x.max()) - 1e-4, f"step {j}: {tok} is not the penalized argmax {int(x.argmax())}"
        changed += int(logits[j].argmax()) != tok
    return changed


@pytest.mark.parametrize("loop", ["plain", "overlap"])
def test_penalties_equal_hf_logits_penalized_and_leave_batch_mates_alone(tiny_llama, loop):
    llm = LLM(str(tiny_llama), dtype="float32", debug_checks=True, components={"loop": loop})
    prompt, other = [19556], [40, 41, 42]  # greedy, the prompt repeats one token 5 times: a penalty bites
    greedy = SamplingParams(max_tokens=10, ignore_eos=True)
    sampled = replace(greedy, temperature=0.9, seed=4)
    alone = [llm.generate([p], sp, use_tqdm=False)[0].token_ids for p, sp in ((other, greedy), (other, sampled))]
    for rep, freq, pres in ((1.6, 0.0, 0.0), (1.0, 0.7, 0.5), (1.3, -0.4, 0.3)):
        pen = replace(greedy, repetition_penalty=rep, frequency_penalty=freq, presence_penalty=pres)
        outs = llm.generate([prompt, other, other], [pen, greedy, sampled], use_tqdm=False)
        assert [o.token_ids for o in outs[1:]] == alone, "a batch-mate's penalty changed another request's tokens"
        assert penalized_reference(tiny_llama, prompt, outs[0].token_ids, rep, freq, pres) > 0, "a penalty never bit"
        assert llm.generate([prompt], pen, use_tqdm=False)[0].token_ids == outs[0].token_ids, "alone == batched"
