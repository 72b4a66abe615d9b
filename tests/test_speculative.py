"""Speculative decoding (minisgl/speculative/, minisgl/speculative/feature.py): the n-gram drafter, the
verifier's rule at its boundaries, greedy exactness against the plain engine on every path (so against
HF: tests/test_parity.py), the sampled distribution by a chi-square test, and the server's flags and stats.

Exactness runs in float32, as the HF parity tests do, and in bfloat16 where the CPU's verify pass runs each
position as a decode row (the same arithmetic as a plain decode step)."""

from __future__ import annotations

import random
import re

import pytest
import torch

from autograder.checks import chi2_bound
from minisgl import LLM, SamplingParams
from minisgl.engine.sample import SAMPLERS, SamplingInfo
from minisgl.speculative import DRAFTERS, VERIFIERS, Drafter
from minisgl.speculative.ngram import lookup
from minisgl.speculative.verify import DefaultVerifier


# ---- the n-gram drafter ------------------------------------------------------------------------------
def test_ngram_proposes_what_followed_the_most_recent_match():
    toks = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert lookup(toks, 2) == [7, 8]  # the latest earlier "1 2 3" is followed by 7 8, not 9
    assert lookup(toks, 10) == [7, 8, 5, 1, 2, 3]  # up to the end, never past it


def test_ngram_prefers_the_longest_suffix_and_needs_min_n():
    toks = [7, 6, 1, 4, 9, 6, 1, 2, 7, 6, 1]
    assert lookup(toks, 1, max_n=3, min_n=2) == [4]  # "7 6 1" (3 tokens) beats the later "6 1"
    assert lookup(toks, 1, max_n=2, min_n=2) == [2]
    assert lookup([4, 1, 2, 3, 1], 3, min_n=2) == []  # only a 1-token suffix matches
    assert lookup([4, 1, 2, 3, 1], 3, min_n=1) == [2, 3, 1]
    assert lookup([1, 2], 3) == [] and lookup([], 3) == []


def test_ngram_match_must_be_followed_by_a_token():
    # the suffix itself (ending at the last token) is not a match; an overlapping earlier one is
    assert lookup([3, 3, 3], 2, min_n=2) == [3]
    assert lookup([8, 3, 3], 2, min_n=2) == []


# ---- the verifier -------------------------------------------------------------------------------------
VOCAB = 6


def info_of(temps: list[float], steps: list[int], seeds: list[int] | None = None, top_k=None) -> SamplingInfo:
    n = len(temps)
    top_k = top_k or [VOCAB] * n
    return SamplingInfo(
        temperatures=torch.tensor(temps, dtype=torch.float32),
        top_k=torch.tensor(top_k, dtype=torch.int64),
        top_p=torch.ones(n),
        seeds=torch.tensor(seeds or list(range(n)), dtype=torch.int64),
        steps=torch.tensor(steps, dtype=torch.int64),
        all_greedy=all(t == 0 for t in temps),
        need_top_k=any(k < VOCAB for k in top_k),
        need_top_p=False,
    )


def greedy_logits(argmaxes: list[list[int]]) -> torch.Tensor:
    """[B, K+1, V] logits whose argmax at row r, position j is argmaxes[r][j]."""
    out = torch.zeros(len(argmaxes), len(argmaxes[0]), VOCAB)
    for r, row in enumerate(argmaxes):
        for j, t in enumerate(row):
            out[r, j, t] = 1.0
    return out


@pytest.mark.parametrize(
    "argmax, drafts, accepted",
    [
        ([1, 2, 3, 4], [1, 2, 3], 3),  # every draft accepted: the bonus comes from the last position
        ([1, 2, 3, 4], [5, 2, 3], 0),  # the first is wrong: nothing later counts, even if it matches
        ([1, 2, 3, 4], [1, 2, 5], 2),  # the last one wrong: 2 accepted, then the target's token
        ([1, 2, 3, 4], [1, -1, -1], 1),  # a row with one draft (padded): at most 1
        ([1, 2, 3, 4], [-1, -1, -1], 0),  # no drafts: the plain decode token
    ],
)
def test_greedy_verdict(argmax, drafts, accepted):
    v = DefaultVerifier().verify(
        greedy_logits([argmax]), torch.tensor([drafts]), info_of([0.0], [0]), SAMPLERS.get("default")()
    )
    assert int(v.accepted[0]) == accepted, f"drafts {drafts} against argmaxes {argmax}: accepted {int(v.accepted[0])}"
    got = v.tokens[0, : accepted + 1].tolist()
    assert got == argmax[: accepted + 1], (
        f"the output should be the target's argmaxes {argmax[: accepted + 1]}, got {got}"
    )


