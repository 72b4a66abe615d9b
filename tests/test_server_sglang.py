"""SGLang's routes and flags: one server on the tiny Llama started with SGLang's spellings, checking
that each flag took effect and every route answers in SGLang's shape; and the flag translation and
its refusals, parsed without a server."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import httpx
import pytest
from server_utils import ServerProcess, wait_idle, wait_until

from minisgl.server.args import build_parser, parse_args

API_KEY = "sglang-test-key"
CONTEXT = 512  # --context-length: below the tiny model's 1024 positions, so the flag is what limits
POOL = 3000  # --max-total-tokens: page size 1 on a CPU, so exactly this many slots
SGLANG_FLAGS = [
    *("--served-model-name", "foo", "--context-length", str(CONTEXT), "--chunked-prefill-size", "64"),
    *("--trust-remote-code", "--max-total-tokens", str(POOL), "--random-seed", "7", "--dtype", "float"),
    *("--attention-backend", "torch_native", "--tp", "1"),
    # the common launch flags: accepted, with their meaning (or a logged no-op where ours already is it)
    *("--enable-metrics", "--disable-overlap-schedule", "--max-prefill-tokens", "1000", "--schedule-policy", "fcfs"),
    *("--grammar-backend", "xgrammar", "--log-requests"),
]
# --chat-template: a file of our own, used instead of the model's
TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}<assistant>"


@pytest.fixture(scope="module")
def server(tiny_llama, tmp_path_factory):
    logs = tmp_path_factory.mktemp("server-sglang")
    (logs / "template.jinja").write_text(TEMPLATE)
    s = ServerProcess(
        [
            "--model-path",
            str(tiny_llama),
            *SGLANG_FLAGS,
            "--page-size",
            "1",
            "--chat-template",
            str(logs / "template.jinja"),
        ],
        logs,
        api_key=API_KEY,
    )
    try:
        s.wait_ready()
    except BaseException:
        s.stop()
        raise
    yield s
    s.stop()


def get(server: ServerProcess, path: str) -> httpx.Response:
    return httpx.get(server.url + path, headers=server.headers, timeout=30)


def post(server: ServerProcess, path: str, body: dict | None = None) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=server.headers, timeout=60)


def generate(server: ServerProcess, ids: list[int], max_new_tokens: int) -> httpx.Response:
    params = {"max_new_tokens": max_new_tokens, "ignore_eos": True}
    return post(server, "/generate", {"input_ids": ids, "sampling_params": params})


# ---- the server -----------------------------------------------------------------------------------
def test_served_model_name_is_what_clients_see(server, tiny_llama):
    cards = get(server, "/v1/models").json()["data"]
    assert [(c["id"], c["max_model_len"]) for c in cards] == [("foo", CONTEXT)]
    r = post(server, "/v1/completions", {"model": "foo", "prompt": [5, 6, 7], "max_tokens": 2})
    assert r.status_code == 200 and r.json()["model"] == "foo", r.text
    # as in SGLang, the served name replaces the folder's: the folder's name is not the model any more
    r = post(server, "/v1/completions", {"model": tiny_llama.name, "prompt": [5, 6, 7], "max_tokens": 2})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text


def test_context_length_refuses_one_past_it(server):
    prompt = list(range(100, 100 + CONTEXT - 12))
    ok = generate(server, prompt, 12)  # exactly CONTEXT tokens in all
    assert ok.status_code == 200 and len(ok.json()["output_ids"]) == 12, ok.text
    over = generate(server, prompt, 13)
    assert over.status_code == 400 and over.json()["error"]["code"] == "context_length_exceeded", over.text
    assert f"context is {CONTEXT} tokens" in over.json()["error"]["message"]


def test_get_server_info_shows_the_flags(server, tiny_llama):
    info = get(server, "/get_server_info")
    assert info.status_code == 200, info.text
    assert API_KEY not in info.text and "api_key" not in info.text, "the API key must never be shown"
    i = info.json()
    expected = dict(
        served_model_name="foo",
        model_path=str(tiny_llama),
        context_length=CONTEXT,
        chunked_prefill_size=64,
        max_total_tokens=POOL,
        max_total_num_tokens=POOL,
        max_req_input_len=CONTEXT - 1,
        trust_remote_code=True,
        random_seed=7,
        dtype="float32",
        attention_backend="torch",
        tp_size=1,
        page_size=1,
        disable_radix_cache=False,
        port=server.port,
    )
    assert {k: i.get(k) for k in expected} == expected
    assert i["minisgl"]["engine"]["max_prefill_length"] == 64 and i["minisgl"]["served_model_name"] == "foo"
    state = i["internal_states"][0]  # the scheduler's own count of its pool
    assert state["kv"]["total_slots"] == POOL and "running_requests" in state
    other = get(server, "/server_info").json()
    assert {k: v for k, v in other.items() if k != "internal_states"} == {
        k: v for k, v in i.items() if k != "internal_states"
    }


def test_get_model_info_shape(server, tiny_llama):
    info = get(server, "/get_model_info").json()
    sglang_keys = {"model_path", "tokenizer_path", "is_generation", "preferred_sampling_params", "weight_version"}
    sglang_keys |= {"has_image_understanding", "has_audio_understanding", "model_type", "architectures"}
    assert set(info) == sglang_keys | {"served_model_name"}
    assert info["model_path"] == info["tokenizer_path"] == str(tiny_llama)
    assert info["is_generation"] is True and info["has_image_understanding"] is False
    assert (info["model_type"], info["architectures"]) == ("llama", ["LlamaForCausalLM"])
    assert get(server, "/model_info").json() == info


def test_flush_cache_empties_the_prefix_cache(server):
    prompt = list(range(2000, 2040))
    generate(server, prompt, 1).raise_for_status()
    again = generate(server, prompt, 1).json()["meta_info"]
    assert again["cached_tokens"] > 0, "the repeated prompt should hit the prefix cache before the flush"
    r = post(server, "/flush_cache")
    assert r.status_code == 200 and r.json()["success"] is True, r.text
    assert r.json()["freed_tokens"] >= again["cached_tokens"]
    assert wait_idle(server)["kv"]["evictable_slots"] == 0
    after = generate(server, prompt, 1).json()["meta_info"]
    assert after["cached_tokens"] == 0, "a flushed cache still served the prompt"
    r = get(server, "/flush_cache")  # SGLang accepts GET too
    assert r.status_code == 200 and r.json()["freed_tokens"] > 0, r.text


def test_flush_cache_refused_while_requests_run(server):
    wait_idle(server)
    assert post(server, "/flush_cache").status_code == 200
    kept = list(range(3000, 3030))
    generate(server, kept, 1).raise_for_status()  # a cached prefix no request holds
    # 5 sequences of 500 tokens: about a second of work, and room in the pool for them and `kept`
    body = {"prompt": [9, 8, 7], "n": 5, "max_tokens": 500, "ignore_eos": True, "temperature": 0.5}
    with ThreadPoolExecutor(1) as pool:
        done = pool.submit(post, server, "/v1/completions", body)
        assert wait_until(lambda: server.stats()["running_requests"] > 0, 30), "the requests never ran"
        r = post(server, "/flush_cache")
        assert done.result().status_code == 200
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "requests_running" and re.search(r"\d+ running and \d+ waiting", err["message"]), err
    again = generate(server, kept, 1).json()["meta_info"]
    assert again["cached_tokens"] > 0, "a refused flush must flush nothing, not even the prefixes no request holds"


def test_flush_waits_for_memory_a_batch_in_flight_holds():
    """The worker's rule without a server: refuse while a request is live, wait while only a batch
    in flight holds finished requests' memory (the overlap loop), flush once nothing does."""
    from minisgl.server.scheduler_worker import SchedulerWorker

    class Sched:
        def __init__(self, reqs: dict, has_work: bool):
            self.reqs, self.has_work, self.num_running, self.num_waiting = reqs, has_work, len(reqs), 0
            self.cache = SimpleNamespace(cache=SimpleNamespace(evictable_size=10))
            self.flushes = 0

        def flush_cache(self) -> None:
            self.flushes += 1

    worker = SchedulerWorker.__new__(SchedulerWorker)  # only what _answer_flushes touches
    sent: list = []
    worker._send = sent.append
    worker.sched, worker.flushes = Sched({5: None}, True), [1, 2]
    worker._answer_flushes()
    assert [(m.uid, m.stats["flushed"]) for m in sent] == [(1, False), (2, False)] and worker.sched.flushes == 0
    sent.clear()
    worker.sched, worker.flushes = Sched({}, True), [3]
    worker._answer_flushes()
    assert sent == [] and worker.flushes == [3], "answered before the batch in flight released its memory"
    worker.sched.has_work = False
    worker._answer_flushes()
    assert [(m.uid, m.stats) for m in sent] == [(3, {"flushed": True, "message": "Cache flushed.", "freed_tokens": 10})]
    assert worker.sched.flushes == 1 and worker.flushes == []


