"""The sampler: greedy, temperature, top-k, top-p, seeds — against direct definitions."""

from __future__ import annotations

import math

import pytest
import torch

from minisgl import LLM, SamplingParams
from minisgl.engine.sample import DefaultSampler, SamplingInfo, filter_logits, uniform

V = 50


def info(n: int, temperature=1.0, top_k=V, top_p=1.0, seed=0, step=0) -> SamplingInfo:
    f = lambda x, dt: torch.full((n,), x, dtype=dt)
    return SamplingInfo(
        temperatures=f(temperature, torch.float32),
        top_k=f(top_k, torch.int64),
        top_p=f(top_p, torch.float32),
        seeds=torch.arange(n, dtype=torch.int64) + seed,
        steps=f(step, torch.int64),
        all_greedy=temperature == 0,
        need_top_k=top_k < V,
        need_top_p=top_p < 1.0,
    )


@pytest.mark.parametrize("temperature", [0.0, 0.6])
def test_plain_info_is_plain_temperature_sampling(temperature):
    got, want = SamplingInfo.plain(5, temperature, V, torch.device("cpu")), info(5, temperature)
    for name in ("temperatures", "top_k", "top_p", "seeds", "steps"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert (got.all_greedy, got.need_top_k, got.need_top_p) == (want.all_greedy, False, False)


def test_greedy_is_argmax():
    logits = torch.randn(16, V)
    assert torch.equal(DefaultSampler().sample(logits, info(16, temperature=0.0)), logits.argmax(-1))


def test_greedy_rows_in_a_mixed_batch_stay_argmax():
    logits = torch.randn(8, V)
    i = info(8)
    i.temperatures[::2] = 0.0
    out = DefaultSampler().sample(logits, i)
    assert torch.equal(out[::2], logits[::2].argmax(-1))


@pytest.mark.parametrize("k", [1, 3, 10])
def test_top_k_never_leaves_the_top_k(k):
    torch.manual_seed(0)
    logits = torch.randn(256, V)
    topk = logits.topk(k, dim=-1).indices
    for step in range(5):
        out = DefaultSampler().sample(logits, info(256, temperature=2.0, top_k=k, step=step))
        assert (topk == out[:, None]).any(-1).all()


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_top_p_never_leaves_the_nucleus(p):
    torch.manual_seed(1)
    logits = torch.randn(256, V) * 2
    probs = logits.softmax(-1)
    sorted_p, order = probs.sort(-1, descending=True)
    before = sorted_p.cumsum(-1) - sorted_p
    nucleus = [set(order[r][before[r] < p].tolist()) for r in range(256)]
    for step in range(5):
        out = DefaultSampler().sample(logits, info(256, top_p=p, step=step))
        assert all(int(t) in nucleus[r] for r, t in enumerate(out))
    # the nucleus always keeps the most likely token
    assert all(int(order[r][0]) in nucleus[r] for r in range(256))


def test_filter_keeps_exactly_the_definitions():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]])
    i = SamplingInfo(
        torch.tensor([1.0]),
        torch.tensor([2]),
        torch.tensor([1.0]),
        torch.tensor([0]),
        torch.tensor([0]),
        False,
        True,
        False,
    )
    assert torch.isfinite(filter_logits(logits, i)).tolist() == [[True, True, False, False, False]]
    p = logits.softmax(-1)[0]  # 0.64, 0.24, 0.09, ...: p=0.7 needs the first two
    i = SamplingInfo(
        torch.tensor([1.0]),
        torch.tensor([5]),
        torch.tensor([0.7]),
        torch.tensor([0]),
        torch.tensor([0]),
        False,
        False,
        True,
    )
    assert p[0] < 0.7 < p[0] + p[1]
    assert torch.isfinite(filter_logits(logits, i)).tolist() == [[True, True, False, False, False]]


