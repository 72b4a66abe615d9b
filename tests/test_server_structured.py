"""Structured output and logprobs through the server, on the embedded model: OpenAI's
``response_format`` and ``logprobs`` / ``top_logprobs`` through the official ``openai`` client
(streamed too), completions with ``echo`` the way ``lm-eval``'s loglikelihood asks and reads them,
SGLang's ``/generate`` fields, ``n > 1`` and stop strings with a grammar, a client that leaves in the
middle, and the 400s (a grammar that does not compile names the problem; one over the limits of
``minisgl/grammar/limits.py`` is refused at once, a typo even while other compiles run, and a compile
whose clients left stops)."""

from __future__ import annotations

import json
import re
import time

import httpx
import jsonschema
import openai
import psutil
import pytest
from server_utils import ServerProcess, wait_idle, wait_until

from minisgl.tokenizer import apply_chat_template

MODEL = "SmolLM2-135M-Instruct"
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 2},
    },
    "required": ["name", "age"],
}
ASK = [{"role": "user", "content": "Describe a person as JSON."}]
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def started(tmp_path_factory):
    # a fixed prefill budget: with steps bounded in time (the CPU default) a loaded machine chunks a prompt
    # differently from one request to the next, and bf16 logprobs of a chunked prefill differ in the 3rd digit
    s = ServerProcess(["--max-prefill-length", "none"], tmp_path_factory.mktemp("server-structured"))
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def tok(started):
    from minisgl.models.embedded import embedded_model_path
    from minisgl.tokenizer import load_tokenizer

    return load_tokenizer(embedded_model_path())


@pytest.fixture(scope="module")
def server(started):
    started.wait_ready()
    return started


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)


def post(server, route: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{route}", json=body, timeout=120)


def schema(s: dict) -> dict:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": s}}}


def test_response_format_json_schema_and_json_object(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    r = client.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=80, response_format=fmt)
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    tiny = [{"role": "user", "content": 'Return {"ok": true} as JSON.'}]
    r = client.chat.completions.create(
        model=MODEL, messages=tiny, temperature=0, max_tokens=60, response_format={"type": "json_object"}
    )
    assert r.choices[0].finish_reason == "stop" and isinstance(json.loads(r.choices[0].message.content), dict)


def test_chat_logprobs_match_generate_and_stream_the_same(server, client, tok):
    kw = dict(model=MODEL, messages=ASK, temperature=0, max_tokens=12, logprobs=True, top_logprobs=3)
    r = client.chat.completions.create(**kw)
    content = r.choices[0].logprobs.content
    assert "".join(c.token for c in content) == r.choices[0].message.content
    for c in content:  # greedy: the chosen token is the most likely one
        assert len(c.top_logprobs) == 3 and c.top_logprobs[0].token == c.token
        assert c.top_logprobs[0].logprob == c.logprob and bytes(c.bytes).decode() == c.token
    # the same numbers as /generate's for the same tokens (both find the prompt cached by the test before:
    # a cached prefill rounds differently in bf16)
    ids = apply_chat_template(tok, ASK)
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 12}, "return_logprob": True}
    ref = post(server, "/generate", body).json()["meta_info"]["output_token_logprobs"]
    assert [c.logprob for c in content] == pytest.approx([lp for lp, _, _ in ref], abs=1e-3)
    chunks = list(client.chat.completions.create(**kw, stream=True))
    streamed = [c for ch in chunks for choice in ch.choices if choice.logprobs for c in choice.logprobs.content]
    assert [(c.token, c.logprob) for c in streamed] == [(c.token, c.logprob) for c in content]


def test_completions_logprobs_and_echo_of_a_text_prompt(client):
    r = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0, logprobs=2
    )
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text and len(lp.token_logprobs) == 4
    assert all(len(t) <= 2 and max(t.values()) == v for t, v in zip(lp.top_logprobs, lp.token_logprobs))
    e = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0, logprobs=2, echo=True
    )
    assert e.choices[0].text == "The capital of France is" + r.choices[0].text
    elp = e.choices[0].logprobs
    assert elp.token_logprobs[0] is None and elp.top_logprobs[0] is None
    assert elp.tokens[-4:] == lp.tokens and elp.token_logprobs[-4:] == pytest.approx(lp.token_logprobs, abs=1e-3)
    assert elp.text_offset[:2] == [0, len(elp.tokens[0])]


