"""The HTTP layer under load and attack, on a server whose open-file limit is small (so a flood that
exceeds it stays small): keep-alive responses come back at once, the API key's scheme is
case-insensitive, a flood of slow and silent connections neither exhausts the descriptors nor
keeps ``/health`` from answering, and running out of descriptors does not flood the log."""

from __future__ import annotations

import resource
import socket
import statistics
import time

import httpx
import psutil
import pytest
from server_utils import ServerProcess, free_port, run_cli, wait_until

FD_LIMIT = 1024  # the server's open-file limit, soft and hard
READ_TIMEOUT_S = 3.0  # --request-read-timeout
API_KEY = "sk-http-key"
HEALTH_BOUND_S = 2.0  # /health normally answers in milliseconds; without the guard it never does
PARTIAL_HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"  # a request head that never ends
SLOW_BODY_HEAD = (
    f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n"
    "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"
).encode()


@pytest.fixture(scope="module")
def server(tiny_llama, tmp_path_factory):
    args = ["--model", str(tiny_llama), "--dtype", "float32", "--request-read-timeout", str(READ_TIMEOUT_S)]
    s = ServerProcess(args, tmp_path_factory.mktemp("server-http"), api_key=API_KEY, fd_limit=FD_LIMIT)
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


def timed_health(server: ServerProcess) -> tuple[int | str, float]:
    """/health on a new connection: its status (or the error's name) and how long it took."""
    t = time.monotonic()
    try:
        code: int | str = httpx.get(f"{server.url}/health", timeout=10).status_code
    except httpx.HTTPError as e:
        code = type(e).__name__
    return code, time.monotonic() - t


def closed_by_peer(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


def test_keep_alive_responses_are_not_delayed(server):
    """Without TCP_NODELAY on accepted sockets, Nagle's algorithm meets the client's delayed ACK
    and every response on a reused connection arrives ~40 ms late."""
    times = []
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=30) as http:
        http.get("/v1/models").raise_for_status()  # connect
        for _ in range(50):
            t = time.perf_counter()
            http.get("/v1/models").raise_for_status()
            times.append(time.perf_counter() - t)
    median = statistics.median(times)
    assert median < 0.020, (
        f"GET /v1/models on one keep-alive connection: median {median * 1e3:.1f} ms, expected a few ms "
        "(~40 ms means Nagle's algorithm delays each response: is TCP_NODELAY set on accepted sockets?)"
    )


def test_bearer_scheme_is_case_insensitive_and_the_key_exact(server):
    cases = [
        (f"Bearer {API_KEY}", 200),
        (f"bearer {API_KEY}", 200),
        (f"BEARER {API_KEY}", 200),
        (f"bEaReR  {API_KEY}", 200),  # RFC 7235: one or more spaces after the scheme
        (f"Bearer {API_KEY.upper()}", 401),
        (f"Bearer {API_KEY[:-1]}", 401),
        (f"Bearer {API_KEY}x", 401),
        (f"Basic {API_KEY}", 401),
        (f"Bearer{API_KEY}", 401),
        (API_KEY, 401),
        ("Bearer", 401),
    ]
    got = [(h, httpx.get(f"{server.url}/v1/models", headers={"Authorization": h}).status_code) for h, _ in cases]
    wrong = [
        f"Authorization: {h!r} -> {code}, expected {want}" for (h, code), (_, want) in zip(got, cases) if code != want
    ]
    assert not wrong, "\n".join(wrong)


def test_api_key_must_be_ascii():
    """Refused at start-up, before anything loads: a header carries bytes, so a non-ASCII key has
    no one spelling a client would send (the old check matched it against a Latin-1 decoding)."""
    for key in ("clé-secrète", " padded "):
        r = run_cli("--api-key", key, "--port", str(free_port()), "--model", "/no/such/model")
        assert r.returncode == 2 and "--api-key must be ASCII" in r.stderr, (key, r.stderr[-500:])


def test_warns_when_reachable_from_other_machines_without_a_key():
    """The warning comes first thing at start-up; a missing --model then ends the run at once.
    (Which hosts count as loopback: test_server_units.test_loopback_hosts.)"""
    run = lambda *a: run_cli(*a, "--port", "0", "--model", "/no/such/model").stderr
    warning = "no --api-key is set"
    assert warning in run("--host", "0.0.0.0")
    assert warning not in run("--host", "0.0.0.0", "--api-key", "k")
    assert warning not in run("--host", "127.0.0.1")