def test_uniforms_are_uniform_and_a_function_of_seed_and_step():
    seeds = torch.arange(20000, dtype=torch.int64) * 7919
    u = uniform(seeds, torch.zeros_like(seeds))
    assert 0 < float(u.min()) and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.01 and abs(float(u.var()) - 1 / 12) < 0.005
    hist = torch.histc(u.float(), bins=10, min=0, max=1) / len(u)
    assert float((hist - 0.1).abs().max()) < 0.01
    again = uniform(torch.tensor([5, 5, 6]), torch.tensor([3, 4, 3]))
    assert again[0] != again[1] and again[0] != again[2]
    assert torch.equal(again, uniform(torch.tensor([5, 5, 6]), torch.tensor([3, 4, 3])))
    steps = uniform(torch.full((20000,), 42), torch.arange(20000))  # one request over many steps
    assert abs(float(steps.mean()) - 0.5) < 0.01


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, V, 1.0), (0.7, V, 1.0), (1.0, 5, 1.0), (1.0, V, 0.8)])
def test_empirical_frequencies_match_the_target(temperature, top_k, top_p):
    """Draw 20k samples of one row (different seeds) and compare with the filtered softmax:
    total variation distance below 0.02 (its expected value at this size is about 0.01)."""
    torch.manual_seed(2)
    logits = torch.randn(1, V) * 1.5
    n = 20000
    i = info(n, temperature=temperature, top_k=top_k, top_p=top_p)
    out = DefaultSampler().sample(logits.expand(n, V), i)
    freq = torch.bincount(out, minlength=V).float() / n
    target = filter_logits(logits, info(1, temperature=temperature, top_k=top_k, top_p=top_p)).softmax(-1)[0]
    tv = 0.5 * float((freq - target).abs().sum())
    assert tv < 0.02, f"sampled frequencies are {tv:.3f} away from the target distribution"
    assert float(freq[target == 0].sum()) == 0.0


def test_seeded_requests_repeat_whatever_their_batch(tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float32")
    p = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=10, seed=123, ignore_eos=True)
    alone = llm.generate([[5, 6, 7, 8]], p, use_tqdm=False)[0].token_ids
    other = SamplingParams(temperature=1.0, max_tokens=14, ignore_eos=True)
    batched = llm.generate([[9] * 30, [5, 6, 7, 8], [1, 2]], [other, p, other], use_tqdm=False)[1].token_ids
    assert alone == batched
    assert llm.generate([[5, 6, 7, 8]], p, use_tqdm=False)[0].token_ids == alone
    different = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=10, seed=124, ignore_eos=True)
    assert llm.generate([[5, 6, 7, 8]], different, use_tqdm=False)[0].token_ids != alone


def test_temperature_changes_diversity(tiny_llama):
    """Unseeded sampled requests differ from each other; greedy ones do not."""
    llm = LLM(str(tiny_llama), dtype="float32")
    outs = llm.generate([[5, 6, 7]] * 8, SamplingParams(temperature=1.5, max_tokens=8, ignore_eos=True), use_tqdm=False)
    assert len({tuple(o.token_ids) for o in outs}) > 1
    outs = llm.generate([[5, 6, 7]] * 4, SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)
    assert len({tuple(o.token_ids) for o in outs}) == 1
    assert math.isfinite(llm.cache_stats.hit_rate)


def test_top_p_of_1_keeps_every_token_in_a_mixed_batch():
    """A row with top_p = 1 is not filtered, even where a float32 cumsum reaches 1.0 before its tail and
    another row of the batch needs top-p (its filter must not depend on the batch)."""
    logits = torch.zeros(2, V)
    logits[:, 3] = 30.0  # the mass before every other token rounds to 1.0 in float32
    i = info(2, top_p=1.0)
    i.top_p[1], i.need_top_p = 0.5, True
    out = filter_logits(logits, i)
    assert torch.equal(out[0], logits[0]), out[0]
    assert out[1].isinf().sum() == V - 1