def test_tokenize_detokenize_agree_with_the_tokenizer(server, tiny_llama):
    from minisgl.tokenizer import load_tokenizer

    tok = load_tokenizer(tiny_llama)  # what the server's tokenizer worker loads
    text = "Hello world, how are you?"
    r = post(server, "/v1/tokenize", {"model": "foo", "prompt": text}).json()
    ids = tok.encode(text, add_special_tokens=True)
    assert r == {"tokens": ids, "count": len(ids), "max_model_len": CONTEXT}
    r = post(server, "/v1/tokenize", {"prompt": [text, "abc"], "add_special_tokens": False}).json()
    plain = [tok.encode(t, add_special_tokens=False) for t in (text, "abc")]
    assert r["tokens"] == plain and r["count"] == [len(p) for p in plain]
    back = post(server, "/v1/detokenize", {"tokens": ids}).json()
    assert back == {"text": tok.decode(ids, skip_special_tokens=True)} and text in back["text"]
    texts = [tok.decode(p, skip_special_tokens=True) for p in plain]
    assert post(server, "/detokenize", {"tokens": plain}).json() == {"text": texts} and texts[1] == "abc"
    assert post(server, "/tokenize", {"prompt": "abc"}).json()["tokens"] == tok.encode("abc")
    bad = post(server, "/v1/detokenize", {"tokens": [1, tok.vocab_size + 5]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens", bad.text
    assert post(server, "/v1/tokenize", {"model": "bar", "prompt": "x"}).status_code == 404


@pytest.mark.parametrize("wrong", [None, "Bearer nope"])
def test_every_new_route_needs_the_api_key(server, wrong):
    headers = {} if wrong is None else {"Authorization": wrong}
    routes = [("GET", p) for p in ("/get_model_info", "/model_info", "/get_server_info", "/server_info")]
    routes += [("GET", "/flush_cache"), ("POST", "/flush_cache")]
    routes += [("POST", p) for p in ("/v1/tokenize", "/v1/detokenize", "/tokenize", "/detokenize")]
    for method, path in routes:
        r = httpx.request(method, server.url + path, json={"prompt": "x", "tokens": [1]}, headers=headers, timeout=10)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (method, path, r.text)


# ---- the flags, parsed --------------------------------------------------------------------------
def test_sglang_flags_become_ours():
    a = parse_args(
        [*("--model-path", "m", "--served-model-name", "foo", "--trust-remote-code", "--context-length", "300")]
        + [*("--chunked-prefill-size", "64", "--page-size", "4", "--max-total-tokens", "1003", "--random-seed", "5")]
        + [*("--disable-radix-cache", "--disable-cuda-graph", "--enable-mixed-chunk", "--max-running-requests", "8")]
        + [*("--dtype", "half", "--attention-backend", "torch_native", "--kv-cache-dtype", "fp8_e4m3", "--tp", "2")]
    )
    e = a.engine
    assert (a.served_model_name, a.trust_remote_code) == ("foo", True)
    assert (e["model"], e["max_seq_len"], e["max_prefill_length"], e.get("step_time")) == ("m", 300, 64, None)
    assert (e["page_size"], e["num_pages"]) == (4, 250), "1003 tokens are 250 whole pages of 4"
    assert (e["seed"], e["cache_type"], e["cuda_graph_max_bs"], e["mixed_chunk"]) == (5, "naive", 0, True)
    assert (e["dtype"], e["attention_backend"], e["kv_cache_dtype"]) == ("float16", "torch", "fp8_e4m3")
    assert (e["max_running_requests"], e["tp_size"]) == (8, 2)
    assert parse_args(["--chunked-prefill-size", "-1"]).engine["max_prefill_length"] is None  # no chunking
    assert parse_args(["--dtype", "float"]).engine["dtype"] == "float32"
    assert parse_args(["--attention-backend", "flashinfer"]).engine["attention_backend"] == "flashinfer"
    assert parse_args([]).served_model_name is None and parse_args([]).engine.get("seed") is None
    assert "--chunked-prefill-size" in build_parser().format_help()


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--mem-fraction-static", "1.5"], "mem_fraction_static must be in (0, 1]"),
        (["--mem-fraction-static", "0.5", "--num-pages", "9"], "without num_pages"),
        (["--schedule-policy", "lpm"], "--schedule-policy lpm: minisgl admits waiting requests in arrival order"),
        (["--schedule-policy", "lof"], "Accepted: fcfs, or our admission policies default and reserve-all"),
        (["--grammar-backend", "outlines"], "grammar_backend 'outlines': xgrammar (the default) and dfa are built in"),
        (["--grammar-backend", "none"], "none is never needed"),
        (["--max-prefill-tokens", "0"], "--max-prefill-tokens must be >= 1"),
        (["--chat-template", "chatml"], "--chat-template chatml: no such file, and not a template"),
        (["--attention-backend", "flashmla"], "--attention-backend flashmla: unknown"),
        (["--attention-backend", "torch,flashmla"], "--attention-backend torch,flashmla: unknown"),
        (["--chunked-prefill-size", "0"], "-1 for no chunking"),
        (["--chunked-prefill-size", "64", "--max-prefill-length", "32"], "give one of --chunked-prefill-size"),
        (["--max-total-tokens", "100", "--num-pages", "10"], "give one of --max-total-tokens"),
        (["--max-total-tokens", "3", "--page-size", "4"], "at least one page (4 tokens)"),
        (["--served-model-name", " "], "--served-model-name must not be empty"),
        (["--kv-cache-dtype", "fp8_e5m2"], "invalid choice: 'fp8_e5m2'"),
    ],
)
def test_sglang_flags_we_cannot_honour_are_refused(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2
    assert says in capsys.readouterr().err


def test_sglang_launch_flags_take_their_meaning(capsys, tmp_path):
    from minisgl.engine.config import EngineConfig

    a = parse_args(["--disable-overlap-schedule", "--schedule-policy", "reserve-all", "--grammar-backend", "dfa"])
    c = EngineConfig.from_kwargs(**a.engine)
    assert (c.loop, c.components.admission, c.components.grammar) == ("plain", "reserve-all", "dfa")
    assert (
        EngineConfig.from_kwargs(**parse_args(["--grammar-backend", "xgrammar"]).engine).components.grammar == "default"
    )
    assert parse_args(["--schedule-policy", "fcfs"]).engine.get("components") is None  # ours already: no change
    e = parse_args(["--max-prefill-tokens", "100"]).engine  # caps the prefill budgets, busy and idle
    assert (e["max_prefill_length"], e["idle_prefill_length"], e["step_time"]) == (100, 100, None)
    e = parse_args(["--chunked-prefill-size", "64", "--max-prefill-tokens", "100"]).engine
    assert (e["max_prefill_length"], e["idle_prefill_length"]) == (64, 64)
    assert parse_args(["--mem-fraction-static", "0.7"]).engine["mem_fraction_static"] == 0.7
    (tmp_path / "t.jinja").write_text(TEMPLATE)
    assert parse_args(["--chat-template", str(tmp_path / "t.jinja")]).chat_template == TEMPLATE
    assert parse_args(["--chat-template", "{{ messages }}"]).chat_template == "{{ messages }}"  # the template itself
    a = parse_args(["--enable-metrics", "--log-requests", "--incremental-streaming-output"])
    assert (a.log_requests, a.incremental_streaming_output) == (True, True)
    assert "--enable-metrics: nothing to do, GET /metrics is always on" in capsys.readouterr().err


# ---- /generate in SGLang's shape --------------------------------------------------------------------------
def sse_events(server: ServerProcess, body: dict) -> list[dict]:
    import json

    with httpx.stream("POST", server.url + "/generate", json=body, headers=server.headers, timeout=60) as r:
        assert r.status_code == 200, r.read()
        lines = [x for x in r.iter_lines() if x.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(x[6:]) for x in lines[:-1]]


def test_bench_serving_counts_the_whole_output(server, tiny_llama):
    """What ``sglang.bench_serving --backend sglang`` does with a /generate stream: the last chunk's text
    is the whole output, which it retokenizes; its count of generated tokens is meta_info's."""
    from minisgl.tokenizer import load_tokenizer

    tok = load_tokenizer(tiny_llama)
    body = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 40, "ignore_eos": True}}
    plain = post(server, "/generate", body).json()
    chunks = sse_events(server, body | {"stream": True})
    assert len(chunks) > 2, "one chunk per token or so"
    for before, after in zip(chunks, chunks[1:]):  # SGLang's default: the whole text (and ids) so far
        assert (
            after["text"].startswith(before["text"])
            and after["output_ids"][: len(before["output_ids"])] == (before["output_ids"])
        )
        assert before["meta_info"]["finish_reason"] is None
    last = chunks[-1]
    assert (last["text"], last["output_ids"]) == (plain["text"], plain["output_ids"])
    generated = last["meta_info"]["completion_tokens"]
    retokenized = len(tok.encode(last["text"], add_special_tokens=False))
    assert generated == 40 and last["meta_info"]["finish_reason"] == {"type": "length", "length": 40}
    # the whole output retokenized, as a non-streamed answer is (the old incremental chunks gave a few tokens)
    assert (
        retokenized
        == len(tok.encode(plain["text"], add_special_tokens=False))
        > len(tok.encode(chunks[-2]["text"][-5:]))
    )
    assert retokenized == len(
        tok.encode(tok.decode(plain["output_ids"], skip_special_tokens=True), add_special_tokens=False)
    )


