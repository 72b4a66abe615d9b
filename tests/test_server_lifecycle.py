"""Process lifecycle: 503 while loading, SIGTERM stops every process and frees the port, a crashed
worker brings the server down with a clear log line (clients get an error, not a hang), children
exit when the launcher is killed, and bad start-up arguments fail fast."""

from __future__ import annotations

import json
import signal
import socket
import time

import httpx
import psutil
from server_utils import ServerProcess, alive_pids, free_port, run_cli, wait_until


def family(server: ServerProcess) -> list[int]:
    """The server's pid and all its descendants' pids."""
    return [server.proc.pid] + [c.pid for c in psutil.Process(server.proc.pid).children(recursive=True)]


def test_503_while_loading_then_sigterm_stops_everything(tiny_llama, tmp_path):
    s = ServerProcess(["--model", str(tiny_llama)], tmp_path)
    try:
        first = None
        while first is None:  # the first answer comes while the model is still loading
            first = s.health()
            time.sleep(0.05)
        assert first == 503, "/health must answer 503 until the model is loaded"
        assert "serving" not in s.out_path.read_text(), "announced before the model was ready"
        body = httpx.get(f"{s.url}/health").json()
        assert "loading" in body["error"]["message"]
        r = httpx.post(f"{s.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert r.status_code in (200, 503)  # 503 unless the model finished loading meanwhile
        seen = s.wait_ready()
        assert seen[-1] == 200
        assert wait_until(lambda: f"at {s.url}" in s.out_path.read_text(), 5), s.logs()
        pids = family(s)
        assert len(pids) >= 4, f"expected the server and its 3 workers, got {pids}"
        t = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(15) == 0, s.logs()
        assert time.monotonic() - t < 10
        assert wait_until(lambda: not alive_pids(pids), 5), f"left behind: {alive_pids(pids)}"
        with socket.socket() as sock:  # the port is free again
            sock.bind(("127.0.0.1", s.port))
    finally:
        s.stop()


def test_crashed_worker_brings_the_server_down(tiny_llama, tmp_path):
    s = ServerProcess(["--model", str(tiny_llama)], tmp_path)
    try:
        s.wait_ready()
        pids = family(s)
        scheduler = s.stats()["server"]["processes"]["scheduler"]
        body = {"prompt": [5, 6, 7], "max_tokens": 1000, "ignore_eos": True, "stream": True}
        events = []
        with httpx.stream("POST", f"{s.url}/v1/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            for line in lines:
                if line.startswith("data: "):
                    break  # the request is running: now kill the scheduler under it
            psutil.Process(scheduler).kill()
            t = time.monotonic()
            events = [line[6:] for line in lines if line.startswith("data: ")]
        assert time.monotonic() - t < 10, "the client hung"
        errors = [json.loads(e)["error"] for e in events if e != "[DONE]" and "error" in json.loads(e)]
        assert errors and "scheduler" in errors[0]["message"], events[-3:]
        assert s.proc.wait(15) == 1
        assert f"the scheduler process (pid {scheduler}) was killed by signal 9" in s.err_path.read_text()
        assert wait_until(lambda: not alive_pids(pids), 5), f"left behind: {alive_pids(pids)}"
    finally:
        s.stop()


def test_children_exit_when_the_launcher_is_killed(tiny_llama, tmp_path):
    s = ServerProcess(["--model", str(tiny_llama)], tmp_path)
    try:
        s.wait_ready()
        children = family(s)[1:]
        assert len(children) >= 3
        s.proc.kill()  # no chance to clean up: the children must notice by themselves
        s.proc.wait(5)
        assert wait_until(lambda: not alive_pids(children), 10), f"orphans: {alive_pids(children)}"
    finally:
        s.stop()


def test_bad_start_arguments_fail_fast(tiny_llama):
    r = run_cli("--model", "/no/such/model", "--port", str(free_port()))
    assert r.returncode == 2 and "not found" in r.stderr
    r = run_cli("--page-size", "0")
    assert r.returncode == 2 and "page_size" in r.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        r = run_cli("--model", str(tiny_llama), "--port", str(busy.getsockname()[1]))
    assert r.returncode != 0 and "cannot listen" in r.stderr


def test_help_documents_flags_and_env():
    r = run_cli("--help")
    assert r.returncode == 0
    flags = ["--tp-size", "--tp", "--max-extend-length", "--cache", "--attn", "--api-key", "--shell"]
    for flag in flags + ["--request-read-timeout", "--max-connections"]:
        assert flag in r.stdout
    for env in ("MINISGL_DISABLE_OVERLAP_SCHEDULING", "MINISGL_SHELL_MAX_TOKENS", "MINISGL_SHELL_TOP_K"):
        assert env in r.stdout