def test_greedy_verdict_rows_are_independent():
    logits = greedy_logits([[1, 2, 3], [4, 4, 4]])
    v = DefaultVerifier().verify(
        logits, torch.tensor([[1, 2], [4, 0]]), info_of([0.0, 0.0], [0, 5]), SAMPLERS.get("default")()
    )
    assert v.accepted.tolist() == [2, 1]
    assert v.tokens[0].tolist() == [1, 2, 3] and v.tokens[1, :2].tolist() == [4, 4]


def test_sampled_verdict_follows_the_target_distribution():
    """Chi-square over the joint outcome of two positions, with 6000 seeds at significance 0.001: the
    output at position 0 follows p0 (draft x0: accepted with p0(x0), else the residual); given that x0
    was accepted, the token at position 1 follows p1. Draft x1 has probability 0 (top-k drops it)."""
    g = torch.Generator().manual_seed(0)
    p0, p1 = torch.rand(VOCAB, generator=g), torch.rand(VOCAB, generator=g)
    x0, x1 = int(p0.argmax()), int(p1.argmin())
    n = 6000
    logits = torch.stack([p0.log(), p1.log(), torch.zeros(VOCAB)])[None].repeat(n, 1, 1)
    top_k = VOCAB - 1  # drops p1's least likely token, x1: never accepted, always corrected
    info = info_of([1.0] * n, [3] * n, seeds=list(range(n)), top_k=[top_k] * n)
    v = DefaultVerifier().verify(logits, torch.tensor([[x0, x1]] * n), info, SAMPLERS.get("default")())
    assert int(v.accepted.max()) <= 1, "a draft outside top-k was accepted"
    drop_min = lambda p: torch.where(torch.arange(VOCAB) == p.argmin(), 0.0, p) / (p.sum() - p.min())
    q0, q1 = drop_min(p0), drop_min(p1)  # the target distributions under top-k = VOCAB - 1
    expected, observed = {}, {}
    for y in range(VOCAB):  # outcome (y,) when y != x0, (x0, z) when x0 was accepted
        if y != x0 and q0[y] > 0:
            expected[(y,)] = float(q0[y])
    for z in range(VOCAB):
        if z != x1:
            expected[(x0, z)] = float(q0[x0] * q1[z])
    for a, row in zip(v.accepted.tolist(), v.tokens.tolist()):
        key = tuple(row[: a + 1])
        assert key in expected, f"outcome {key} has probability 0"
        observed[key] = observed.get(key, 0) + 1
    stat = sum((observed.get(k, 0) - n * p) ** 2 / (n * p) for k, p in expected.items())
    bound = chi2_bound(len(expected) - 1)
    assert stat < bound, f"chi-square {stat:.1f} >= {bound:.1f}: outcomes {observed}, expected {expected}"


# ---- the engine: greedy exactness on every path ---------------------------------------------------------
N_NEW = 20
REFS: dict[tuple[int, ...], list[int]] = {}


class OracleDrafter(Drafter):
    """Drafts the plain engine's own continuation, with some tokens wrong (a pattern in the position), so
    steps accept all, some, or none of their drafts."""

    def propose(self, req, k):
        n = len(req.output_ids)
        good = REFS[tuple(req.input_ids)][n : n + k]
        return [t if (3 * n + 5 * j) % 7 else (t + 1) % 49152 for j, t in enumerate(good)]


def prompts() -> list[list[int]]:
    rng = random.Random(1)
    r = lambda n: [rng.randrange(3, 49152) for _ in range(n)]
    base = r(30)
    # shared prefixes, repetitive ones (the tiny Llama's greedy answer to [5] * 30 repeats a token: n-gram drafts)
    return [base + r(7), base + r(2), r(5), r(4) * 6, base[:12], [5] * 30]


@pytest.fixture(scope="module")
def plain_refs(tiny_llama, tiny_qwen3):
    out = {}
    for path in (tiny_llama, tiny_qwen3):
        llm = LLM(str(path), dtype="float32")
        outs = llm.generate(prompts(), SamplingParams(max_tokens=N_NEW, ignore_eos=True), use_tqdm=False)
        out[path] = [o.token_ids for o in outs]
    return out


PATHS = {
    "radix-page1": dict(),
    "naive-page4-chunk8": dict(page_size=4, cache_type="naive", max_prefill_length=8),
    "radix-page4-overlap": dict(page_size=4, components={"loop": "overlap"}),
    "retract-small-pool": dict(num_pages=72),
}


