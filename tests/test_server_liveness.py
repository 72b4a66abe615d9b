"""A hung worker is visible, and no request waits forever.

Against the embedded model, served with a short ``--health-timeout`` (and ``--request-timeout``):
a long prefill step keeps ``/health`` at 200 (the scheduler says it is busy); a stream that runs
past the timeout ends with an error event; a SIGSTOPped scheduler turns ``/health`` 503 within the
bound and a request gets a 504 instead of hanging; after SIGCONT both recover. Last, a crashed
worker stops the server and its socket folder is removed. ``/health``'s rule itself, on made-up
timelines, is checked without processes.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import psutil
import pytest
from server_utils import ServerProcess, wait_idle, wait_until
from test_server_ipc import ipc_paths

HEALTH_TIMEOUT = 2.0
REQUEST_TIMEOUT = 4.0
PING_EVERY = 1.0  # minisgl.server.frontend.PING_EVERY_S
SLACK = 3.0  # two shared CPU cores: scheduling noise


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    args = ["--health-timeout", str(HEALTH_TIMEOUT), "--request-timeout", str(REQUEST_TIMEOUT)]
    s = ServerProcess(args, tmp_path_factory.mktemp("server-liveness"))
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


def complete(server: ServerProcess, max_tokens: int = 8) -> httpx.Response:
    body = {"prompt": "The capital of France is", "max_tokens": max_tokens, "temperature": 0}
    return httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)


@pytest.fixture(scope="module")
def reference(server) -> str:
    r = complete(server)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_a_long_step_is_not_a_hang(tmp_path):
    """A prefill that outlasts the bound: the heartbeat waits behind it, yet /health stays 200
    (the scheduler's thread says it is busy). Its own server: no --request-timeout to cut it."""
    s = ServerProcess(["--health-timeout", str(HEALTH_TIMEOUT)], tmp_path)
    try:
        s.wait_ready()
        # one prefill step of several seconds (nothing decodes: the whole prompt is one step); 1,500 tokens
        # took under the 4 s needed once the CPU kernels covered prefill
        body = {"input_ids": [5] * 3000, "sampling_params": {"max_new_tokens": 1}}
        result: list = []

        def run() -> None:
            t0 = time.monotonic()
            result.append(httpx.post(f"{s.url}/generate", json=body, timeout=300))
            result.append(time.monotonic() - t0)

        t = threading.Thread(target=run)
        t.start()
        seen = []
        while t.is_alive():
            seen.append(s.health())
            time.sleep(0.2)
        t.join()
    finally:
        s.stop()
    r, took = result
    assert r.status_code == 200, r.text
    if took < HEALTH_TIMEOUT + PING_EVERY + 1:
        pytest.skip(f"the prefill took only {took:.1f} s here: too short to outlast the bound")
    assert set(seen) == {200}, f"/health flapped during a {took:.1f} s step: {seen}"


def test_a_stream_past_the_timeout_ends_with_an_error_event(server, reference):
    body = {"prompt": "Tell me a long story.", "max_tokens": 4000, "ignore_eos": True, "stream": True}
    t0 = time.monotonic()
    text, errors = "", []
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                ev = json.loads(line[6:])
                if "error" in ev:
                    errors.append(ev["error"])
                else:
                    text += ev["choices"][0]["text"]
    took = time.monotonic() - t0
    assert text, "expected some text before the timeout"
    assert [e["code"] for e in errors] == ["request_timeout"], errors
    assert "--request-timeout" in errors[0]["message"]
    assert REQUEST_TIMEOUT <= took < REQUEST_TIMEOUT + SLACK, f"ended after {took:.1f} s"
    wait_idle(server)  # it was aborted in the scheduler and its memory freed


def test_a_stopped_scheduler_is_visible_and_recovers(server, reference):
    pid = server.stats()["server"]["processes"]["scheduler"]
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        bound = HEALTH_TIMEOUT + PING_EVERY + SLACK
        assert wait_until(lambda: server.health() == 503, bound), f"/health still 200 after {bound} s"
        took = time.monotonic() - t0
        message = httpx.get(f"{server.url}/health").json()["error"]["message"]
        assert "heartbeat" in message and "--health-timeout" in message, message
        t0 = time.monotonic()
        r = complete(server)
        waited = time.monotonic() - t0
        assert r.status_code == 504 and r.json()["error"]["code"] == "request_timeout", r.text
        assert REQUEST_TIMEOUT <= waited < REQUEST_TIMEOUT + SLACK, f"answered after {waited:.1f} s"
    finally:
        os.kill(pid, signal.SIGCONT)
    assert took >= HEALTH_TIMEOUT, f"503 after {took:.1f} s: sooner than the bound"
    assert wait_until(lambda: server.health() == 200, PING_EVERY + SLACK), "/health did not recover"
    r = complete(server)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == reference, r.text


def test_a_crashed_worker_takes_its_socket_folder_with_it(server):
    """Last in this module: it brings the shared server down."""
    (folder,) = {os.path.dirname(p) for p in ipc_paths(server.proc.pid).values()}
    assert os.path.isdir(folder)
    psutil.Process(server.stats()["server"]["processes"]["tokenizer"]).kill()
    assert server.proc.wait(20) == 1, server.logs()
    assert not os.path.exists(folder), f"{folder} was left behind"


def test_the_health_rule_on_made_up_timelines(monkeypatch):
    """``Frontend.health``: 503 once a heartbeat has been out longer than the bound, unless the
    scheduler said within the bound that it is inside one step (of at most MAX_STEP_S)."""
    from minisgl.message import Addresses, BusyMsg, PingMsg, ReadyMsg
    from minisgl.server import frontend

    now = [1000.0]
    monkeypatch.setattr(frontend.time, "monotonic", lambda: now[0])
    fe = frontend.Frontend(Addresses.under("/nonexistent"), health_timeout=5.0)
    assert "loading" in fe.health()
    fe._dispatch(ReadyMsg("scheduler", {}))
    fe._dispatch(ReadyMsg("tokenizer", {}))
    assert fe.health() is None
    fe._ping_seq, fe._ping_sent = 7, now[0]  # a heartbeat goes out ...
    now[0] += 4.9
    assert fe.health() is None, "within the bound"
    now[0] += 0.2
    assert "no heartbeat" in fe.health(), "past the bound, nothing heard"
    fe._dispatch(BusyMsg(40.0))
    assert fe.health() is None, "a long step excuses the late heartbeat"
    now[0] += 5.1
    assert "no heartbeat" in fe.health(), "the busy note is older than the bound: stopped inside the step?"
    fe._dispatch(BusyMsg(frontend.MAX_STEP_S + 1))
    assert "inside one step" in fe.health(), "no step is that long"
    fe._dispatch(PingMsg(6))
    assert fe.health() is not None, "an old heartbeat coming back proves nothing about the one out now"
    fe._dispatch(PingMsg(7))
    assert fe.health() is None, "it came back"
    fe.fail_all("the scheduler process died")
    assert fe.health() == "the scheduler process died"


def test_timeout_flags():
    from minisgl.server.args import HEALTH_TIMEOUT_S, parse_args

    a = parse_args([])
    assert a.request_timeout is None and a.health_timeout == HEALTH_TIMEOUT_S
    a = parse_args(["--request-timeout", "30", "--health-timeout", "2.5"])
    assert a.request_timeout == 30.0 and a.health_timeout == 2.5
    for bad in ("0", "-1", "nan", "inf", "soon"):
        with pytest.raises(SystemExit):
            parse_args(["--request-timeout", bad])
        with pytest.raises(SystemExit):
            parse_args(["--health-timeout", bad])