def client_fd_room(n: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < n + 256:
        pytest.skip(f"this test opens {n} sockets; the open-file limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def test_slowloris_flood_is_closed_and_health_answers(server):
    """2x the server's open-file limit in connections that send part of a head and stop, 20 of them
    trickling a byte at a time, and 5 whose body trickles: ``/health`` answers throughout, and
    every one is closed by the server within the read timeout (the oldest ones sooner, to make
    room), while a request that is slow but within the bound is answered."""
    n = 2 * FD_LIMIT
    client_fd_room(n)
    socks: list[socket.socket] = []
    try:
        for i in range(n):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            s.sendall(PARTIAL_HEAD)
            socks.append(s)
            if i % 128 == 127:
                code, took = timed_health(server)
                assert code == 200 and took < HEALTH_BOUND_S, (
                    f"with {i + 1} slow connections open, /health gave {code} after {took:.2f} s"
                )
        for _ in range(5):  # a complete head, then a body that trickles
            s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            s.sendall(SLOW_BODY_HEAD)
            socks.append(s)
        flooded = time.monotonic()
        trickling = socks[-25:]  # the newest: not pushed out to make room, only the timeout closes them

        def all_closed() -> bool:
            for s in trickling:
                try:
                    s.send(b"X")  # one more byte of a header name, or of a body
                except OSError:
                    pass
            return all(closed_by_peer(s) for s in socks)

        bound = READ_TIMEOUT_S + 15  # generous: the server closes them at READ_TIMEOUT_S
        assert wait_until(all_closed, bound, 0.5), (
            f"{sum(not closed_by_peer(s) for s in socks)} of {len(socks)} connections that never sent a whole request "
            f"are still open {time.monotonic() - flooded:.0f} s after the flood (--request-read-timeout "
            f"{READ_TIMEOUT_S})"
        )
        code, took = timed_health(server)
        assert code == 200 and took < HEALTH_BOUND_S, (code, took)
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:  # slow, but within the bound
            s.sendall(b"GET /health HTTP/1.1\r\n")
            time.sleep(READ_TIMEOUT_S / 3)
            s.sendall(b"Host: x\r\n\r\n")
            assert s.recv(100).startswith(b"HTTP/1.1 200"), "a request that took less than the timeout was refused"
        r = httpx.post(
            f"{server.url}/v1/completions",
            json={"prompt": [5, 6, 7], "max_tokens": 4},
            headers=server.headers,
            timeout=60,
        )
        assert r.status_code == 200, r.text
    finally:
        for s in socks:
            s.close()


def test_running_out_of_descriptors_is_logged_once_per_interval(server):
    """With the server's soft open-file limit lowered under its feet, accept() fails with EMFILE;
    asyncio logs that with a traceback up to ``backlog`` times per loop tick (~50 MB in 8 s
    here). The server logs it as one line per few seconds, with a count of the repeats."""
    proc = psutil.Process(server.proc.pid)
    limits = proc.rlimit(psutil.RLIMIT_NOFILE)
    assert wait_until(lambda: proc.num_fds() < FD_LIMIT // 4, 30), f"the server holds {proc.num_fds()} files"
    before = len(server.err_path.read_bytes())
    socks = []
    proc.rlimit(psutil.RLIMIT_NOFILE, (proc.num_fds() + 8, limits[1]))
    try:
        for _ in range(100):  # fewer than the listen backlog: each connect() returns at once
            socks.append(socket.create_connection(("127.0.0.1", server.port), timeout=10))
        time.sleep(8)  # a bit more than one 5 s interval
    finally:
        proc.rlimit(psutil.RLIMIT_NOFILE, limits)
        for s in socks:
            s.close()
    log = server.err_path.read_bytes()[before:].decode(errors="replace")
    lines = [line for line in log.splitlines() if "Too many open files" in line]
    assert lines, f"accept() never ran out of descriptors: the test did not reproduce anything\n{log[-2000:]}"
    assert len(lines) <= 3 and "Traceback" not in log, (
        f"{len(lines)} log lines ({len(log)} bytes) about running out of descriptors in 8 s; expected one line "
        f"per 5 s. First lines:\n{log[:1500]}"
    )
    assert all("more like it" in line for line in lines[1:]), lines
    assert wait_until(lambda: timed_health(server)[0] == 200, 30), "the server did not recover"
