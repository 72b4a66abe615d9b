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
]


@pytest.fixture(scope="module")
def server(tiny_llama, tmp_path_factory):
    s = ServerProcess(
        ["--model-path", str(tiny_llama), *SGLANG_FLAGS, "--page-size", "1"],
        tmp_path_factory.mktemp("server-sglang"),
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
        (["--mem-fraction-static", "0.8"], "--memory-ratio"),
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
