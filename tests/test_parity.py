"""HF parity: the engine's greedy tokens equal HF transformers' on every path (page sizes, prefix
caches, chunk sizes, batch mixes), on tiny random Llama (llama3 rope scaling, sharded checkpoint)
and Qwen3 (q/k norm, head_dim != hidden/heads) models and on the embedded SmolLM2."""

from __future__ import annotations

import random

import pytest
from hf_ref import hf_greedy

from minisgl import LLM, SamplingParams
from minisgl.env import ENV
from minisgl.kernels import jit


def shared_prefix_prompts(seed: int = 0) -> list[list[int]]:
    """Prompts of different lengths that share prefixes, plus an exact duplicate and a prompt
    that is a prefix of another, so the radix cache splits nodes and has full hits."""
    rng = random.Random(seed)
    r = lambda n: [rng.randrange(3, 49152) for _ in range(n)]
    base = r(40)
    p0 = base + r(10)
    return [
        p0,
        base + r(25),
        base[:20] + r(5),
        list(p0),  # exact duplicate
        p0[:30],  # a prefix of p0
        r(3),
        r(100),
        base[:17],
    ]


N_NEW = 12


@pytest.fixture(scope="module")
def tiny_refs(tiny_llama, tiny_qwen3):
    prompts = shared_prefix_prompts()
    return {path: [hf_greedy(path, p, N_NEW) for p in prompts] for path in (tiny_llama, tiny_qwen3)}, prompts


CONFIGS = [
    dict(page_size=ps, cache_type=cache, max_prefill_length=chunk)
    for ps in (1, 16)
    for cache in ("radix", "naive")
    for chunk in (8, 64, None)
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_tiny_models_match_hf(tiny_model, tiny_refs, cfg):
    refs, prompts = tiny_refs
    llm = LLM(str(tiny_model), dtype="float32", debug_checks=True, **cfg)
    params = SamplingParams(max_tokens=N_NEW, ignore_eos=True)
    # first wave all together (one batch, ragged lengths), second wave one by one (cache hits)
    outs = llm.generate(prompts, params, use_tqdm=False)
    for i, (out, ref) in enumerate(zip(outs, refs[tiny_model])):
        assert out.token_ids == ref, f"prompt {i} (len {len(prompts[i])}) differs from HF"
        assert out.finish_reason == "length"
    for i in (3, 4, 1, 7):
        (out,) = llm.generate([prompts[i]], params, use_tqdm=False)
        assert out.token_ids == refs[tiny_model][i], f"prompt {i} differs from HF on a cache hit"
    if cfg["cache_type"] == "radix":
        assert llm.cache_stats.hit_tokens > 0
        assert outs is not None and any(o.cached_tokens for o in llm.generate([prompts[3]], params, use_tqdm=False))
    else:
        assert llm.cache_stats.hit_tokens == 0
    sched = llm.scheduler
    assert not sched.reqs and sched.num_running == 0
    sched.check_memory()


@pytest.mark.parametrize("level", jit.cpu_isas()[1:])  # the widest runs every test above
def test_tiny_models_match_hf_on_each_cpu_level(tiny_model, tiny_refs, level, monkeypatch):
    """The narrower instruction-set levels of the C++ CPU kernels (MINISGL_CPU_ISA; avx2 and portable
    on an AVX-512 machine) give HF's greedy tokens too, in a batch and on cache hits."""
    monkeypatch.setattr(ENV, "cpu_isa", level)
    assert jit.cpu_module() is not None and jit.cpu_module().isa() == level
    refs, prompts = tiny_refs
    llm = LLM(str(tiny_model), dtype="float32", debug_checks=True)
    params = SamplingParams(max_tokens=N_NEW, ignore_eos=True)
    try:
        outs = llm.generate(prompts, params, use_tqdm=False)
        assert [o.token_ids for o in outs] == refs[tiny_model], f"{level}: a prompt's tokens differ from HF"
        (out,) = llm.generate([prompts[4]], params, use_tqdm=False)
        assert out.token_ids == refs[tiny_model][4] and out.cached_tokens > 0
    finally:
        llm.shutdown()


def test_small_running_limit_matches_hf(tiny_llama, tiny_refs):
    """Requests admitted a few at a time (max_running_requests=2), with a tiny KV pool."""
    refs, prompts = tiny_refs
    llm = LLM(
        str(tiny_llama),
        dtype="float32",
        max_running_requests=2,
        num_pages=40,
        page_size=4,
        max_prefill_length=16,
        debug_checks=True,
    )
    outs = llm.generate(prompts, SamplingParams(max_tokens=N_NEW, ignore_eos=True), use_tqdm=False)
    assert [o.token_ids for o in outs] == refs[tiny_llama]
    assert llm.cache_stats.hit_tokens > 0


CHAT = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain gravity to a child in two sentences.",
    "List three prime numbers.",
    "hi",
]