@pytest.mark.parametrize("path_name", list(PATHS))
@pytest.mark.parametrize("model", ["llama", "qwen3"])
def test_greedy_exact_on_every_path(model, path_name, tiny_llama, tiny_qwen3, plain_refs):
    path = tiny_llama if model == "llama" else tiny_qwen3
    refs = plain_refs[path]
    ps = prompts()
    REFS.clear()
    REFS.update({tuple(p): r for p, r in zip(ps, refs)})
    with DRAFTERS.registered("test-oracle", OracleDrafter):
        llm = LLM(
            str(path), dtype="float32", debug_checks=True, speculative_algorithm="test-oracle", **PATHS[path_name]
        )
        params = [SamplingParams(max_tokens=N_NEW, ignore_eos=True) for _ in ps]
        params[2] = SamplingParams(max_tokens=N_NEW, ignore_eos=True, stop_token_ids=[refs[2][9]])  # stops mid-run
        params[4] = SamplingParams(max_tokens=7, ignore_eos=True)  # max_tokens inside an accepted run
        outs = llm.generate(ps, params, use_tqdm=False)
        # a second wave: cache hits on what the first inserted (only accepted tokens' KV may be there)
        again = llm.generate(ps[:2], SamplingParams(max_tokens=N_NEW, ignore_eos=True), use_tqdm=False)
    stats = llm.scheduler.feature("speculative").stats
    want = [refs[0], refs[1], refs[2][: refs[2].index(refs[2][9]) + 1], refs[3], refs[4][:7], refs[5]]
    for i, (o, w) in enumerate(zip(outs, want)):
        assert o.token_ids == w, f"prompt {i} ({path_name}): speculative tokens differ from plain decoding"
    assert [o.token_ids for o in again] == refs[:2], "a second run (prefix-cache hits) differs"
    assert outs[2].finish_reason == "stop" and outs[4].finish_reason == "length"
    assert 0 < stats.accepted_tokens < stats.draft_tokens, f"the oracle should be partly right: {stats}"
    if path_name == "retract-small-pool":
        assert llm.scheduler.stats.retracted > 0, "the small pool should have forced a retraction"


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_verify_passes_run_the_cpu_decode_layer_and_equal_plain_decoding(dtype, tiny_llama, monkeypatch):
    """On a CPU a verify pass runs each of its positions as a decode row (``prepare_token_rows``), so the C++
    decode layer takes it and each position is a plain decode step's arithmetic: the tokens equal plain
    decoding in bfloat16 too. One request at a time: its k + 1 = 5 rows fit every ISA level's C++ layer."""
    import minisgl.models.cpu_decode as cpu_decode
    from minisgl.attention.context import get_ctx
    from minisgl.kernels.jit import cpu_module

    assert cpu_module() is not None, "the CPU kernels did not build: a C++ compiler is needed"
    verify: list[bool] = []  # per verify pass: whether the C++ layer took it
    run_layers = cpu_decode.run_layers

    def recording(model, positions, x):
        out = run_layers(model, positions, x)
        if get_ctx().batch.label == "verify":
            verify.append(out is not None)
        return out

    monkeypatch.setattr(cpu_decode, "run_layers", recording)
    ps = prompts()[2:]
    sp = SamplingParams(max_tokens=N_NEW, ignore_eos=True)
    plain = LLM(str(tiny_llama), dtype=dtype)
    REFS.clear()
    REFS.update({tuple(p): plain.generate([p], sp, use_tqdm=False)[0].token_ids for p in ps})
    with DRAFTERS.registered("test-oracle", OracleDrafter):
        llm = LLM(str(tiny_llama), dtype=dtype, debug_checks=True, speculative_algorithm="test-oracle")
        verify.clear()
        got = {tuple(p): llm.generate([p], sp, use_tqdm=False)[0].token_ids for p in ps}
    assert got == REFS, f"{dtype}: speculative tokens differ from plain decoding"
    stats = llm.scheduler.feature("speculative").stats
    assert len(verify) == stats.verify_rows > 0 and all(verify), f"verify passes not in the C++ layer: {verify}"
    assert 0 < stats.accepted_tokens < stats.draft_tokens