def test_generate_takes_a_batch(server):
    params = {"max_new_tokens": 6, "ignore_eos": True}
    texts = ["Hello there", "One two three four", "x"]
    singles = [post(server, "/generate", {"text": t, "sampling_params": params}).json() for t in texts]
    r = post(server, "/generate", {"text": texts, "sampling_params": params})
    assert r.status_code == 200 and isinstance(r.json(), list), r.text
    assert [(o["text"], o["output_ids"]) for o in r.json()] == [(o["text"], o["output_ids"]) for o in singles]
    assert len({o["meta_info"]["id"] for o in r.json()}) == 3
    ids = [[5, 6, 7], [100, 200]]
    r = post(server, "/generate", {"input_ids": ids, "sampling_params": params}).json()
    assert [o["meta_info"]["prompt_tokens"] for o in r] == [3, 2] and all(len(o["output_ids"]) == 6 for o in r)
    one = post(server, "/generate", {"input_ids": [5, 6, 7], "sampling_params": params}).json()
    assert isinstance(one, dict) and one["output_ids"] == r[0]["output_ids"], "a flat list of ids is one prompt"
    chunks = sse_events(server, {"text": texts, "sampling_params": params, "stream": True})
    for i, single in enumerate(singles):
        mine = [c for c in chunks if c["index"] == i]
        assert mine[-1]["text"] == single["text"] and mine[-1]["meta_info"]["finish_reason"]["type"] == "length"
    for bad, field in (({"text": ["a", ""]}, "text"), ({"input_ids": [[1], []]}, "input_ids"), ({"text": []}, "text")):
        r = post(server, "/generate", bad)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    r = post(server, "/generate", {"input_ids": [[1]] * 65})
    assert r.status_code == 400 and "65 prompts" in r.json()["error"]["message"], r.text