@pytest.fixture(scope="module")
def embedded_refs(embedded_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(embedded_path)
    convs = [[{"role": "user", "content": c}] for c in CHAT]
    # a second turn extends the first conversation: its whole history is a cached prefix
    convs.append(convs[0] + [{"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And Italy?"}])
    ids = [list(tok.apply_chat_template(c, add_generation_prompt=True, tokenize=True)["input_ids"]) for c in convs]
    return ids, [hf_greedy(embedded_path, i, 40) for i in ids]  # 40 tokens, through EOS


@pytest.mark.parametrize(
    "cfg",
    [
        dict(page_size=1, cache_type="radix", max_prefill_length=None),
        dict(page_size=16, cache_type="radix", max_prefill_length=64),
        dict(page_size=1, cache_type="naive", max_prefill_length=8),
        dict(page_size=16, cache_type="naive", max_prefill_length=None),
    ],
    ids=lambda c: "-".join(str(v) for v in c.values()),
)
def test_embedded_model_matches_hf(embedded_path, embedded_refs, cfg):
    ids, refs = embedded_refs
    llm = LLM(dtype="float32", **cfg)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    outs = llm.generate(ids, params, use_tqdm=False)
    for i, (out, ref) in enumerate(zip(outs, refs)):
        assert out.token_ids == ref, f"chat prompt {i}: {out.text!r}"
        assert len(out.token_ids) == 40
    # again one by one: the radix cache now serves the shared system prompt / the first turn
    for i in (0, 5):
        (out,) = llm.generate([ids[i]], params, use_tqdm=False)
        assert out.token_ids == refs[i]
        assert (out.cached_tokens > 0) == (cfg["cache_type"] == "radix")
    llm.scheduler.check_memory()


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_bfloat16_agrees_with_float32(kind, tmp_path):
    """The CPU default dtype (bf16 where the CPU has it) against float32 on the same model: logits
    within 1.0 (bf16 rounds the weights too) and tokens equal up to near-ties (greedy_compare)."""
    from greedy_compare import LogitRecorder, compare_greedy
    from tiny_models import HEAD_DIM_128, save_tiny_model

    path = save_tiny_model(kind, tmp_path, tokenizer=False, **HEAD_DIM_128)
    distinct = dict.fromkeys(tuple(t % 4096 for t in p[:60]) for p in shared_prefix_prompts())
    prompts = [list(p) for p in distinct]
    runs = {}
    for dtype in ("float32", "bfloat16"):
        llm = LLM(str(path), dtype=dtype, num_pages=2048, max_prefill_length=64)
        rec = LogitRecorder(llm.scheduler.engine)
        outs = llm.generate(prompts, SamplingParams(max_tokens=10, ignore_eos=True), use_tqdm=False)
        runs[dtype] = ([o.token_ids for o in outs], rec)
    share = compare_greedy(prompts, *runs["bfloat16"], *runs["float32"], atol=1.0)
    assert share >= 0.25, f"near-ties cut the comparison to {share:.0%} of the tokens"