def test_ngram_exact_and_abort_mid_run(tiny_llama, plain_refs):
    """The n-gram drafter's lookup (the repetitive prompts draft), the opt-out, a registered verifier, and an
    abort between steps."""
    refs = plain_refs[tiny_llama]
    ps = prompts()
    calls = []

    class Recording(DefaultVerifier):  # the verifier seam: a registered one is what runs
        def verify(self, logits, drafts, info, sampler):
            calls.append(drafts.shape)
            return super().verify(logits, drafts, info, sampler)

    with VERIFIERS.registered("test-recording", Recording):
        llm = LLM(
            str(tiny_llama), dtype="float32", debug_checks=True, speculative_algorithm="seam_impls:Ngram1",
            components={"verifier": "test-recording"},
        )  # fmt: skip
    params = [SamplingParams(max_tokens=N_NEW, ignore_eos=True, speculative=i != 1) for i in range(len(ps))]
    outs = llm.generate(ps, params, use_tqdm=False)
    assert [o.token_ids for o in outs] == refs
    assert calls and llm.scheduler.feature("speculative").stats.accepted_tokens > 0, (
        "the repetitive prompt should draft and accept"
    )
    sched = llm.scheduler
    req = sched.add_request(999, ps[3], SamplingParams(max_tokens=N_NEW, ignore_eos=True))
    while len(req.output_ids) < 3:
        sched.step()
    assert sched.abort(999)
    while sched.has_work:
        sched.step()
    sched.check_memory()
    assert req.output_ids == refs[3][: len(req.output_ids)]


@pytest.mark.parametrize("algorithm", [None, "NGRAM"])
def test_a_seeded_request_gets_its_tokens_beside_any_neighbour(tiny_llama, algorithm):
    """Whether a request drafts is its own business: beside a logprobs or a grammar request (which never
    draft, and decode as plain rows of the same verify batch) a seeded sampled request drafts as it does
    alone, so it gets the same tokens, with speculation and without."""
    llm = LLM(str(tiny_llama), dtype="float32", speculative_algorithm=algorithm, debug_checks=True)
    prompt = [5] * 30  # repetitive: the n-gram drafter finds drafts at every step
    sp = SamplingParams(temperature=0.5, top_k=2, seed=7, max_tokens=24, ignore_eos=True)
    alone = llm.generate([prompt], sp, use_tqdm=False)[0].token_ids
    assert not algorithm or llm.scheduler.feature("speculative").stats.verify_rows > 0, (
        "alone, the request should draft"
    )
    neighbours = {
        "logprobs": SamplingParams(max_tokens=24, ignore_eos=True, logprobs=True, top_logprobs=2),
        "grammar": SamplingParams(max_tokens=24, regex="[a-z ]{1,80}"),
    }
    for name, other in neighbours.items():
        verified = llm.scheduler.feature("speculative").stats.verify_rows if algorithm else 0
        other_alone = llm.generate([[9, 8, 7, 6]], other, use_tqdm=False)[0]
        outs = llm.generate([prompt, [9, 8, 7, 6]], [sp, other], use_tqdm=False)
        assert outs[0].token_ids == alone, f"beside a {name} request the seeded request's tokens changed"
        # the neighbour, a plain row of the verify batches: its mask and logprobs as in a decode batch (its
        # first token's prefill shared a batch with the seeded prompt's: float32 rounding, hence approx)
        assert outs[1].token_ids == other_alone.token_ids, name
        if name == "logprobs":
            assert outs[1].logprobs == pytest.approx(other_alone.logprobs, rel=1e-5)
        else:
            assert re.fullmatch("[a-z ]*", outs[1].text), outs[1].text
        if algorithm:
            assert llm.scheduler.feature("speculative").stats.verify_rows > verified, (
                f"it did not draft beside the {name} request"
            )


def test_tp2_greedy_exact(tiny_llama, plain_refs):
    """Two tensor-parallel ranks (gloo): each drafts from its own scheduler's identical state."""
    llm = LLM(str(tiny_llama), dtype="float32", tp_size=2, page_size=4, speculative_algorithm="seam_impls:Ngram1")
    try:
        outs = llm.generate(prompts(), SamplingParams(max_tokens=N_NEW, ignore_eos=True), use_tqdm=False)
        assert [o.token_ids for o in outs] == plain_refs[tiny_llama]
        assert llm.scheduler.feature("speculative").stats.accepted_tokens > 0
    finally:
        llm.shutdown()


@pytest.fixture(scope="module")
def small_vocab_llama(tmp_path_factory):
    """A tiny Llama over 64 tokens: sampling with top-k sorts the vocabulary, 49,152 tokens a row otherwise."""
    from tiny_models import save_tiny_model

    return save_tiny_model("llama", tmp_path_factory.mktemp("tiny-llama-v64"), tokenizer=False, vocab_size=64)


