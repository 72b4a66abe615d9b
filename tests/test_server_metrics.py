"""``GET /metrics`` and SSE keep-alive, on one tiny-model server with a KV pool of one context and a
short ``--sse-keepalive``: the counters and histograms match the traffic sent (under SGLang's names),
the gauges match the scheduler, the route is behind the API key; a stream queued behind a full pool
gets keep-alive comments, then its tokens. Then the same timing in process, on a fake frontend."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from types import SimpleNamespace

import httpx
import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families
from server_utils import ServerProcess, wait_idle
from tiny_models import save_tiny_model

KEY = "metrics-test-key"
KEEPALIVE_S = 0.5
CONTEXT = 4096  # the model's context, and the KV pool's size (page size 1 on a CPU)
NUM_PAGES = CONTEXT
# the holder takes HOLD_PROMPT slots at once and more with each token; a prompt longer than the rest
# can never be admitted beside it, whatever the admission policy reserves: NUM_PAGES - HOLD_PROMPT <
# WAIT_PROMPT. Its HOLD_TOKENS take seconds (the test aborts it long before they are done).
HOLD_PROMPT, HOLD_TOKENS = 16, 4000
WAIT_PROMPT, WAIT_TOKENS = NUM_PAGES - HOLD_PROMPT + 2, 8


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    """The tiny Llama with a longer context, so that one request can hold the pool for seconds."""
    return str(save_tiny_model("llama", tmp_path_factory.mktemp("tiny-llama-long"), max_position_embeddings=CONTEXT))


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    args = ["--model", model, "--dtype", "float32", "--num-pages", str(NUM_PAGES)]
    args += ["--sse-keepalive", str(KEEPALIVE_S)]
    s = ServerProcess(args, tmp_path_factory.mktemp("server-metrics"), api_key=KEY)
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


def scrape(server: ServerProcess, model: str) -> dict[tuple[str, str | None], float]:
    """``{(sample name, le or None): value}``; every sample carries ``model_name``."""
    r = httpx.get(f"{server.url}/metrics", headers=server.headers, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == CONTENT_TYPE_LATEST
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            assert s.labels.get("model_name") == model, f"{s.name} is labelled {s.labels}, expected {model!r}"
            out[s.name, s.labels.get("le")] = s.value
    return out


def delta(after: dict, before: dict, name: str) -> float:
    return after[name, None] - before.get((name, None), 0.0)


def post(server: ServerProcess, path: str, body: dict, **kw) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers=server.headers, timeout=60, **kw)


def sse_lines(r: httpx.Response):
    """The stream's non-empty lines: ``data: ...`` events and ``:`` comments."""
    return (line for line in r.iter_lines() if line)


