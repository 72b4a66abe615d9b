"""Data-parallel replicas behind sglang-router (``python -m minisgl --dp 2``): one launcher per module, two
replicas of the tiny Llama on loopback (the router sees text, not the model: a tiny model starts and
prefills fastest), OpenAI requests through the router (plain, streamed, aborted), every route through
the front behind the API key, cache-aware routing against round-robin on a shared-prefix workload, a
replica killed with SIGKILL, and SIGTERM stopping the whole tree. The tests run in file order and share
the launcher: the last two kill a replica and then the launcher."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
from server_utils import REPO, alive_pids, server_env, wait_until

from minisgl.benchmark import routing

# the test extra installs sglang-router: CI must run these tests, so there a missing router fails
_MISSING = importlib.util.find_spec("sglang_router") is None
if _MISSING and not os.environ.get("CI"):
    pytest.skip("pip install 'minisgl[router]' (the test extra installs it)", allow_module_level=True)

API_KEY = "router-test-key"
HEADERS = {"Authorization": f"Bearer {API_KEY}"}
MODEL = "tiny-llama"  # --served-model-name: the name the router registers the replicas under
SERVING = re.compile(r"minisgl: serving at (\S+) .* over \d+ replicas: (.+)$", re.M)


class Launcher:
    """``python -m minisgl ARGS --port 0`` in a subprocess; ``url`` and ``workers`` once it serves."""

    def __init__(self, args: list[str], log_dir: Path):
        self.log = log_dir / "launcher.log"
        cmd = [sys.executable, "-m", "minisgl", *args, "--port", "0", "--api-key", API_KEY, "--log-level", "warning"]
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(cmd, cwd=REPO, env=server_env(), stdout=out, stderr=subprocess.STDOUT)
        self.url, self.workers = "", []

    def wait_ready(self, timeout: float = 180.0) -> Launcher:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (m := SERVING.search(self.log.read_text())) is not None:
                self.url, self.workers = m.group(1), m.group(2).split(", ")
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"the launcher exited with {self.proc.returncode}:\n{self.text()}")
            time.sleep(0.2)
        raise TimeoutError(f"not serving after {timeout} s:\n{self.text()}")

    def text(self) -> str:
        return self.log.read_text()[-8000:]

    def family(self) -> list[int]:
        return [self.proc.pid] + [c.pid for c in psutil.Process(self.proc.pid).children(recursive=True)]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture(scope="module")
def dp(tiny_llama, tmp_path_factory):
    """The cache-aware router (the default) over two replicas, and a round-robin router (``--dp 0``:
    the router alone) over the same two."""
    ca = Launcher(
        ["--dp", "2", "--model", str(tiny_llama), "--served-model-name", MODEL], tmp_path_factory.mktemp("dp")
    )
    rr = None
    try:
        ca.wait_ready()
        rr_args = ["--dp", "0", "--router-policy", "round_robin", "--worker-urls", *ca.workers]
        rr = Launcher(rr_args, tmp_path_factory.mktemp("rr")).wait_ready()
        yield ca, rr
    finally:
        for launcher in (rr, ca):
            if launcher is not None:
                launcher.stop()


def client(url: str):
    from openai import OpenAI

    return OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=60)


def metric(worker: str, name: str) -> float:
    text = httpx.get(f"{worker}/metrics", headers=HEADERS, timeout=30).text
    return sum(float(line.rpartition(" ")[2]) for line in text.splitlines() if line.startswith(name + "{"))


def running(worker: str) -> int:
    s = httpx.get(f"{worker}/stats", headers=HEADERS, timeout=30).json()
    return s["running_requests"] + s["waiting_requests"]


def test_openai_requests_through_the_router(dp):
    """Chat and completions through the router answer what a replica answers itself (greedy), and
    the routes the router rewrites (it adds SGLang's fields to /generate, "unknown" for a missing
    model) are served."""
    ca, _ = dp
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    for url in (ca.url, ca.workers[0]):
        assert client(url).models.list().data[0].id == MODEL
    chat = dict(model=MODEL, messages=msgs, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    via = client(ca.url).chat.completions.create(**chat)
    direct = client(ca.workers[0]).chat.completions.create(**chat)
    assert via.choices[0].message.content == direct.choices[0].message.content and via.usage.completion_tokens == 12
    done = client(ca.url).completions.create(
        model=MODEL, prompt="1, 2, 3, 4,", max_tokens=6, temperature=0, extra_body={"ignore_eos": True}
    )
    assert done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 6
    r = httpx.post(f"{ca.url}/generate", headers=HEADERS, timeout=60, json={"text": "Hello", "sampling_params": {}})
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] > 0, r.text
    unnamed = {"messages": msgs, "max_tokens": 2}  # the router forwards it with model "unknown"
    r = httpx.post(f"{ca.url}/v1/chat/completions", headers=HEADERS, timeout=60, json=unnamed)
    assert r.status_code == 200, f"a request without a model, through the router: {r.text}"


# every route sglang-router 0.3.2 serves (its own and those it forwards) and ours; with --api-key each
# answers 401 without the key, in OpenAI's shape, but /health (load balancers probe it, as on one server)
ROUTES = [
    ("GET", p)
    for p in (
        "/engine_metrics", "/v1/models", "/get_server_info", "/readiness", "/health_generate", "/liveness",
        "/get_model_info", "/get_loads", "/workers", "/metrics", "/stats", "/v1/models/x", "/ha/status", "/wasm",
        "/v1/responses/x", "/v1/conversations/x", "/no-such-route",
    )
] + [
    ("POST", p)
    for p in (
        "/v1/chat/completions", "/v1/completions", "/generate", "/flush_cache", "/workers", "/v1/responses",
        "/v1/embeddings", "/v1/rerank", "/v1/classify", "/v1/conversations", "/parse/reasoning",
        "/parse/function_call", "/v1/tokenize", "/v1/detokenize", "/add_worker?url=http://127.0.0.1:1",
    )
]  # fmt: skip


def test_every_route_wants_the_key(dp):
    """The router listens on loopback only; the front checks the key on every route (the router itself
    answered /engine_metrics, /v1/models, /get_server_info, /readiness and /health_generate without it)."""
    ca, _ = dp
    wrong = {"Authorization": "Bearer not-the-key"}
    for method, path in ROUTES:
        for headers in ({}, wrong):
            r = httpx.request(method, f"{ca.url}{path}", headers=headers, json={}, timeout=30)
            assert r.status_code == 401, f"{method} {path} without the key: {r.status_code} {r.text[:200]}"
            assert r.json()["error"]["code"] == "invalid_api_key", (method, path, r.text)
    assert httpx.get(f"{ca.url}/health", timeout=30).status_code == 200
    assert httpx.get(f"{ca.url}/engine_metrics", headers=HEADERS, timeout=30).status_code == 200
    # an error the router answers in plain text comes in OpenAI's shape
    r = httpx.get(f"{ca.url}/no-such-route", headers=HEADERS, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error", r.text


def test_a_completion_without_a_model_is_served_through_the_router(dp):
    """The router refuses a /v1/completions body without ``model`` in plain text (422); the front names
    the model "unknown" for it, as the router does for chat, and the replica serves it."""
    ca, _ = dp
    body = {"prompt": "1, 2, 3,", "max_tokens": 2, "temperature": 0}
    r = httpx.post(f"{ca.url}/v1/completions", headers=HEADERS, json=body, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, r.text
    r = httpx.post(f"{ca.url}/v1/completions", headers=HEADERS, json={"max_tokens": 2}, timeout=60)
    assert r.status_code == 400 and "missing field `prompt`" in r.json()["error"]["message"], r.text


def test_the_router_fields_of_generate(dp):
    """What sglang-router writes into /generate is accepted as the router sends it; those fields that
    ask for something this server does not do are refused when turned on, naming the field."""
    ca, _ = dp
    router_fields = {
        "model": None, "return_text_in_logprobs": False, "log_metrics": True, "return_hidden_states": False,
        "background": False, "no_logs": False, "return_bytes": False, "return_entropy": False,
    }  # fmt: skip
    body = {"text": "Hi", "sampling_params": {"max_new_tokens": 2}, **router_fields}
    worker = ca.workers[0]
    assert httpx.post(f"{worker}/generate", json=body, headers=HEADERS, timeout=60).status_code == 200
    for field, value in [("return_hidden_states", True), ("return_entropy", True), ("background", True)]:
        r = httpx.post(f"{worker}/generate", json=body | {field: value}, headers=HEADERS, timeout=60)
        assert r.status_code == 400 and field in r.json()["error"]["message"], (field, r.text)
    r = httpx.post(f"{worker}/generate", json=body | {"model": "gpt-9"}, headers=HEADERS, timeout=60)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_streams_through_the_router(dp):
    ca, _ = dp
    msgs = [{"role": "user", "content": "Name three colors."}]
    kw = dict(model=MODEL, messages=msgs, max_tokens=16, temperature=0, extra_body={"ignore_eos": True})
    whole = client(ca.url).chat.completions.create(**kw).choices[0].message.content
    chunks = list(client(ca.url).chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole and len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 16


def test_a_client_that_leaves_mid_stream_frees_its_request(dp):
    """The router closes the replica's stream when its client goes: the replica aborts the request
    (its abort counter moves) and holds nothing afterwards."""
    ca, _ = dp
    aborted = sum(metric(w, "sglang:num_aborted_requests_total") for w in ca.workers)
    stream = client(ca.url).completions.create(
        model=MODEL, prompt="Count to a thousand:", max_tokens=1000, stream=True, extra_body={"ignore_eos": True}
    )
    got = [next(stream) for _ in range(3)]
    assert all(c.choices[0].text is not None for c in got)
    assert sum(running(w) for w in ca.workers) == 1, "the request is running on a replica"
    stream.close()
    gone = wait_until(lambda: sum(running(w) for w in ca.workers) == 0, 20)
    assert gone, "a replica still runs the request whose client left"
    assert sum(metric(w, "sglang:num_aborted_requests_total") for w in ca.workers) == aborted + 1


def test_cache_aware_routing_hits_the_cache_more_than_round_robin(dp):
    """6 sessions at once, each asking 4 questions after a shared prefix of ~120 words. Kept on one
    replica a session's prefix is computed once (3 of 4 prompts hit it); spread by round-robin it
    is computed on both replicas (about 2 of 4). Both routers spread the load over both replicas."""
    ca, rr = dp
    sessions = routing.shared_prefix_sessions(6, 4, 120, 8, seed=12345)  # prefixes no test sent before
    a = routing.measure(ca.url, ca.workers, sessions, MODEL, API_KEY)
    b = routing.measure(rr.url, ca.workers, sessions, MODEL, API_KEY)
    print(f"cache hit rate: cache-aware {a['hit_rate']:.1%} {a['prompt_tokens']}, round-robin {b['hit_rate']:.1%}")
    prefix_share = 3 / 4 * 0.9  # 3 of 4 prompts hit, and the prefix is ~90% of a prompt's tokens
    assert a["hit_rate"] > prefix_share, f"cache-aware routing kept the sessions on one replica: {a}"
    # round-robin's share depends on how the 24 requests interleave (measured 47-51% loaded, 58% quiet
    # in CI, where cache-aware gave 69.8% both times): 5 points is below every difference seen
    assert a["hit_rate"] > b["hit_rate"] + 0.05, f"cache-aware {a} against round-robin {b}"
    assert min(a["prompt_tokens"]) > 0.25 * sum(a["prompt_tokens"]), f"cache-aware left a replica idle: {a}"
    assert min(b["prompt_tokens"]) > 0.25 * sum(b["prompt_tokens"]), b


def test_a_killed_replica_is_routed_around(dp):
    """SIGKILL the replica that cache-aware routing sends a prompt to: that prompt, sent again, still
    succeeds every time (the router's retries reach the other replica once its circuit breaker opens,
    before the health check drops the dead one), the launcher keeps serving and says which replica
    died, and the killed replica's own workers exit (they watch their parent)."""
    ca, _ = dp
    c = client(ca.url)
    prompt = "A prompt the router has seen before: " + "alpha beta gamma delta " * 20

    def served() -> list[float]:
        return [metric(w, "sglang:num_requests_total") for w in ca.workers]

    before = served()
    for _ in range(2):
        c.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    got = [a - b for a, b in zip(served(), before)]
    assert sorted(got) == [0, 2], f"cache-aware routing sent one prompt to both replicas: {got}"
    victim_url = ca.workers[got.index(2)]
    survivor = ca.workers[got.index(0)]
    victim_port = int(victim_url.rpartition(":")[2])
    victim = next(p for p in psutil.Process(ca.proc.pid).children() if f"--port {victim_port}" in " ".join(p.cmdline()))
    workers = [p.pid for p in victim.children(recursive=True)]
    done = metric(survivor, "sglang:num_requests_total")
    victim.kill()
    for _ in range(6):
        r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
        assert r.choices[0].finish_reason == "length"
    assert metric(survivor, "sglang:num_requests_total") == done + 6, "the survivor served them all"
    assert ca.proc.poll() is None, ca.text()
    assert wait_until(lambda: f"port {victim_port}) exited with code -9" in ca.text(), 5), ca.text()
    assert wait_until(lambda: not alive_pids(workers), 10), f"the killed replica left {alive_pids(workers)}"