def test_sampled_engine_follows_the_plain_distribution(small_vocab_llama):
    """Chi-square, 600 seeds, significance 0.001: the second output token of a sampled request (top-k 3)
    whose draft is fixed follows the plain engine's distribution, computed exactly from its logprobs
    (the first token is plain: a prefill). Requests with logprobs never draft: one engine does both."""
    prompt = [7, 30, 40, 21, 9]
    draft: list[int] = []

    class Fixed(Drafter):
        def propose(self, req, k):
            return draft if len(req.output_ids) == 1 else []

    path = str(small_vocab_llama)
    with DRAFTERS.registered("test-fixed", Fixed):
        llm = LLM(path, dtype="float32", speculative_algorithm="test-fixed", speculative_num_draft_tokens=1)
    top = SamplingParams(max_tokens=1, top_logprobs=3)

    def dist(ids):
        lp = llm.generate([ids], top, use_tqdm=False)[0].top_logprobs[0]
        p = torch.tensor([x for _, x in lp], dtype=torch.float64).exp()
        return dict(zip([t for t, _ in lp], (p / p.sum()).tolist()))

    marginal: dict[int, float] = {}
    for t0, q in dist(prompt).items():
        for t1, r in dist(prompt + [t0]).items():
            marginal[t1] = marginal.get(t1, 0.0) + q * r
    draft.append(max(marginal, key=marginal.get))
    n = 600
    params = [SamplingParams(max_tokens=3, temperature=1.0, top_k=3, seed=s, ignore_eos=True) for s in range(n)]
    outs = llm.generate([prompt] * n, params, use_tqdm=False)
    st = llm.scheduler.feature("speculative").stats
    assert 0 < st.accepted_tokens < st.draft_tokens == n, f"the draft should be accepted sometimes: {st}"
    seen: dict[int, int] = {}
    for o in outs:
        seen[o.token_ids[1]] = seen.get(o.token_ids[1], 0) + 1
    assert set(seen) <= set(marginal), f"tokens {set(seen) - set(marginal)} are outside every top-3"
    stat = sum((seen.get(t, 0) - n * p) ** 2 / (n * p) for t, p in marginal.items())
    bound = chi2_bound(len(marginal) - 1)
    assert stat < bound, f"chi-square {stat:.1f} >= {bound:.1f}: seen {seen}, expected {marginal}"


# ---- config, seams, server -------------------------------------------------------------------------------
def test_config_and_registries():
    from minisgl.engine.config import EngineConfig

    assert "ngram" in DRAFTERS and "default" in VERIFIERS
    with pytest.raises(ValueError, match="unknown drafter 'eagle'"):
        DRAFTERS.get("EAGLE".lower())  # what the scheduler does with --speculative-algorithm EAGLE
    with pytest.raises(ValueError, match="speculative_num_draft_tokens"):
        EngineConfig(device="cpu", speculative_algorithm="NGRAM", speculative_num_draft_tokens=0)


def test_server_flags_stats_and_metrics(capsys):
    from prometheus_client import generate_latest

    from minisgl.server.args import parse_args
    from minisgl.server.ops.metrics import ServerMetrics
    from minisgl.speculative.feature import SpecStats, spec_stats

    args = parse_args(["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "3"])
    assert args.engine["speculative_algorithm"] == "NGRAM" and args.engine["speculative_num_draft_tokens"] == 3
    assert parse_args(["--speculative-algorithm", "none"]).engine["speculative_algorithm"] is None
    with pytest.raises(SystemExit):
        parse_args(["--speculative-algorithm", "EAGLE"])
    assert "--speculative-algorithm" in capsys.readouterr().err

    class Spec:  # what /stats reads from the scheduler's SpecManager
        algorithm, k, stats = "NGRAM", 4, SpecStats(verify_rows=10, draft_tokens=40, accepted_tokens=30)

    part = spec_stats(Spec())
    assert part["accept_rate"] == 0.75 and part["accept_length"] == 4.0  # (30 + 10) / 10, the bonus counted
    assert spec_stats(None)["accept_rate"] == 0.0
    kv = dict(total_slots=8, free_slots=8, evictable_slots=0, usage=0.0)
    m = ServerMetrics(lambda: "m")
    m.set_gauges(dict(running_requests=0, waiting_requests=0, kv=kv, cache=dict(hit_rate=0.0), speculative=part))
    text = generate_latest(m.registry).decode()
    assert 'sglang:spec_accept_rate{model_name="m"} 0.75' in text
    assert 'sglang:spec_accept_length{model_name="m"} 4.0' in text