def test_finish_reason_is_sglangs_object(server):
    prompt = [300, 200, 100, 50]
    free = post(
        server, "/generate", {"input_ids": prompt, "sampling_params": {"max_new_tokens": 12, "ignore_eos": True}}
    )
    ids, text = free.json()["output_ids"], free.json()["text"]
    # a stop token: the token that matched (the last one out)
    params = {"max_new_tokens": 12, "stop_token_ids": [ids[3]]}
    r = post(server, "/generate", {"input_ids": prompt, "sampling_params": params}).json()
    stop_at = ids.index(ids[3])
    assert r["meta_info"]["finish_reason"] == {"type": "stop", "matched": ids[3]}
    assert r["output_ids"][-1] == ids[3] and len(r["output_ids"]) == stop_at + 1
    # a stop string: the string, also among several (the earliest in the text is the one that matched)
    word = text.strip()[2:6]
    assert word and word in text, text
    params = {"max_new_tokens": 12, "ignore_eos": True, "stop": ["never in the text \u2603", word]}
    for stream in (False, True):
        body = {"input_ids": prompt, "sampling_params": params, "stream": stream}
        out = sse_events(server, body)[-1] if stream else post(server, "/generate", body).json()
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": word}, out
        assert out["text"] == text[: text.index(word)]