def test_metrics_count_the_traffic(server, model):
    wait_idle(server)
    before = scrape(server, model)
    t0 = time.monotonic()
    usages = []
    r = post(server, "/v1/completions", {"prompt": [5, 6, 7, 8, 9], "max_tokens": 6, "ignore_eos": True})
    assert r.status_code == 200, r.text
    usages.append(r.json()["usage"])
    body = {"input_ids": [300, 200, 100] * 4, "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}
    r = post(server, "/generate", body)
    assert r.status_code == 200, r.text
    meta = r.json()["meta_info"]
    usages.append({"prompt_tokens": meta["prompt_tokens"], "completion_tokens": meta["completion_tokens"]})
    body = {
        "messages": [{"role": "user", "content": "Count the tokens"}],
        "max_tokens": 5,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, headers=server.headers) as r:
        assert r.status_code == 200
        events = [json.loads(x[6:]) for x in sse_lines(r) if x.startswith("data: ") and x != "data: [DONE]"]
    usages.append(events[-1]["usage"])
    took = time.monotonic() - t0
    after = scrape(server, model)

    n = len(usages)
    prompt, completion = sum(u["prompt_tokens"] for u in usages), sum(u["completion_tokens"] for u in usages)
    assert completion == 6 + 4 + 5, usages
    assert delta(after, before, "sglang:prompt_tokens_total") == prompt, "prompt tokens counted != usage"
    assert delta(after, before, "sglang:generation_tokens_total") == completion, "generated tokens != usage"
    assert delta(after, before, "sglang:num_requests_total") == n
    assert delta(after, before, "sglang:num_aborted_requests_total") == 0
    for hist in ("time_to_first_token", "e2e_request_latency"):
        name = f"sglang:{hist}_seconds"
        assert delta(after, before, f"{name}_count") == n, f"{name}: one observation per request"
        assert after[f"{name}_bucket", "+Inf"] == after[f"{name}_count", None]
        assert 0 < delta(after, before, f"{name}_sum") <= n * took
    # one reply per token here (no speculative decoding): a gap before every token but the first
    itl = "sglang:inter_token_latency_seconds"
    assert delta(after, before, f"{itl}_count") == completion - n
    assert 0 < delta(after, before, f"{itl}_sum") <= delta(after, before, "sglang:e2e_request_latency_seconds_sum")
    buckets = sorted((float(le), v) for (name, le), v in after.items() if name == f"{itl}_bucket")
    assert [v for _, v in buckets] == sorted(v for _, v in buckets), "buckets must be cumulative"

    # the gauges at rest are the scheduler's numbers
    idle = wait_idle(server)
    rest = scrape(server, model)
    assert rest["sglang:num_running_reqs", None] == 0 and rest["sglang:num_queue_reqs", None] == 0
    assert rest["sglang:max_total_num_tokens", None] == idle["kv"]["total_slots"] == NUM_PAGES
    assert rest["sglang:num_used_tokens", None] == 0 and rest["sglang:token_usage", None] == 0
    assert rest["sglang:cache_hit_rate", None] == pytest.approx(idle["cache"]["hit_rate"])


# Every series the panels of SGLang's Grafana dashboard query (sgl-project/sglang,
# examples/monitoring/grafana/dashboards/json/sglang-dashboard.json): its PromQL names these
DASHBOARD_SERIES = [
    "sglang:e2e_request_latency_seconds_bucket",  # histogram_quantile(0.99|0.9|0.5, sum by (le) (rate(...)))
    "sglang:e2e_request_latency_seconds_sum",  # rate(_sum) / rate(_count): the average
    "sglang:e2e_request_latency_seconds_count",
    "sglang:time_to_first_token_seconds_bucket",
    "sglang:time_to_first_token_seconds_sum",
    "sglang:time_to_first_token_seconds_count",
    "sglang:num_running_reqs",
    "sglang:gen_throughput",
    "sglang:cache_hit_rate",
    "sglang:num_queue_reqs",
]


def test_the_dashboards_series_and_the_schedulers_have_data(server, model):
    """After a few requests every series the dashboard's panels read is there, and so are the scheduler's
    own: queue time, time per output token, generation throughput, retractions, KV usage."""
    wait_idle(server)
    before, t0 = scrape(server, model), time.monotonic()
    stats0 = server.stats()
    lengths = [(list(range(40 + i, 60 + i)), 8 + i) for i in range(3)]
    for prompt, n in lengths:
        r = post(
            server, "/generate", {"input_ids": prompt, "sampling_params": {"max_new_tokens": n, "ignore_eos": True}}
        )
        assert r.status_code == 200, r.text
    stats = wait_idle(server)
    after, took = scrape(server, model), time.monotonic() - t0
    for series in DASHBOARD_SERIES:
        assert any(name == series for name, _ in after), f"{series} is missing"
    for hist in ("e2e_request_latency", "time_to_first_token"):
        assert delta(after, before, f"sglang:{hist}_seconds_count") == 3
    # the scheduler's tokens over the time between the two scrapes, the tokens it counted itself
    generated = stats["generated_tokens"] - stats0["generated_tokens"]
    assert generated == sum(n for _, n in lengths)
    assert 0.5 * generated / took <= after["sglang:gen_throughput", None] <= 1.5 * generated / took
    queue = "sglang:queue_time_seconds"
    assert delta(after, before, f"{queue}_count") == 3, "one wait per request, measured by the scheduler"
    assert 0 <= delta(after, before, f"{queue}_sum") < took
    assert stats["queue_times"]["count"] >= 3
    buckets = [float(le) for (name, le) in after if name == f"{queue}_bucket" and le != "+Inf"]
    assert buckets[:5] == [0.0, 0.1, 0.2, 0.5, 1.0] and buckets[-1] == 3000.0 and len(buckets) == 36  # SGLang's
    tpot = "sglang:time_per_output_token_seconds"
    assert delta(after, before, f"{tpot}_count") == 3
    assert 0 < delta(after, before, f"{tpot}_sum") < delta(after, before, "sglang:e2e_request_latency_seconds_sum")
    assert after["sglang:num_retracted_requests_total", None] == stats["retracted_requests"]
    assert after["sglang:num_retracted_reqs", None] == 0  # none since the last scrape
    assert after["sglang:token_usage", None] == 0 and after["sglang:num_used_tokens", None] == 0  # idle again
    later = scrape(server, model)  # nothing generated since: the throughput falls to 0
    assert later["sglang:gen_throughput", None] == 0 and delta(later, after, f"{queue}_count") == 0


def test_retractions_are_counted(server, model):
    """Six sequences that together outgrow the pool: the optimistic admission lets them start, the scheduler
    retracts some when decodes run out of room, and /metrics counts what the scheduler counted."""
    wait_idle(server)
    before, stats0 = scrape(server, model), server.stats()
    prompts = [list(range(500 + 20 * i, 516 + 20 * i)) for i in range(6)]  # 6 x (16 + 1200) > NUM_PAGES
    body = {"input_ids": prompts, "sampling_params": {"max_new_tokens": 1200, "ignore_eos": True}}
    r = post(server, "/generate", body)
    assert r.status_code == 200 and all(len(o["output_ids"]) == 1200 for o in r.json()), r.text[:300]
    stats = wait_idle(server)
    after = scrape(server, model)
    retracted = stats["retracted_requests"] - stats0["retracted_requests"]
    assert retracted >= 1, "the pool holds about half of what the six need: some must have been retracted"
    assert delta(after, before, "sglang:num_retracted_requests_total") == retracted
    assert after["sglang:num_retracted_reqs", None] == retracted  # since the previous scrape


def test_scheduler_series_in_process():
    """Fed from the scheduler's stats at each scrape: each wait observed once (several readers of its
    window may come), the throughput over the time since the last scrape, retractions as a counter."""
    from minisgl.server.ops.metrics import ServerMetrics

    m = ServerMetrics(lambda: "fake")
    value = lambda name: m.registry.get_sample_value(name, {"model_name": "fake"})
    kv = {"total_slots": 10, "free_slots": 10, "evictable_slots": 0, "usage": 0.0}
    base = dict(running_requests=0, waiting_requests=0, kv=kv, cache={"hit_rate": 0.0})
    base["speculative"] = {"accept_rate": 0.0, "accept_length": 0.0}

    def scrape(count, latest, tokens, retracted):
        m.set_gauges(
            base
            | dict(
                queue_times={"count": count, "latest": latest}, generated_tokens=tokens, retracted_requests=retracted
            )
        )

    scrape(2, [0.05, 3.0], 0, 0)
    assert value("sglang:queue_time_seconds_count") == 2 and value("sglang:queue_time_seconds_sum") == pytest.approx(
        3.05
    )
    m._last = (m._last[0] - 2.0, 0, 0)  # as if the last scrape were two seconds ago
    scrape(3, [0.05, 3.0, 0.5], 100, 1)
    assert value("sglang:queue_time_seconds_count") == 3 and value("sglang:queue_time_seconds_sum") == pytest.approx(
        3.55
    )
    assert 45 <= value("sglang:gen_throughput") <= 50  # 100 tokens in a little over 2 s
    assert value("sglang:num_retracted_requests_total") == 1 and value("sglang:num_retracted_reqs") == 1
    scrape(1000, [0.1] * 4, 100, 1)  # more waits than the window kept: those in it
    assert value("sglang:queue_time_seconds_count") == 7 and value("sglang:num_retracted_reqs") == 0
    m.set_gauges(None)  # the scheduler did not answer: no stale gauge
    assert value("sglang:gen_throughput") is None and value("sglang:num_retracted_requests_total") == 1


def test_metrics_need_the_api_key(server):
    assert httpx.get(f"{server.url}/metrics", timeout=10).status_code == 401
    wrong = {"Authorization": "Bearer not-the-key"}
    assert httpx.get(f"{server.url}/metrics", headers=wrong, timeout=10).status_code == 401
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200  # the one open route


def test_a_queued_stream_gets_keepalives_then_its_tokens(server, model):
    """A long request holds the pool; a stream and a plain request queued behind it wait. The stream
    begins after KEEPALIVE_S with comments, and holds no data until the holder is gone (its client
    leaves: it is aborted); the plain one is plain JSON."""
    wait_idle(server)
    before = scrape(server, model)
    holder = {"prompt": list(range(1000, 1000 + HOLD_PROMPT)), "max_tokens": HOLD_TOKENS, "ignore_eos": True}
    waiter = {"prompt": list(range(10_000, 10_000 + WAIT_PROMPT)), "max_tokens": WAIT_TOKENS, "ignore_eos": True}
    other = waiter | {"prompt": list(range(20_000, 20_000 + WAIT_PROMPT))}  # shares no prefix with it
    plain: list[httpx.Response] = []
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=60) as client:
        with client.stream("POST", "/v1/completions", json=holder | {"stream": True}) as h:
            assert h.status_code == 200
            held = sse_lines(h)  # kept: a dropped iterator would close the response, and abort the holder
            assert next(held).startswith("data: "), "the holder runs at once"
            # a refusal still comes at once, as a 4xx, while the pool is full
            r = client.post("/v1/completions", json={"prompt": [5] * 10, "max_tokens": CONTEXT, "stream": True})
            assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
            thread = threading.Thread(target=lambda: plain.append(post(server, "/v1/completions", other)))
            thread.start()
            t0 = time.monotonic()
            with client.stream("POST", "/v1/completions", json=waiter | {"stream": True}) as w:
                began = time.monotonic() - t0
                assert w.status_code == 200
                lines = sse_lines(w)
                assert next(lines) == ": keep-alive"
                assert next(lines) == ": keep-alive"  # KEEPALIVE_S later, still queued
                waited = time.monotonic() - t0
                busy, stats = scrape(server, model), server.stats()  # the holder runs, both waiters wait
                h.close()  # the client leaves: the holder is aborted, the waiters run
                rest = list(lines)
    thread.join(60)
    assert KEEPALIVE_S * 0.8 <= began and 1.8 * KEEPALIVE_S <= waited, (began, waited)
    assert busy["sglang:num_running_reqs", None] == stats["running_requests"] == 1
    assert busy["sglang:num_queue_reqs", None] == stats["waiting_requests"] == 2
    used = busy["sglang:num_used_tokens", None]
    assert (
        HOLD_PROMPT < used <= HOLD_PROMPT + HOLD_TOKENS
        and used <= stats["kv"]["total_slots"] - stats["kv"]["free_slots"]
    )
    assert busy["sglang:token_usage", None] == pytest.approx(used / NUM_PAGES)

    data = [x for x in rest if x.startswith("data: ")]
    assert data[-1] == "data: [DONE]" and all(x == ": keep-alive" for x in rest if not x.startswith("data: "))
    chunks = [json.loads(x[6:])["choices"][0] for x in data[:-1]]
    assert chunks[-1]["finish_reason"] == "length"
    (r,) = plain
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == WAIT_TOKENS, r.text
    after = scrape(server, model)
    assert delta(after, before, "sglang:num_aborted_requests_total") == 1  # the holder
    assert delta(after, before, "sglang:num_requests_total") == 2
    wait_idle(server)


