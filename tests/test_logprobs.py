"""Logprobs against the oracle: HF's float32 ``log_softmax`` of the same sequence, on the tiny models.

The engine reports the model's distribution (before temperature, top-k and top-p; after a grammar
mask): an output token's logprob is HF's at the position before it, the top tokens are HF's top-k
there, and a prompt token's logprob (``prompt_logprobs_from``) is scored by the position before it,
whatever chunking, the prefix cache, retraction or the overlap loop did to the passes."""

from __future__ import annotations

import random

import pytest
import torch
from hf_ref import hf_model

from minisgl import LLM, SamplingParams

ATOL = 2e-4  # float32 engine vs float32 HF: different kernels, the same math


def prompts(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    base = [rng.randrange(3, 49152) for _ in range(30)]
    return [base + [rng.randrange(3, 49152) for _ in range(9)], base[:21], [rng.randrange(3, 49152) for _ in range(5)]]


@torch.inference_mode()
def hf_logprobs(path, ids: list[int]) -> torch.Tensor:
    """``[len(ids), vocab]``: row p is the log-distribution of token p + 1."""
    return hf_model(path)(torch.tensor([ids])).logits[0].float().log_softmax(-1)


def check_against_hf(path, prompt: list[int], out, k: int) -> None:
    ref = hf_logprobs(path, prompt + out.token_ids)
    n = len(prompt)
    for j, tok in enumerate(out.token_ids):
        row = ref[n - 1 + j]
        assert out.logprobs[j] == pytest.approx(float(row[tok]), abs=ATOL), f"output token {j}"
        top_vals, top_ids = row.topk(k)
        got_ids, got_vals = zip(*out.top_logprobs[j])
        assert list(got_vals) == pytest.approx(top_vals.tolist(), abs=ATOL)
        # ids may differ only where two values tie within the tolerance
        for gi, ri, gv in zip(got_ids, top_ids.tolist(), got_vals):
            assert gi == ri or abs(float(row[gi]) - gv) < ATOL, f"top token at output {j}"
    assert out.prompt_logprobs is not None and len(out.prompt_logprobs) == n - 1, "tokens 1..n-1 are scored"
    for i, (lp, top) in enumerate(out.prompt_logprobs):
        assert lp == pytest.approx(float(ref[i, prompt[i + 1]]), abs=ATOL), f"prompt token {i + 1}"
        assert top[0][1] == pytest.approx(float(ref[i].max()), abs=ATOL)


CONFIGS = {  # one model each: the paths differ in the scheduler, the oracle is the same
    "llama, plain loop, chunks of 8": ("tiny_llama", dict(max_prefill_length=8)),
    "qwen3, overlap loop, page 4": ("tiny_qwen3", dict(components={"loop": "overlap"}, page_size=4)),
}


@pytest.fixture(scope="module")
def llm(tiny_llama):
    """The tiny Llama in float32 with chunks of 8 tokens, shared by the tests that need nothing else."""
    return LLM(str(tiny_llama), dtype="float32", max_prefill_length=8)


@pytest.mark.parametrize("config", list(CONFIGS), ids=list(CONFIGS))
def test_greedy_and_prompt_logprobs_equal_hf(request, config):
    fixture, kwargs = CONFIGS[config]
    tiny_model = request.getfixturevalue(fixture)
    llm = LLM(str(tiny_model), dtype="float32", debug_checks=True, **kwargs)
    ps = prompts()
    sp = SamplingParams(max_tokens=6, ignore_eos=True, logprobs=True, top_logprobs=4, prompt_logprobs_from=0)
    outs = llm.generate(ps, sp, use_tqdm=False)
    for p, o in zip(ps, outs):
        check_against_hf(tiny_model, p, o, 4)
    # again, the prompts cached now: scoring from token 0 needs every position computed, so no hit
    again = llm.generate(ps, sp, use_tqdm=False)
    assert [o.cached_tokens for o in again] == [0, 0, 0]
    for p, o in zip(ps, again):
        check_against_hf(tiny_model, p, o, 4)


def test_logprobs_are_before_temperature_and_top_p(llm, tiny_llama):
    """A sampled token's logprob is the model's own (vLLM's default, OpenAI's), not that of the
    temperature-scaled, top-p-truncated distribution it was drawn from; and asking for logprobs
    does not change the tokens."""
    p = prompts()[0]
    hot = SamplingParams(max_tokens=8, temperature=1.7, top_p=0.9, seed=3, ignore_eos=True)
    plain = llm.generate([p], hot, use_tqdm=False)[0]
    hot.logprobs, hot.top_logprobs = True, 2
    out = llm.generate([p], hot, use_tqdm=False)[0]
    assert out.token_ids == plain.token_ids
    ref = hf_logprobs(tiny_llama, p + out.token_ids)
    want = [float(ref[len(p) - 1 + j, t]) for j, t in enumerate(out.token_ids)]
    assert out.logprobs == pytest.approx(want, abs=ATOL)
    assert out.prompt_logprobs is None and all(len(t) == 2 for t in out.top_logprobs)


def test_partial_prompt_scoring_and_top_logprobs_zero(llm, tiny_llama):
    """Scoring from token 25: a cached prefix may serve positions 0..23 (position 24 scores token 25)."""
    p = prompts(1)[0]  # a prompt no other test of this module caches
    llm.generate([p], SamplingParams(max_tokens=1), use_tqdm=False)  # now cached
    sp = SamplingParams(max_tokens=2, logprobs=True, prompt_logprobs_from=25)
    out = llm.generate([p], sp, use_tqdm=False)[0]
    assert out.cached_tokens == 24
    ref = hf_logprobs(tiny_llama, p + out.token_ids)
    assert [lp for lp, _ in out.prompt_logprobs] == pytest.approx([float(ref[i - 1, p[i]]) for i in range(25, len(p))])
    assert out.top_logprobs == [[], []] and len(out.logprobs) == 2


def test_logprobs_survive_retraction(tiny_llama):
    """A pool too small for all requests: the newest are retracted and recomputed; their logprobs
    (output and prompt) are those of a run with memory to spare, each reported once."""
    ps = [[3 + i] * (4 + 3 * i) for i in range(6)]
    sp = SamplingParams(max_tokens=60, ignore_eos=True, logprobs=True, prompt_logprobs_from=1)
    big = LLM(str(tiny_llama), dtype="float32", page_size=4)
    want = big.generate(ps, sp, use_tqdm=False)
    small = LLM(str(tiny_llama), dtype="float32", page_size=4, num_pages=40, debug_checks=True)
    got = small.generate(ps, sp, use_tqdm=False)
    assert small.scheduler.stats.retracted > 0, "the pool was meant to run out"
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)
        assert len(g.prompt_logprobs) == len(w.prompt_logprobs)
        assert [x[0] for x in g.prompt_logprobs] == pytest.approx([x[0] for x in w.prompt_logprobs], abs=1e-4)


def test_bad_logprob_params_are_refused(llm):
    with pytest.raises(ValueError, match="top_logprobs"):
        llm.generate([[5, 6]], SamplingParams(top_logprobs=21), use_tqdm=False)
    with pytest.raises(ValueError, match="prompt_logprobs_from"):
        llm.generate([[5, 6]], SamplingParams(prompt_logprobs_from=-2), use_tqdm=False)
