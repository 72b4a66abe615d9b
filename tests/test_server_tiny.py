"""The server on tiny random models: greedy parity with the offline API (Llama and Qwen3), 64
concurrent streams, and client disconnects that abort the request and free its memory."""

from __future__ import annotations

import asyncio
import random

import httpx
import openai
import pytest
from server_utils import ServerProcess, wait_idle, wait_until

from minisgl import LLM, SamplingParams


def start(model, tmp_path_factory, *extra: str) -> ServerProcess:
    s = ServerProcess(["--model", str(model), "--dtype", "float32", *extra], tmp_path_factory.mktemp("server-tiny"))
    try:
        s.wait_ready()
    except BaseException:
        s.stop()
        raise
    return s


@pytest.fixture(scope="module")
def server(tiny_llama, tmp_path_factory):
    s = start(tiny_llama, tmp_path_factory)
    yield s
    s.stop()


def check_parity(server: ServerProcess, model) -> None:
    prompts = [[5, 6, 7, 8, 9], [300, 200, 100] * 5, "Once upon a time"]
    sp = SamplingParams(max_tokens=12, ignore_eos=True)
    llm = LLM(str(model), dtype="float32")  # float32: the offline batch and the server's differ in shape
    refs = llm.generate(prompts, sp, use_tqdm=False)
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    for prompt, ref in zip(prompts, refs):
        r = client.completions.create(
            model=model.name, prompt=prompt, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
        )
        assert r.choices[0].text == ref.text, f"prompt {prompt!r}"
        assert r.usage.completion_tokens == 12 and r.choices[0].finish_reason == "length"
        body = {"sampling_params": {"max_new_tokens": 12, "ignore_eos": True}}
        body |= {"text": prompt} if isinstance(prompt, str) else {"input_ids": prompt}
        out = httpx.post(f"{server.url}/generate", json=body, timeout=60).json()
        assert out["output_ids"] == ref.token_ids, f"prompt {prompt!r}"


def test_greedy_equals_offline_llama(server, tiny_llama):
    check_parity(server, tiny_llama)


def test_greedy_equals_offline_qwen3(tiny_qwen3, tmp_path_factory):
    s = start(tiny_qwen3, tmp_path_factory, "--page-size", "4")
    try:
        check_parity(s, tiny_qwen3)
    finally:
        s.stop()


def test_64_concurrent_streams(server, tiny_llama):
    rng = random.Random(0)
    n, max_tokens = 64, 16

    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[int, str | None, int]:
        if i % 2:
            stream = await client.chat.completions.create(
                model=tiny_llama.name,  # the folder's base name names the served model
                messages=[{"role": "user", "content": f"request {i}: " + "word " * rng.randint(1, 30)}],
                max_tokens=max_tokens,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
        else:
            stream = await client.completions.create(
                model=tiny_llama.name,  # the folder's base name names the served model
                prompt=[rng.randrange(100, 5000) for _ in range(rng.randint(4, 64))],
                max_tokens=max_tokens,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
        reason, usage = None, 0
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].finish_reason:
                reason = chunk.choices[0].finish_reason
            if chunk.usage:
                usage = chunk.usage.completion_tokens
        return i, reason, usage

    async def main():
        async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120) as c:
            return await asyncio.gather(*(one(c, i) for i in range(n)))

    results = asyncio.run(main())
    assert sorted(i for i, _, _ in results) == list(range(n))
    assert all(reason == "length" and usage == max_tokens for _, reason, usage in results), results
    s = wait_idle(server)
    assert s["server"]["open_sequences"] == 0


LONG_BODY = {"prompt": [11, 12, 13], "max_tokens": 1000, "ignore_eos": True, "temperature": 0}


def test_stream_disconnect_aborts_and_frees(server):
    before = wait_idle(server)
    with httpx.stream("POST", f"{server.url}/v1/completions", json=LONG_BODY | {"stream": True}, timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        got = 0
        for line in lines:
            got += line.startswith("data: ")
            if got == 3:
                break  # leave after three tokens: closing the response drops the connection
    assert wait_until(lambda: server.stats()["aborted_requests"] == before["aborted_requests"] + 1, 10)
    after = wait_idle(server, timeout=10)
    assert after["finished_requests"] == before["finished_requests"], "the request ran to the end instead"
    assert after["server"]["open_sequences"] == 0


def test_non_stream_disconnect_aborts(server):
    before = wait_idle(server)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", json=LONG_BODY, timeout=0.5)
    assert wait_until(lambda: server.stats()["aborted_requests"] == before["aborted_requests"] + 1, 10)
    after = wait_idle(server, timeout=10)
    assert after["finished_requests"] == before["finished_requests"]