def test_chat_template_flag_replaces_the_models(server, tiny_llama):
    from minisgl.tokenizer import load_tokenizer

    tok = load_tokenizer(tiny_llama)
    messages = [{"role": "user", "content": "Hi there"}]
    r = post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 1})
    assert r.status_code == 200, r.text
    mine = tok.encode("<user>Hi there</user><assistant>", add_special_tokens=False)
    assert (
        r.json()["usage"]["prompt_tokens"]
        == len(mine)
        != len(tok.apply_chat_template(messages, add_generation_prompt=True))
    )


def test_log_requests_logs_each_request(server):
    r = post(
        server,
        "/generate",
        {"input_ids": [9, 9, 9, 9, 9], "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}},
    )
    assert r.status_code == 200
    assert wait_until(
        lambda: re.search(r"request [0-9a-f]+ finished: 5 prompt tokens, 3 output tokens", server.logs()), 10
    )


@pytest.fixture(scope="module")
def fraction_server(tiny_llama, tmp_path_factory):
    """--mem-fraction-static sized for a pool of about KV_TOKENS, and --incremental-streaming-output."""
    s = ServerProcess(
        ["--model", str(tiny_llama), "--dtype", "float32", "--page-size", "1", "--incremental-streaming-output"]
        + ["--mem-fraction-static", repr(fraction_for(tiny_llama, KV_TOKENS))],
        tmp_path_factory.mktemp("server-fraction"),
    )
    try:
        s.wait_ready()
    except BaseException:
        s.stop()
        raise
    yield s
    s.stop()


KV_TOKENS = 5000


def weights_and_token_bytes(model) -> tuple[int, int]:
    """The float32 weights' bytes (from the checkpoint's tensors) and one token's K and V bytes."""
    import json
    import math

    from safetensors import safe_open

    cfg = json.loads((model / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * 4
    weights = 0
    for f in model.glob("*.safetensors"):
        with safe_open(f, "pt") as st:
            weights += sum(math.prod(st.get_slice(k).get_shape()) for k in st.keys()) * 4
    return weights, per_token


def ram_bytes() -> int:
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def fraction_for(model, tokens: int) -> float:
    weights, per_token = weights_and_token_bytes(model)
    return (weights + tokens * per_token) / ram_bytes()


def test_mem_fraction_static_sizes_the_pool(fraction_server, tiny_llama):
    """Weights plus KV pool are the share F of the machine's RAM (a CPU server): the pool is what the weights
    leave, printed at start."""
    weights, per_token = weights_and_token_bytes(tiny_llama)
    f = fraction_for(tiny_llama, KV_TOKENS)
    expected = (int(ram_bytes() * f) - weights) // per_token  # the checkpoint's tensors; the engine adds buffers
    info = httpx.get(fraction_server.url + "/get_server_info", timeout=30).json()
    assert 0.9 * expected <= info["max_total_tokens"] <= expected, (info["max_total_tokens"], expected)
    assert info["mem_fraction_static"] == f
    assert f"KV pool: {info['max_total_tokens']} tokens" in fraction_server.logs()
    assert "mem_fraction_static" in fraction_server.logs()


def test_incremental_streaming_output_sends_deltas(fraction_server):
    body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 10, "ignore_eos": True}}
    plain = httpx.post(fraction_server.url + "/generate", json=body, timeout=60).json()
    chunks = sse_events(fraction_server, body | {"stream": True})
    assert "".join(c["text"] for c in chunks) == plain["text"]
    assert [i for c in chunks for i in c["output_ids"]] == plain["output_ids"] and len(chunks) > 2
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 10}