def test_sse_keepalive_flag():
    """Seconds, 0 = off; a negative or non-finite value is a usage error; the default is the one the
    engine manual's flag table (docs/serving.md) states."""
    from pathlib import Path

    from minisgl.server.args import parse_args

    default = parse_args([]).sse_keepalive
    readme = (Path(__file__).resolve().parents[1] / "docs" / "serving.md").read_text()
    assert f"| `--sse-keepalive` | {default:g} |" in readme
    assert parse_args(["--sse-keepalive", "0"]).sse_keepalive == 0
    assert parse_args(["--sse-keepalive", "2.5"]).sse_keepalive == 2.5
    for bad in ("-1", "nan", "inf", "x"):
        with pytest.raises(SystemExit):
            parse_args(["--sse-keepalive", bad])


# ---- in process: the stream's timing, on a fake frontend fed on a clock --------------------------
EVERY = 0.1  # the keep-alive interval of the in-process tests


class FakeFrontend:
    """What ``Generation`` uses of a ``Frontend``; the test feeds ``queue`` itself."""

    request_timeout = None

    def __init__(self):
        from minisgl.tokenizer.detokenizer import text_streams

        self.text_streams = text_streams("default")
        self.queue: asyncio.Queue | None = None
        self.aborted: list[int] = []

    def submit(self, msgs, queue: asyncio.Queue) -> None:
        self.queue = queue

    def abort(self, uid: int) -> None:
        self.aborted.append(uid)

    def forget(self, uid: int) -> None:
        pass


