"""Draft-model drafting (``--speculative-algorithm STANDALONE``, minisgl/speculative/draft_model.py) on the tiny
random models in float32: the target drafting for itself has every draft accepted; another model, and the
target's first layer alone, give exactly the plain engine's tokens; the draft model's own KV cache follows the
accepted tokens (rejected drafts' positions are recomputed) and leaves nothing behind after finish, abort,
retraction and a batch of requests."""

from __future__ import annotations

import random

import pytest
import torch

from minisgl import LLM, SamplingParams
from minisgl.speculative import DRAFTERS
from minisgl.speculative.draft_model import DraftModelDrafter

N_NEW = 20


def prompts() -> list[list[int]]:
    rng = random.Random(5)
    r = lambda n: [rng.randrange(3, 49152) for _ in range(n)]
    base = r(20)
    return [base + r(5), base + r(3), r(7), r(3) * 5, r(11), [5] * 12]


@pytest.fixture(scope="module")
def plain(tiny_llama, tiny_qwen3):
    out = {}
    for path in (tiny_llama, tiny_qwen3):
        llm = LLM(str(path), dtype="float32")
        outs = llm.generate(prompts(), SamplingParams(max_tokens=N_NEW, ignore_eos=True), use_tqdm=False)
        out[path] = [o.token_ids for o in outs]
    return out


@pytest.fixture(scope="module")
def other_llama(tmp_path_factory):
    """Another random Llama with the tiny models' vocabulary: one layer, other weights."""
    from tiny_models import save_tiny_model

    path = tmp_path_factory.mktemp("tiny-draft")
    return save_tiny_model("llama", path, tokenizer=False, seed=99, num_hidden_layers=1)


def spec_llm(target, draft, **kw) -> LLM:
    return LLM(
        str(target), dtype="float32", debug_checks=True, speculative_algorithm="STANDALONE",
        speculative_draft_model_path=str(draft), **kw,
    )  # fmt: skip


def run(llm: LLM) -> list[list[int]]:
    outs = llm.generate(prompts(), SamplingParams(max_tokens=N_NEW, ignore_eos=True), use_tqdm=False)
    return [o.token_ids for o in outs]


@pytest.mark.parametrize("model", ["llama", "qwen3"])
def test_target_as_its_own_draft_accepts_everything(model, tiny_llama, tiny_qwen3, plain):
    path = tiny_llama if model == "llama" else tiny_qwen3
    llm = spec_llm(path, path)
    assert run(llm) == plain[path], "self-drafting changed the tokens"
    st = llm.scheduler.feature("speculative").stats
    assert st.draft_tokens > 0 and st.accepted_tokens == st.draft_tokens, f"the target's own drafts: {st}"
    assert st.accept_length > 4, "k = 4 drafts, all accepted, plus the bonus (shorter near max_tokens)"
    assert not llm.scheduler.feature("speculative").drafter.state, "draft KV left behind"


@pytest.mark.parametrize("path", ["plain-loop", "overlap-page4-chunk8"])
def test_other_draft_model_gives_the_plain_tokens(path, tiny_llama, other_llama, plain):
    kw = dict(page_size=4, components={"loop": "overlap"}, max_prefill_length=8) if path != "plain-loop" else {}
    llm = spec_llm(tiny_llama, other_llama, speculative_backoff=0, **kw)  # drafts at every step
    assert run(llm) == plain[tiny_llama]
    st = llm.scheduler.feature("speculative").stats
    assert st.draft_tokens > 0 and st.accepted_tokens < st.draft_tokens, f"another model should miss: {st}"
    assert not llm.scheduler.feature("speculative").drafter.state


class FirstLayer(DraftModelDrafter):
    """The target's first layer (and its final norm and LM head) drafting for it: right only sometimes."""

    num_layers = 1


def test_partial_acceptance_keeps_the_draft_cache_right(tiny_llama, plain):
    """After every propose the cache must equal a fresh drafter's over the same tokens (rejected drafts' KV
    recomputed), and the drafts the same."""
    checked = []

    class Checked(FirstLayer):
        def propose(self, req, k):
            drafts = super().propose(req, k)
            fresh = FirstLayer(self.model, self.device)
            assert fresh.propose(req, k) == drafts, "a fresh drafter drafts otherwise: the cache went stale"
            mine, theirs = self.state[req], fresh.state[req]
            assert mine.tokens == theirs.tokens
            n = len(mine.tokens)
            for a, b in zip(mine.k + mine.v, theirs.k + theirs.v):
                torch.testing.assert_close(a[:n], b[:n], rtol=1e-4, atol=1e-5)
            checked.append(n)
            return drafts

    with DRAFTERS.registered("test-first-layer", Checked):
        llm = LLM(
            str(tiny_llama), dtype="float32", debug_checks=True, speculative_algorithm="test-first-layer",
            speculative_draft_model_path=str(tiny_llama), speculative_backoff=0,
        )  # fmt: skip
    assert run(llm) == plain[tiny_llama]
    st = llm.scheduler.feature("speculative").stats
    assert 0 < st.accepted_tokens < st.draft_tokens, f"the first layer should be partly right: {st}"
    assert checked


def test_abort_retraction_and_batch_leave_no_state(tiny_llama, plain):
    """A pool of 96 pages makes this run retract (checked); after every step only running requests hold
    draft KV."""
    llm = spec_llm(tiny_llama, tiny_llama, num_pages=96)
    sched, ps, refs = llm.scheduler, prompts(), plain[tiny_llama]
    drafter = sched.feature("speculative").drafter
    most = 0

    def step():
        nonlocal most
        sched.step()
        assert set(drafter.state) <= set(sched.decode.running), "a request that left kept its draft KV"
        most = max(most, len(drafter.state))

    params = SamplingParams(max_tokens=N_NEW, ignore_eos=True)
    reqs = [sched.add_request(i, p, params) for i, p in enumerate(ps)]
    victim = reqs[1]
    while victim not in drafter.state:
        step()
    assert sched.abort(victim.uid) and victim not in drafter.state, "abort left the draft KV"
    while sched.has_work:
        step()
    assert sched.stats.retracted > 0, "the pool should be small enough to retract"
    assert most > 1, "requests in a batch should hold draft KV at once"
    for i, (r, ref) in enumerate(zip(reqs, refs)):
        want = ref if r is not victim else ref[: len(r.output_ids)]
        assert r.output_ids == want, f"request {i}: tokens differ from plain decoding"
    assert not drafter.state and not sched.feature("speculative").backoff.state


def test_config_errors(tiny_llama, tmp_path_factory):
    from tiny_models import save_tiny_model

    with pytest.raises(ValueError, match="speculative_draft_model_path"):
        LLM(str(tiny_llama), dtype="float32", speculative_algorithm="STANDALONE")
    small_vocab = save_tiny_model("llama", tmp_path_factory.mktemp("v64"), tokenizer=False, vocab_size=64)
    with pytest.raises(ValueError, match="vocabulary"):
        spec_llm(tiny_llama, small_vocab)