def test_streamed_completion_logprobs_equal_the_whole_answer(client):
    kw = dict(model=MODEL, prompt="The capital of France is", max_tokens=5, temperature=0, logprobs=2, echo=True)
    whole = client.completions.create(**kw).choices[0]
    chunks = [c.choices[0] for c in client.completions.create(**kw, stream=True) if c.choices]
    assert "".join(c.text for c in chunks) == whole.text
    tokens = [t for c in chunks if c.logprobs for t in c.logprobs.tokens]
    lps = [v for c in chunks if c.logprobs for v in c.logprobs.token_logprobs]
    assert tokens == whole.logprobs.tokens and lps == whole.logprobs.token_logprobs
    assert [o for c in chunks if c.logprobs for o in c.logprobs.text_offset] == whole.logprobs.text_offset


def lm_eval_parse(choice: dict, ctxlen: int) -> tuple[float, bool]:
    """What lm-eval's local-completions does with a choice (its parse_logprobs): the continuation is
    ``tokens[ctxlen:-1]`` (the last entry is the one generated token)."""
    lps = choice["logprobs"]["token_logprobs"][ctxlen:-1]
    tops = choice["logprobs"]["top_logprobs"][ctxlen:-1]
    return sum(lps), all(lp == max(top.values()) for lp, top in zip(lps, tops))


def test_lm_eval_loglikelihood_requests(server, tok):
    """lm-eval's payload: token-id prompts (context + continuation) in one request, echo, logprobs=1,
    max_tokens=1, temperature 0. The greedy continuation is greedy; a changed one is not; the
    loglikelihood is what /generate scores for the same prompt."""
    ctx = tok.encode("The capital of France is")
    cont = post(server, "/generate", {"input_ids": ctx, "sampling_params": {"max_new_tokens": 3}}).json()["output_ids"]
    other = [ctx + cont[:1] + [13]]
    body = dict(model=MODEL, prompt=[ctx + cont, *other], echo=True, logprobs=1, max_tokens=1, temperature=0)
    out = post(server, "/v1/completions", body).json()
    choices = sorted(out["choices"], key=lambda c: c["index"])
    ll, is_greedy = lm_eval_parse(choices[0], len(ctx))
    assert is_greedy and not lm_eval_parse(choices[1], len(ctx))[1]
    # the reference scores the whole prompt too (a cached prefix would round differently in bf16)
    gen = {"input_ids": ctx + cont, "sampling_params": {"max_new_tokens": 1}, "return_logprob": True}
    ref = post(server, "/generate", gen | {"logprob_start_len": 0}).json()["meta_info"]["input_token_logprobs"]
    assert ll == pytest.approx(sum(lp for lp, _, _ in ref[len(ctx) :]), abs=1e-3)
    assert len(choices[0]["logprobs"]["tokens"]) == len(ctx) + 3 + 1
    # max_tokens 0 (older lm-eval, and OpenAI's legacy scoring): the prompt alone, nothing generated
    body.update(max_tokens=0, prompt=ctx + cont)
    zero = post(server, "/v1/completions", body).json()
    c = zero["choices"][0]
    assert len(c["logprobs"]["token_logprobs"]) == len(ctx) + 3 and zero["usage"]["completion_tokens"] == 0
    assert c["text"] == tok.decode(ctx + cont) and c["finish_reason"] == "length"


def test_native_generate_regex_and_sglang_logprob_fields(server):
    body = {
        "text": "My phone number is ",
        "sampling_params": {"max_new_tokens": 20, "regex": r"\d{3}-\d{4}"},
        "return_logprob": True,
        "top_logprobs_num": 2,
        "logprob_start_len": 0,
        "return_text_in_logprobs": True,
    }
    out = post(server, "/generate", body).json()
    assert re.fullmatch(r"\d{3}-\d{4}", out["text"]), out["text"]
    meta = out["meta_info"]
    assert [t for _, t, _ in meta["output_token_logprobs"]] == out["output_ids"]
    assert meta["input_token_logprobs"][0][0] is None and len(meta["input_token_logprobs"]) == meta["prompt_tokens"]
    assert all(len(top) <= 2 for top in meta["output_top_logprobs"]) and meta["input_top_logprobs"][0] is None
    # the tokens' texts: the answer, then the EOS token that ended it (the answer's text leaves it out)
    assert "".join(text for _, _, text in meta["output_token_logprobs"]) == out["text"] + "<|im_end|>"