async def answer(stream: bool, script: list[tuple[float, object]]):
    """``stream_or_collect`` of a 2-sequence request whose replies ``script`` feeds (seconds to wait
    first, message); returns what the client gets (the body, or the stream's strings) and the metrics."""
    from minisgl.core import SamplingParams
    from minisgl.message import TokenizeMsg
    from minisgl.server.generation import Generation, stream_or_collect
    from minisgl.server.ops.metrics import ServerMetrics

    fe, metrics = FakeFrontend(), ServerMetrics(lambda: "fake")
    state = SimpleNamespace(sse_keepalive_s=EVERY, metrics=metrics)
    request = SimpleNamespace(app=SimpleNamespace(state=state), receive=asyncio.Event().wait)  # never leaves
    gen = Generation(fe, [TokenizeMsg(uid, SamplingParams(max_tokens=2), text="hi") for uid in (1, 2)], [], n=2)

    async def feed() -> None:
        for wait, msg in script:
            await asyncio.sleep(wait)
            fe.queue.put_nowait(msg)

    def events(s):
        text = s.take_text()
        if text:
            yield f"data: {s.index}:{text}\n\n"

    body = lambda: {s.index: s.text for s in gen.seqs}
    feeder = asyncio.create_task(feed())
    try:
        resp = await stream_or_collect(gen, request, stream, events, body, head=["HEAD\n\n"])
        out = [ev async for ev in resp.body_iterator] if stream else resp
    finally:
        feeder.cancel()
    return out, metrics


