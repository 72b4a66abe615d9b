"""The OpenAI-compatible server on the embedded model, through the official ``openai`` client:
greedy output equals the offline API's, streaming equals non-streaming, sampling fields work,
and a table of malformed requests each gets the right 4xx with an OpenAI error body."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from server_utils import ServerProcess, wait_idle

from minisgl import LLM, SamplingParams

API_KEY = "sk-test-key"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
MAX_TOKENS = 24
MODEL = "SmolLM2-135M-Instruct"  # the embedded model, as /v1/models names it


@pytest.fixture(scope="module")
def started(tmp_path_factory):
    s = ServerProcess([], tmp_path_factory.mktemp("server-embedded"), api_key=API_KEY)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def llm(started):
    return LLM()  # the offline reference; loads while the server starts


@pytest.fixture(scope="module")
def server(started, llm):
    started.wait_ready()
    return started


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def offline_answer(llm):
    (out,) = llm.chat(QUESTION, SamplingParams(max_tokens=MAX_TOKENS))
    return out


def test_models_and_health(server, client):
    assert httpx.get(f"{server.url}/health").status_code == 200  # no API key needed
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


def test_chat_greedy_equals_offline(client, offline_answer):
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=MAX_TOKENS, temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.model == MODEL
    (choice,) = r.choices
    assert choice.index == 0 and choice.message.role == "assistant"
    assert choice.message.content == offline_answer.text
    assert choice.finish_reason == offline_answer.finish_reason
    assert r.usage.prompt_tokens == len(offline_answer.prompt_token_ids)
    assert r.usage.completion_tokens == len(offline_answer.token_ids)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_stream_equals_non_stream(client, offline_answer):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        max_completion_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text == offline_answer.text
    assert reasons == [offline_answer.finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(offline_answer.token_ids)


def test_text_parts_and_system_message(client, llm):
    msgs = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "Name a color."}]},
    ]
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, temperature=0)
    (ref,) = llm.chat(
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a color."}],
        SamplingParams(max_tokens=8),
    )
    assert r.choices[0].message.content == ref.text


def test_async_completions_text_and_token_prompts(server, llm):
    prompts = ["The capital of France is", "1, 2, 3, 4,"]
    refs = llm.generate(prompts, SamplingParams(max_tokens=10), use_tqdm=False)
    ids = refs[0].prompt_token_ids

    async def main():
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
        batch = await client.completions.create(model=MODEL, prompt=prompts, max_tokens=10, temperature=0)
        by_ids = await client.completions.create(model=MODEL, prompt=ids, max_tokens=10, temperature=0)
        stream = await client.completions.create(
            model=MODEL, prompt=prompts[1], max_tokens=10, temperature=0, stream=True
        )
        streamed = [c async for c in stream]
        await client.close()
        return batch, by_ids, streamed

    batch, by_ids, streamed = asyncio.run(main())
    assert batch.object == "text_completion"
    assert [c.text for c in sorted(batch.choices, key=lambda c: c.index)] == [r.text for r in refs]
    assert batch.usage.prompt_tokens == sum(len(r.prompt_token_ids) for r in refs)
    assert by_ids.choices[0].text == refs[0].text
    assert "".join(c.choices[0].text for c in streamed) == refs[1].text
    assert streamed[-1].choices[0].finish_reason == refs[1].finish_reason


def test_native_generate_returns_the_offline_tokens(server, llm):
    (ref,) = llm.generate([[1, 504, 3458, 282]], SamplingParams(max_tokens=12, ignore_eos=True), use_tqdm=False)
    body = {"input_ids": [1, 504, 3458, 282], "sampling_params": {"max_new_tokens": 12, "ignore_eos": True}}
    r = httpx.post(f"{server.url}/generate", json=body, headers=server.headers, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["output_ids"] == ref.token_ids and out["text"] == ref.text
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 12}  # SGLang's object
    assert out["meta_info"]["completion_tokens"] == 12
    with httpx.stream("POST", f"{server.url}/generate", json=body | {"stream": True}, headers=server.headers) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    parts = [json.loads(e) for e in events[:-1]]  # SGLang's: each chunk holds all so far
    assert parts[-1]["output_ids"] == ref.token_ids and parts[-1]["text"] == ref.text
    assert all(ref.text.startswith(p["text"]) for p in parts) and len(parts) > 1


def test_stop_strings_cut_the_text(client, offline_answer):
    text = offline_answer.text
    assert len(text) > 10, text
    stop = text[6:9]  # somewhere in the middle of the greedy answer
    expect = text[: text.index(stop)]
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=MAX_TOKENS, temperature=0, stop=stop)
    assert r.choices[0].message.content == expect and r.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=MAX_TOKENS, temperature=0, stop=["zzzz", stop], stream=True
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expect
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_seeded_sampling_repeats_and_default_temperature_is_one(client):
    ask = lambda **kw: client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12, **kw)
    a = ask(seed=11)  # temperature omitted: OpenAI's default, 1.0
    b = ask(seed=11, temperature=1.0)
    assert a.choices[0].message.content == b.choices[0].message.content
    n = ask(seed=5, temperature=1.0, n=3)
    assert sorted(c.index for c in n.choices) == [0, 1, 2]
    again = ask(seed=5, temperature=1.0, n=3)
    texts = lambda r: [c.message.content for c in sorted(r.choices, key=lambda c: c.index)]
    assert texts(n) == texts(again)
    assert n.usage.prompt_tokens == a.usage.prompt_tokens  # the prompt is counted once for n choices
    assert 3 <= n.usage.completion_tokens <= 3 * 12


def test_stats_after_requests(server):
    s = wait_idle(server)
    assert s["finished_requests"] > 0 and s["cache"]["prompt_tokens"] > 0
    assert 0.0 <= s["cache"]["hit_rate"] <= 1.0
    assert set(s["server"]["processes"]) >= {"api_server", "scheduler", "tokenizer", "detokenizer"}


def test_a_long_prompt_does_not_hold_up_short_ones(server):
    """The freeze: an idle server once prefilled a long prompt in one step, requests arriving behind it
    waited for all of it, and /health called the server hung. With steps bounded in time (--step-time,
    0.5 s on a CPU by default) the short ones start beside its next chunk and finish before its first
    token, and /health answers 200 all along. (An order, not a time: it holds on a loaded machine.)"""
    import random
    import threading
    import time

    headers = {"Authorization": f"Bearer {API_KEY}"}
    done: list[str] = []

    def generate(name: str, ids: list[int], n: int) -> None:
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "ignore_eos": True}}
        r = httpx.post(f"{server.url}/generate", json=body, headers=headers, timeout=600)
        done.append(name if r.status_code == 200 else f"{name}: {r.status_code} {r.text[:200]}")

    rng = random.Random(5)
    threads = [threading.Thread(target=generate, args=("long", [rng.randrange(3, 10000) for _ in range(2000)], 1))]
    threads[0].start()
    time.sleep(0.5)  # the long prompt's first chunk is running
    for i in range(3):
        threads.append(threading.Thread(target=generate, args=(f"short{i}", [rng.randrange(3, 10000)] * 8, 2)))
        threads[-1].start()
    health = []
    while threads[0].is_alive():
        health.append(httpx.get(f"{server.url}/health", timeout=30).status_code)
        time.sleep(0.2)
    for t in threads:
        t.join()
    assert done[-1] == "long" and sorted(done[:-1]) == ["short0", "short1", "short2"], done
    assert set(health) == {200}, health


# ---- bad input: (name, method, path, body or raw bytes, headers override, status) ---------------
LONG = [100] * 9000  # the embedded model's context is 8192 tokens
OK_CHAT = {"messages": QUESTION, "max_tokens": 4}
BAD = [
    ("invalid json", "POST", "/v1/chat/completions", b'{"messages": [', None, 400),
    ("body is a list", "POST", "/v1/chat/completions", [1, 2], None, 400),
    ("no body", "POST", "/v1/chat/completions", b"", None, 400),
    ("missing messages", "POST", "/v1/chat/completions", {"max_tokens": 4}, None, 400),
    ("empty messages", "POST", "/v1/chat/completions", {"messages": []}, None, 400),
    ("unknown role", "POST", "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, None, 400),
    ("content not text", "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, None, 400),
    (
        "image part",
        "POST",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        None,
        400,
    ),
    ("negative max_tokens", "POST", "/v1/chat/completions", OK_CHAT | {"max_tokens": -1}, None, 400),
    ("zero max_tokens", "POST", "/v1/chat/completions", OK_CHAT | {"max_tokens": 0}, None, 400),
    ("string max_tokens", "POST", "/v1/chat/completions", OK_CHAT | {"max_tokens": "10"}, None, 400),
    ("huge max_tokens", "POST", "/v1/chat/completions", OK_CHAT | {"max_tokens": 10**12}, None, 400),
    ("temperature < 0", "POST", "/v1/chat/completions", OK_CHAT | {"temperature": -0.1}, None, 400),
    ("temperature string", "POST", "/v1/chat/completions", OK_CHAT | {"temperature": "hot"}, None, 400),
    ("top_p > 1", "POST", "/v1/chat/completions", OK_CHAT | {"top_p": 1.5}, None, 400),
    ("top_p = 0", "POST", "/v1/chat/completions", OK_CHAT | {"top_p": 0}, None, 400),
    ("n = 0", "POST", "/v1/chat/completions", OK_CHAT | {"n": 0}, None, 400),
    ("n too large", "POST", "/v1/chat/completions", OK_CHAT | {"n": 1000}, None, 400),
    ("stream not a bool", "POST", "/v1/chat/completions", OK_CHAT | {"stream": "yes"}, None, 400),
    ("five stop strings", "POST", "/v1/chat/completions", OK_CHAT | {"stop": list("abcde")}, None, 400),
    ("negative seed", "POST", "/v1/chat/completions", OK_CHAT | {"seed": -1}, None, 400),
    ("a penalty", "POST", "/v1/chat/completions", OK_CHAT | {"presence_penalty": 0.5}, None, 400),
    ("top_logprobs > 20", "POST", "/v1/chat/completions", OK_CHAT | {"logprobs": True, "top_logprobs": 21}, None, 400),
    ("missing prompt", "POST", "/v1/completions", {"max_tokens": 4}, None, 400),
    ("empty prompt", "POST", "/v1/completions", {"prompt": [], "max_tokens": 4}, None, 400),
    ("prompt of mixed types", "POST", "/v1/completions", {"prompt": [1, "a"], "max_tokens": 4}, None, 400),
    ("token id out of vocab", "POST", "/v1/completions", {"prompt": [10**9], "max_tokens": 4}, None, 400),
    ("prompt beyond context", "POST", "/v1/completions", {"prompt": LONG, "max_tokens": 4}, None, 400),
    ("beyond context, streamed", "POST", "/v1/completions", {"prompt": LONG, "stream": True}, None, 400),
    ("generate: text and ids", "POST", "/generate", {"text": "a", "input_ids": [1]}, None, 400),
    ("generate: unknown param", "POST", "/generate", {"text": "a", "sampling_params": {"tempo": 1}}, None, 400),
    ("wrong api key", "POST", "/v1/chat/completions", OK_CHAT, {"Authorization": "Bearer nope"}, 401),
    ("no api key", "GET", "/v1/models", None, {}, 401),
    ("unknown route", "POST", "/v1/nothing", OK_CHAT, None, 404),
    ("unknown model", "GET", "/v1/models/gpt-9", None, None, 404),
    ("wrong method", "GET", "/v1/chat/completions", None, None, 405),
    ("oversized body", "POST", "/v1/completions", b"x" * (9 << 20), None, 413),
]


def test_bad_requests_get_openai_errors(server, client):
    failures = []
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for name, method, path, body, headers, status in BAD:
            h = dict(server.headers) if headers is None else dict(headers)
            if isinstance(body, bytes):
                h["Content-Type"] = "application/json"
                r = http.request(method, path, content=body, headers=h)
            else:
                r = http.request(method, path, json=body, headers=h)
            try:
                err = r.json()["error"]
                ok = (
                    r.status_code == status
                    and set(err) == {"message", "type", "param", "code"}
                    and isinstance(err["message"], str)
                    and err["message"]
                )
            except (ValueError, KeyError, TypeError):
                ok = False
            if not ok:
                failures.append(
                    f"{name}: expected {status} with an OpenAI error body, got {r.status_code} {r.text[:200]}"
                )
    assert not failures, "\n".join(failures)
    # the error names the problem
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": LONG}, headers=server.headers, timeout=60)
    assert r.json()["error"]["code"] == "context_length_exceeded" and "8192" in r.json()["error"]["message"]
    r = httpx.post(f"{server.url}/v1/chat/completions", json=OK_CHAT | {"top_p": 1.5}, headers=server.headers)
    assert r.json()["error"]["param"] == "top_p"
    # the openai client maps them to its exceptions
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[], max_tokens=4)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="bad", max_retries=0).models.list()
    # ... and the server still works, with nothing left behind
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4, temperature=0)
    assert r.choices[0].message.content
    s = wait_idle(server)
    assert s["rejected_requests"] >= 3