def test_sigterm_stops_the_router_and_every_replica(dp):
    ca, rr = dp
    for launcher in (rr, ca):
        pids = launcher.family()
        assert len(pids) >= 2, pids  # the launcher and its router at least
        t = time.monotonic()
        launcher.proc.send_signal(signal.SIGTERM)
        assert launcher.proc.wait(30) == 0, launcher.text()
        assert time.monotonic() - t < 20
        assert wait_until(lambda pids=pids: not alive_pids(pids), 10), f"left behind: {alive_pids(pids)}"
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{ca.url}/health", timeout=5)


# ---- without servers ------------------------------------------------------------------------------
def test_dp_flags_are_checked():
    from minisgl.server.args import parse_args

    args = parse_args(["--dp", "3", "--router-policy", "round_robin", "--worker-urls", "http://h:1919"])
    assert (args.dp, args.router_policy, args.worker_urls) == (3, "round_robin", ["http://h:1919"])
    assert parse_args([]).dp == 1
    for argv in (["--dp", "0"], ["--dp", "-1"], ["--dp", "2", "--shell"], ["--worker-urls", "h:1919"]):
        with pytest.raises(SystemExit):
            parse_args(argv)


def test_dp_without_the_router_installed_says_how_to_get_it(monkeypatch, capsys):
    import importlib.util

    from minisgl.server.args import parse_args
    from minisgl.server.ops import dp

    real = importlib.util.find_spec
    hidden = lambda name, *a: None if name == "sglang_router" else real(name, *a)  # noqa: E731
    monkeypatch.setattr(importlib.util, "find_spec", hidden)
    assert dp.launch_dp(parse_args(["--dp", "2"]), ["--dp", "2"]) == 2
    assert "pip install 'minisgl[router]'" in capsys.readouterr().err


def test_the_router_listens_on_loopback_only():
    """Whatever --host the front serves on, the router's routes are reachable from this machine only."""
    from minisgl.server.args import parse_args
    from minisgl.server.ops import dp

    args = parse_args(["--dp", "2", "--host", "0.0.0.0", "--port", "30000", "--api-key", "k"])
    cmd = dp.router_command(args, ["http://127.0.0.1:30001"], 41234)
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[cmd.index("--port") + 1] == "41234", cmd


def test_replicas_share_the_cpu_cores(monkeypatch):
    from minisgl.server.args import parse_args
    from minisgl.server.ops import dp

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(dp.os, "cpu_count", lambda: 8)
    envs = dp.replica_envs(parse_args(["--dp", "2", "--device", "cpu"]), 2)
    assert [e["OMP_NUM_THREADS"] for e in envs] == ["4", "4"]
    assert dp.replica_ports(30000, 2) == [30001, 30002]