def script_with_gaps() -> list:
    from minisgl.message import ReplyMsg

    return [
        (4 * EVERY, ReplyMsg(1, "a", [10], None, 3, 1)),  # both queued past the keep-alive
        (EVERY / 4, ReplyMsg(2, "b", [11], None, 3, 1)),
        (4 * EVERY, ReplyMsg(1, "c", [12], "length", 3, 1)),  # a gap between two tokens
        (0, ReplyMsg(2, "d", [13], "length", 3, 1)),
    ]


def test_keepalive_before_the_first_token_and_between_tokens():
    from minisgl.server.generation import KEEPALIVE

    out, m = asyncio.run(answer(True, script_with_gaps()))
    data = [ev for ev in out if ev != KEEPALIVE]
    # the same events as a stream that began at once: head, then each sequence's text
    assert data == ["HEAD\n\n", "data: 0:a\n\n", "data: 1:b\n\n", "data: 0:c\n\n", "data: 1:d\n\n", "data: [DONE]\n\n"]
    first, gap = out.index("HEAD\n\n"), out.index("data: 0:c\n\n") - out.index("data: 1:b\n\n") - 1
    assert first >= 2 and out[:first] == [KEEPALIVE] * first, f"keep-alives before the first event: {out}"
    assert gap >= 2, f"a {4 * EVERY} s gap between two tokens with {EVERY} s keep-alives got {gap}: {out}"
    value = lambda name: m.registry.get_sample_value(name, {"model_name": "fake"})
    assert value("sglang:generation_tokens_total") == 4 and value("sglang:prompt_tokens_total") == 6
    assert value("sglang:cached_tokens_total") == 2 and value("sglang:num_requests_total") == 2
    assert value("sglang:time_to_first_token_seconds_count") == 2
    assert value("sglang:time_to_first_token_seconds_sum") >= 2 * 4 * EVERY  # both waited
    assert value("sglang:inter_token_latency_seconds_count") == 2
    assert value("sglang:inter_token_latency_seconds_sum") >= 2 * 3 * EVERY  # roughly 4 EVERY each


def test_plain_answers_and_refusals_do_not_change():
    """A non-streamed answer is its body, however long the wait; a refusal is its 4xx, streamed or not."""
    from minisgl.message import ErrorMsg
    from minisgl.server.errors import ApiError

    out, _ = asyncio.run(answer(False, script_with_gaps()))
    assert out == {0: "ac", 1: "bd"}
    for stream in (True, False):
        refusal = [(0.01, ErrorMsg(1, "too long", 400, "context_length_exceeded"))]
        with pytest.raises(ApiError) as e:
            asyncio.run(answer(stream, refusal))
        assert e.value.status == 400
