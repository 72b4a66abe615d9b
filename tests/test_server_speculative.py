"""Speculative decoding through the real server (``python -m minisgl --speculative-algorithm ...``, the tiny
Llama in float32): greedy answers through the ``openai`` client, streamed and not, and the native
``/generate``'s token ids equal the plain in-process engine's, with n-gram drafting (``NGRAM``) and with the
target drafting for itself (``STANDALONE``, every draft accepted); ``"speculative": false`` opts a request out
(no drafts counted for it); ``/stats`` and ``/metrics`` report the acceptance. (The flags' parsing and the
stats' formulas are unit-tested in test_speculative.py::test_server_flags_stats_and_metrics.)

The tiny random Llama never repeats itself, so its n-gram drafts (from the repetitive prompts) are all
rejected: the NGRAM server shows exactness with drafting, the STANDALONE one acceptance."""

from __future__ import annotations

import random
import threading

import httpx
import openai
import pytest
from server_utils import ServerProcess, wait_until

from minisgl import LLM, SamplingParams

N_NEW = 24


def prompts() -> list[list[int]]:
    """Repetitive token prompts (the n-gram drafter finds matches in them)."""
    rng = random.Random(1)
    unit = [rng.randrange(3, 49152) for _ in range(6)]
    return [[5] * 30, unit * 4 + unit[:2], [rng.randrange(3, 49152) for _ in range(3)] * 8]


SERVERS = {"NGRAM": [], "STANDALONE": ["--speculative-draft-model-path", "{model}"]}


@pytest.fixture(scope="module", params=list(SERVERS))
def server(request, tiny_llama, tmp_path_factory):
    extra = [a.format(model=tiny_llama) for a in SERVERS[request.param]]
    args = ["--model", str(tiny_llama), "--dtype", "float32", "--speculative-algorithm", request.param, *extra]
    s = ServerProcess(args, tmp_path_factory.mktemp("server-spec"))
    try:
        s.wait_ready()
        s.algorithm = request.param
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def plain(tiny_llama):
    """The plain engine's answers: token ids and text."""
    llm = LLM(str(tiny_llama), dtype="float32")
    return llm.generate(prompts(), SamplingParams(max_tokens=N_NEW, ignore_eos=True), use_tqdm=False)


def spec_counts(server: ServerProcess) -> tuple[int, int, int]:
    s = server.stats()["speculative"]
    return s["verify_rows"], s["draft_tokens"], s["accepted_tokens"]


def test_openai_and_native_answers_equal_plain(server, plain, tiny_llama):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    before = spec_counts(server)
    for prompt, ref in zip(prompts(), plain):
        kw = dict(model=tiny_llama.name, prompt=prompt, max_tokens=N_NEW, temperature=0)
        kw["extra_body"] = {"ignore_eos": True}
        r = client.completions.create(**kw)
        assert r.choices[0].text == ref.text, f"prompt {prompt[:6]}...: non-streamed answer differs from plain"
        assert r.usage.completion_tokens == N_NEW and r.choices[0].finish_reason == "length"
        streamed = "".join(c.choices[0].text for c in client.completions.create(**kw, stream=True) if c.choices)
        assert streamed == ref.text, f"prompt {prompt[:6]}...: streamed answer differs from plain"
        body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": N_NEW, "ignore_eos": True}}
        out = httpx.post(f"{server.url}/generate", json=body, timeout=60).json()
        assert out["output_ids"] == ref.token_ids, f"prompt {prompt[:6]}...: /generate's tokens differ from plain"
    rows, drafts, accepted = (a - b for a, b in zip(spec_counts(server), before))
    counts = (rows, drafts, accepted)
    assert rows > 0 and drafts > 0, f"the repetitive prompts should draft: {counts}"
    if server.algorithm == "STANDALONE":
        assert accepted == drafts, f"the target's own drafts are all accepted: {counts}"


def test_opt_out_drafts_nothing(server, plain, tiny_llama):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    before = spec_counts(server)
    prompt, ref = prompts()[0], plain[0]
    extra = {"ignore_eos": True, "speculative": False}
    kw = dict(model=tiny_llama.name, prompt=prompt, max_tokens=N_NEW, temperature=0)
    r = client.completions.create(**kw, extra_body=extra)
    assert r.choices[0].text == ref.text
    chat = client.chat.completions.create(
        model=tiny_llama.name, messages=[{"role": "user", "content": "one two one two one two"}], max_tokens=8,
        temperature=0, extra_body=extra,
    )  # fmt: skip
    assert chat.usage.completion_tokens == 8
    assert spec_counts(server) == before, "a request with speculative false was drafted for"
    # the same prompt, speculative: drafts (so the check above could fail)
    client.completions.create(**kw, extra_body={"ignore_eos": True})
    assert spec_counts(server)[1] > before[1]


@pytest.mark.parametrize("server", ["STANDALONE"], indirect=True)  # the tiny Llama accepts no n-gram draft
def test_stats_and_metrics_report_acceptance(server, plain):
    body = {"input_ids": prompts()[1], "sampling_params": {"max_new_tokens": N_NEW, "ignore_eos": True}}
    httpx.post(f"{server.url}/generate", json=body, timeout=60).raise_for_status()
    part = server.stats()["speculative"]
    assert part["algorithm"] == "STANDALONE" and part["num_draft_tokens"] == 4
    assert part["accept_rate"] == 1.0 and part["accept_length"] > 1, part
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    gauges = {}
    for line in text.splitlines():
        for name in ("sglang:spec_accept_rate", "sglang:spec_accept_length"):
            if line.startswith(name + "{"):
                gauges[name] = float(line.rsplit(" ", 1)[1])
    assert gauges["sglang:spec_accept_rate"] == pytest.approx(part["accept_rate"])
    assert gauges["sglang:spec_accept_length"] == pytest.approx(part["accept_length"])


def test_a_seeded_request_gets_its_tokens_beside_a_logprobs_request(server):
    """Speculation is decided per request: a seeded sampled request drafts beside a request that asks
    for logprobs (which never drafts) as it does alone, so its tokens are the same. The neighbour asks for
    1,000 tokens (the tiny model allows 1,024) so that it still runs when the 24-token request ends."""

    def generate(ids, logprobs=False, **sampling) -> dict:
        sampling = {"max_new_tokens": 1000 if logprobs else N_NEW, "ignore_eos": True, **sampling}
        body = {"input_ids": ids, "sampling_params": sampling, "return_logprob": logprobs}
        r = httpx.post(f"{server.url}/generate", json=body, headers=server.headers, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()

    seeded = dict(temperature=0.5, top_k=2, seed=7)
    alone = generate(prompts()[0], **seeded)["output_ids"]
    neighbour = threading.Thread(target=generate, args=([9, 8, 7, 6],), kwargs=dict(logprobs=True))
    neighbour.start()
    assert wait_until(lambda: server.stats()["running_requests"] == 1, 30)
    verified = spec_counts(server)[0]
    beside = generate(prompts()[0], **seeded)["output_ids"]
    running_after = server.stats()["running_requests"]
    neighbour.join()
    assert running_after == 1, "the logprobs request should still run beside it"
    assert beside == alone, "beside a logprobs request the seeded request's tokens changed"
    assert spec_counts(server)[0] > verified, "it did not draft beside the logprobs request"