def test_n_choices_and_stop_strings_with_a_grammar(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    r = client.chat.completions.create(
        model=MODEL, messages=ASK, temperature=0.8, seed=5, n=2, max_tokens=80, response_format=fmt
    )
    for c in r.choices:
        jsonschema.validate(json.loads(c.message.content), PERSON)
    r = client.completions.create(
        model=MODEL, prompt="Call ", max_tokens=20, temperature=0, stop=["-"], extra_body={"regex": r"\d{3}-\d{4}"}
    )
    assert re.fullmatch(r"\d{3}", r.choices[0].text) and r.choices[0].finish_reason == "stop"


def test_a_client_leaving_mid_grammar_frees_everything(server, client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    stream = client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=200, stream=True, response_format=fmt, temperature=0
    )
    next(iter(stream))
    stream.close()
    wait_idle(server)


@pytest.mark.parametrize(
    "route, body, param, words",
    [
        (
            "/v1/chat/completions",
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "strin"}}}},
            "json_schema",
            'Unsupported type "strin"',
        ),
        (
            "/v1/chat/completions",
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            None,
            "needs json_schema.schema",
        ),
        ("/v1/chat/completions", {"response_format": {"type": "json_object"}, "regex": "a+"}, None, "at most one"),
        ("/v1/chat/completions", {"top_logprobs": 2}, None, "needs logprobs: true"),
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs", ""),
        ("/v1/completions", {"max_tokens": 0}, None, "only with echo"),
        ("/v1/completions", {"logprobs": 21}, "logprobs", ""),
        ("/v1/completions", {"ebnf": "root ::= foo"}, "ebnf", 'Rule "foo" is not defined'),
        ("/generate", {"sampling_params": {"regex": "[a-"}}, "regex", "Unclosed '['"),
        # what would compile for minutes, or compile to something that ignores part of the schema
        ("/v1/chat/completions", schema({"const": "ab" * 500_000}), "json_schema", "the limit is 65,536 bytes"),
        ("/v1/chat/completions", schema({"not": {"type": "string"}}), "json_schema", "'not' is not supported"),
        ("/v1/completions", schema({"$ref": "http://example.com/s.json"}), "json_schema", "inside the schema"),
        ("/generate", {"sampling_params": {"json_schema": "[" * 5000 + "]" * 5000}}, "json_schema", "deeper than"),
    ],
)
def test_bad_constraints_and_logprob_fields_get_a_400(server, route, body, param, words):
    base = {"/v1/chat/completions": {"messages": ASK}, "/v1/completions": {"prompt": "Hi"}, "/generate": {"text": "Hi"}}
    r = post(server, route, base[route] | body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert words in err["message"]
    if param is not None:
        assert err["param"] is not None and param in err["param"]


def test_a_schema_nested_past_the_limit_gets_a_400(server):
    """950 levels: once a 500 (json.dumps ran out of stack); past the body parser's depth: its 400."""
    for depth in (65, 950):
        schema = '{"type": "array", "items": ' * depth + "{}" + "}" * depth
        body = '{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", '
        body += '"json_schema": {"name": "s", "schema": ' + schema + "}}}"
        r = httpx.post(f"{server.url}/v1/chat/completions", content=body, headers=JSON, timeout=60)
        assert r.status_code == 400 and "the limit is 64" in r.json()["error"]["message"], (depth, r.text[:300])


def test_abandoned_compiles_stop_and_a_bad_regex_is_refused_at_once(server):
    """Schemas that take a while to compile (a 16 KB const: ~0.3 s): one served, to time its compile; two
    more whose clients leave at once; then a regex with a typo. Its 400 comes in a fraction of a compile's
    time (checked before it waits for a compile lane, not behind the abandoned compiles), no compile
    process is left behind, and a regex is then served."""
    const = lambda i: schema({"const": f"{i}" + "ab" * 8_000})  # noqa: E731
    t = time.monotonic()
    r = post(server, "/v1/chat/completions", {"messages": ASK, "max_tokens": 1, **const("served")})
    compile_s = time.monotonic() - t
    assert r.status_code == 200, r.text
    for i in range(2):
        try:
            body = {"messages": ASK, "max_tokens": 4, "stream": True, **const(i)}
            with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=0.2) as r:
                r.read()
        except httpx.TimeoutException:
            pass
    t = time.monotonic()
    r = post(server, "/v1/chat/completions", {"messages": ASK, "regex": "[a-", "stream": True})
    assert r.status_code == 400 and "Unclosed '['" in r.json()["error"]["message"], r.text
    assert time.monotonic() - t < compile_s / 2, f"{time.monotonic() - t:.2f} s, a compile {compile_s:.2f} s"
    scheduler = psutil.Process(server.stats()["server"]["processes"]["scheduler"])
    assert wait_until(lambda: not scheduler.children(), 10), "a compile nobody waits for left its process"
    r = post(server, "/v1/chat/completions", {"messages": ASK, "regex": "[a-z]+", "max_tokens": 4})
    assert r.status_code == 200 and re.fullmatch("[a-z]+", r.json()["choices"][0]["message"]["content"]), r.text
