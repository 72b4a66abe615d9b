"""The server's internal ZMQ channel under attack, against a running server.

- Its sockets are files in one 0700 folder of the server's user, each socket 0600; another user
  (``nobody``, when this process may switch to it) can neither list the folder nor connect; the
  folder is gone once the server stops, and a stale one left by a killed server is removed at the
  next start.
- Forged replies and aborts aimed at small request ids (ids used to count from 1) miss: a running
  request's answer is unchanged.
- Malformed frames of every kind, on every socket, kill and wedge nothing: afterwards ``/health``
  is 200 and a request gets the same answer as before.

Frames are built here with plain msgpack (``{"__msg__": tag, ...fields}``), not with the code under
test. ``test_server_liveness.py`` covers a stopped scheduler (``/health``, ``--request-timeout``).
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import signal
import socket
import stat
import tempfile
import threading
import time

import httpx
import msgpack
import psutil
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st
from server_utils import ServerProcess, wait_until

NOBODY = 65534
SOCKET_NAMES = ("tokenizer", "scheduler", "detokenizer", "frontend")
OVERSIZED = 65 << 20  # above any legitimate frame (an 8 MiB request body's prompt)


# ---- helpers ---------------------------------------------------------------------------------
def ipc_paths(launcher_pid: int) -> dict[str, str]:
    """The server's unix socket addresses by name, from /proc/net/unix, which every local user
    can read (an abstract one is shown as ``@name``)."""
    tag = f"minisgl-{launcher_pid}-"
    out = {}
    with open("/proc/net/unix") as f:
        for line in f.read().splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 8 and tag in parts[7]:
                out[parts[7].rsplit("/", 1)[-1]] = parts[7]
    return out


def zmq_addr(path: str) -> str:
    return f"ipc://{path}"  # an abstract name keeps its "@" in ZMQ's syntax


def frame(tag: str, **fields) -> bytes:
    return msgpack.packb({"__msg__": tag, **fields})


def push_frames(path: str, frames: list[bytes], linger_ms: int = 5000) -> None:
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.connect(zmq_addr(path))
        for f in frames:
            sock.send(f, copy=False)
        sock.close(linger=linger_ms)  # waits (at most that long) until they are delivered
    finally:
        ctx.term()


def completion(server: ServerProcess, prompt, max_tokens: int = 8) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def family(server: ServerProcess) -> list[int]:
    return [server.proc.pid] + [c.pid for c in psutil.Process(server.proc.pid).children(recursive=True)]


SAMPLING = {"__msg__": "SamplingParams", "temperature": 0.0, "top_k": -1, "top_p": 1.0, "max_tokens": 4}
SAMPLING |= {"ignore_eos": False, "stop_token_ids": [], "seed": None}


def malformed_frames(seed: int = 0) -> list[bytes]:
    """Frames no receiver may act on: not msgpack, truncated, msgpack of the wrong shape, known
    tags with missing, extra or mistyped fields, values no worker can use, and a large one."""
    rng = random.Random(seed)
    good = frame("TokenizeMsg", uid=rng.getrandbits(63), sampling=SAMPLING, text="hi", input_ids=None, messages=None)
    out = [rng.randbytes(n) for n in (1, 2, 13, 13, 100, 1000, 65536) for _ in range(3)]
    out += [b"", b"\xc1", b"\x00" * 13, b"\x91" * 100_000, b"\xdd\xff\xff\xff\xff"]  # nesting; array of 4G items
    out += [good[:k] for k in (1, 5, len(good) // 2, len(good) - 1)]  # truncated
    out += [good + b"\x00"]  # trailing bytes
    out += [msgpack.packb(v) for v in (0, -1, 2**64 - 1, 1.5, "text", b"bytes", [1, 2], {"a": 1}, None, True)]
    out += [msgpack.packb({1: 2}), msgpack.packb({"__msg__": ["x"]}), msgpack.packb({"__msg__": 5})]
    out += [
        frame("NoSuchMsg", uid=1),
        frame("SamplingParams"),  # a known tag that is not a message
        frame("TokenizeMsg"),  # fields missing
        frame("TokenizeMsg", uid="1", sampling=1, text=None),
        frame("TokenizeMsg", uid=5, sampling=SAMPLING, text="x", input_ids=None, messages=[{"role": 1}]),
        frame("TokenizeMsg", uid=5, sampling=SAMPLING | {"temperature": "hot"}, text="x"),
        frame("TokenizeMsg", uid=5, sampling=SAMPLING | {"top_k": 2**64 - 1}, text="x"),
        frame("TokenizeMsg", uid=5, sampling=SAMPLING | {"unknown": 1}, text="x"),
        frame("AbortMsg", uid=[1]),
        frame("AbortMsg", uid=1, extra=2),
        frame("AbortMsg", uid=True),
        frame("GenerateMsg", uid=7, input_ids="abc", sampling=SAMPLING),
        frame("GenerateMsg", uid=7, input_ids=[1, "a"], sampling=SAMPLING),
        frame("GenerateMsg", uid=7, input_ids=[2**64 - 1], sampling=SAMPLING),
        frame("GenerateMsg", uid=7, input_ids=[1, 2], sampling=3),
        frame("StatsReqMsg", uid=None),
        frame("BatchTokenMsg", tokens=[1, 2]),
        frame("BatchTokenMsg", tokens=[{"__msg__": "TokenMsg", "uid": 5, "token_id": "x"}]),
        frame("BatchReplyMsg", replies=[{"__msg__": "ReplyMsg", "uid": 5}]),
        frame("BatchReplyMsg", replies=[{"__msg__": "ReplyMsg", "uid": 5, "text": 3, "token_ids": []}]),
        frame("ErrorMsg", uid=5, message="m", status=0),
        frame("ErrorMsg", uid=5, message=None),
        frame("StatsMsg", uid=5, stats=[1]),
        frame("ReadyMsg", who=3),
        frame("PingMsg", seq="x"),
        frame("BusyMsg", step_s="long"),
        # well-formed, but nothing can use them: eos ids that are not ids, undecodable token ids
        frame("ReadyMsg", who="tokenizer", info={"eos_ids": 5}),
        frame("ReadyMsg", who="tokenizer", info={"eos_ids": ["x"]}),
        frame("BatchTokenMsg", tokens=[{"__msg__": "TokenMsg", "uid": 5, "token_id": t} for t in (-5, 10**12)]),
        # a huge prompt of valid ids (the scheduler refuses it) and 8 MiB of noise
        frame("GenerateMsg", uid=rng.getrandbits(63), input_ids=[1] * 200_000, sampling=SAMPLING),
        rng.randbytes(8 << 20),
    ]
    return out


# ---- a server shared by the tests below ------------------------------------------------------
@pytest.fixture(scope="module")
def stale_folders():
    """Two socket folders like a SIGKILLed server leaves behind, made before the server starts:
    one whose launcher pid is gone (must be removed) and one whose pid lives (must be kept)."""
    gone = int(open("/proc/sys/kernel/pid_max").read()) + 1  # no process has it, ever
    dead = tempfile.mkdtemp(prefix=f"minisgl-{gone}-", dir=tempfile.gettempdir())
    with socket.socket(socket.AF_UNIX) as s:  # a socket file nobody listens on any more
        s.bind(os.path.join(dead, "tokenizer"))
    live = tempfile.mkdtemp(prefix=f"minisgl-{os.getpid()}-", dir=tempfile.gettempdir())
    yield dead, live
    for d in (dead, live):
        if os.path.isdir(d):
            for name in os.listdir(d):
                os.unlink(os.path.join(d, name))
            os.rmdir(d)


@pytest.fixture(scope="module")
def server(tiny_llama, tmp_path_factory, stale_folders):
    s = ServerProcess(["--model", str(tiny_llama), "--dtype", "float32"], tmp_path_factory.mktemp("server-ipc"))
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def paths(server) -> dict[str, str]:
    found = ipc_paths(server.proc.pid)
    assert sorted(found) == sorted(SOCKET_NAMES), f"expected the server's 4 sockets, found {found}"
    return found


def test_sockets_are_files_in_a_private_folder(server, paths):
    abstract = [p for p in paths.values() if p.startswith("@")]
    assert not abstract, f"abstract-namespace sockets can be reached by any local user: {abstract}"
    (folder,) = {os.path.dirname(p) for p in paths.values()}
    st = os.lstat(folder)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700, oct(st.st_mode)
    assert st.st_uid == os.getuid(), "the folder must belong to the server's user"
    assert len(paths["detokenizer"]) < 100, "unix socket paths are limited to ~107 bytes"
    for name, p in paths.items():
        mode = os.lstat(p).st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) & 0o077 == 0, f"{name}: {oct(mode)}"


def test_stale_folders_of_killed_servers_are_removed_at_start(server, stale_folders):
    dead, live = stale_folders
    assert not os.path.exists(dead), "the folder of a server whose launcher is gone should be removed at start"
    assert os.path.isdir(live), "a folder whose launcher pid is alive must be left alone"


def _probe_as(uid: int, paths: list[str], folders: list[str]) -> dict:
    """In a forked child that switches to ``uid``: try to list each folder and connect to each
    socket. Returns what happened to each (an errno name, or "ok")."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no pytest from here on, and always _exit
        out: dict = {}
        try:
            os.close(r)
            try:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            except OSError as e:
                out["cannot_switch"] = str(e)
            else:
                for f in folders:
                    try:
                        os.listdir(f)
                        out[f"list {f}"] = "ok"
                    except OSError as e:
                        out[f"list {f}"] = errno.errorcode.get(e.errno, str(e.errno))
                for p in paths:
                    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                        try:
                            s.connect("\0" + p[1:] if p.startswith("@") else p)
                            out[f"connect {p}"] = "ok"
                        except OSError as e:
                            out[f"connect {p}"] = errno.errorcode.get(e.errno, str(e.errno))
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data)


def test_another_user_cannot_reach_the_sockets(server, paths):
    folders = sorted({os.path.dirname(p) for p in paths.values() if not p.startswith("@")})
    result = _probe_as(NOBODY, sorted(paths.values()), folders)
    if "cannot_switch" in result:
        pytest.skip(f"this process cannot switch to uid {NOBODY} ({result['cannot_switch']}): run as root to test")
    reached = {k: v for k, v in result.items() if v == "ok"}
    assert not reached, f"uid {NOBODY} reached the server's internal sockets: {reached}"
    assert all(v in ("EACCES", "EPERM") for v in result.values()), result
    assert server.health() == 200


def test_forged_replies_and_aborts_miss_running_requests(server, paths):
    """Messages aimed at every small request id, again and again while a request streams: ids used
    to count from 1, so a forged reply was spliced into someone's answer and a forged abort cut it
    short."""
    prompt, n = [5, 6, 7, 8], 1000
    ref = completion(server, prompt, max_tokens=n)
    uids = range(1, 301)
    replies = [{"__msg__": "ReplyMsg", "uid": u, "text": "INJECTED", "token_ids": [42]} for u in uids]
    forged_replies = [frame("BatchReplyMsg", replies=replies[i : i + 100]) for i in range(0, len(replies), 100)]
    forged_aborts = [frame("AbortMsg", uid=u) for u in uids]
    streaming, rounds = threading.Event(), []

    def forge() -> None:  # a few rounds a second: this is about guessing ids (flooding: below)
        while streaming.is_set():
            push_frames(paths["frontend"], forged_replies, 1000)
            push_frames(paths["tokenizer"], forged_aborts, 1000)
            rounds.append(time.monotonic())
            time.sleep(0.2)

    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": True}
    text, errors = "", []
    forger = threading.Thread(target=forge, daemon=True)
    try:
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                if not streaming.is_set():  # it runs: now forge, until it ends
                    streaming.set()
                    forger.start()
                ev = json.loads(line[6:])
                if "error" in ev:
                    errors.append(ev["error"])
                else:
                    text += ev["choices"][0]["text"]
            ended = time.monotonic()
    finally:
        streaming.clear()
    forger.join(10)
    assert len([t for t in rounds if t < ended]) >= 2, "the request ended before the forged messages landed"
    assert not errors, f"a forged abort reached the request: {errors}"
    assert "INJECTED" not in text, "a forged reply was spliced into the answer"
    assert text == ref["text"], "the streamed answer differs from the same request's answer without the attack"


def test_malformed_frames_on_every_socket(server, paths):
    prompt = "Once upon a time"
    before = completion(server, prompt)
    pids = family(server)
    frames = malformed_frames()
    for name in SOCKET_NAMES:
        push_frames(paths[name], frames)
        push_frames(paths[name], [b"\x00" * OVERSIZED], 1000)  # alone: the receiver drops the connection
        assert server.proc.poll() is None, f"the server died of frames sent to the {name} socket:\n{server.logs()}"
    time.sleep(1.0)
    assert server.proc.poll() is None, server.logs()
    dead = [p for p in pids if not psutil.pid_exists(p) or psutil.Process(p).status() == psutil.STATUS_ZOMBIE]
    assert not dead, f"processes died: {dead}\n{server.logs()}"
    assert server.health() == 200, server.logs()
    assert completion(server, prompt) == before, "the answer changed after the attack"
    logs = server.err_path.read_text()
    for who in ("tokenizer", "scheduler", "detokenizer", "api-server"):
        n = len(re.findall(rf"(?<![\w-]){who}: dropped a malformed message", logs))
        assert 1 <= n <= 3, (
            f"{who}: expected the drops logged once (rate-limited), got {n} lines for {len(frames)} frames"
        )


class Flood:
    """A thread that sends ``frames`` to ``path`` over and over, as fast as the receiver takes them
    (one connection, ZMQ's default high-water marks), until stopped."""

    def __init__(self, path: str, frames: list[bytes]):
        self.path, self.frames, self.sent = path, frames, 0
        self.running = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Flood:
        self.running.set()
        self.thread.start()
        time.sleep(2.0)  # let the queues fill
        return self

    def __exit__(self, *exc) -> None:
        self.running.clear()
        self.thread.join(10)

    def _run(self) -> None:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.SNDTIMEO, 100)
        sock.connect(zmq_addr(self.path))
        while self.running.is_set():
            for f in self.frames:
                try:
                    sock.send(f, copy=False)
                    self.sent += 1
                except zmq.Again:
                    break
        sock.close(linger=0)
        ctx.term()


def test_a_flood_of_messages_starves_nobody(server, paths):
    """Well-formed messages as fast as the receiver takes them. The scheduler must still step
    between them (it used to read every waiting message first, so a request never advanced), and
    the API server still answer HTTP (its receiving task did not give the event loop back while
    frames were waiting, so /health and even SIGTERM went unanswered)."""
    body = {"prompt": [5, 6, 7], "max_tokens": 32, "temperature": 0, "ignore_eos": True}
    ref = completion(server, [5, 6, 7], 32)
    aborts = [frame("AbortMsg", uid=u) for u in range(1, 1001)]
    with Flood(paths["scheduler"], aborts) as flood:
        t0 = time.monotonic()
        r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
        took = time.monotonic() - t0
    assert r.status_code == 200 and r.json()["choices"][0] == ref, r.text
    assert took < 20, f"a 32-token request took {took:.1f} s while {flood.sent} aborts flooded the scheduler"
    replies = [{"__msg__": "ReplyMsg", "uid": u, "text": "x", "token_ids": [1]} for u in range(1, 101)]
    with Flood(paths["frontend"], [frame("BatchReplyMsg", replies=replies)] * 100) as flood:
        slowest = 0.0
        for _ in range(5):
            t0 = time.monotonic()
            assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200
            slowest = max(slowest, time.monotonic() - t0)
    assert slowest < 3, f"/health took {slowest:.1f} s while {flood.sent} replies flooded the API server"
    assert completion(server, [5, 6, 7], 32) == ref, "not served normally after the flood"


def test_the_scheduler_steps_between_bounded_batches_of_messages():
    """Against a flood that never drains, the scheduler's loop takes a bounded batch and steps:
    it used to read until its inbox was empty, so running requests could wait forever."""
    from minisgl.message import AbortMsg
    from minisgl.message import encode as encode_msg
    from minisgl.server.ipc import MsgReader
    from minisgl.server.scheduler_worker import ACCEPTS, SchedulerWorker

    class EndlessInbox:
        served = 0

        def poll(self, timeout: int) -> int:
            return 1

        def recv(self, flags: int = 0) -> bytes:
            self.served += 1
            if self.served > 100_000:
                raise RuntimeError("read 100000 messages without stepping once")
            return encode_msg(AbortMsg(self.served))

    worker = SchedulerWorker.__new__(SchedulerWorker)  # only what _recv touches
    worker.inbox, worker.reader = EndlessInbox(), MsgReader("scheduler", ACCEPTS)
    worker.sched = type("Busy", (), {"has_work": True})()
    msgs = worker._recv()
    assert 0 < len(msgs) <= 1024, len(msgs)


@settings(max_examples=500, deadline=None)
@given(data=st.one_of(st.binary(max_size=300), st.sampled_from(malformed_frames()[:-2])))
def test_decode_raises_bad_message_and_nothing_else(data):
    """Whatever the bytes: a message whose every field has its declared type, or ``BadMessage``
    (the receivers catch that one; anything else used to escape and kill the process)."""
    from dataclasses import fields

    from minisgl.message import BadMessage, decode

    try:
        msg = decode(data)
    except BadMessage:
        return
    for f in fields(msg):  # only a well-formed message gets here
        assert getattr(msg, f.name) is not None or "None" in str(f.type), (msg, f.name)


def test_decode_checks_every_field_and_the_receiver_kind():
    from minisgl.core import SamplingParams
    from minisgl.message import AbortMsg, BadMessage, GenerateMsg, TokenizeMsg, TokenMsg, decode, encode

    good = GenerateMsg(7, [1, 2, 3], SamplingParams(temperature=0.5, seed=3))
    assert decode(encode(good), (GenerateMsg,)) == good
    with pytest.raises(BadMessage, match="unexpected GenerateMsg"):
        decode(encode(good), (TokenizeMsg, AbortMsg))
    bad = [
        frame("GenerateMsg", uid=7, input_ids=[1, True], sampling=SAMPLING),  # a bool is not an id
        frame("GenerateMsg", uid=7, input_ids=[1, 2**63], sampling=SAMPLING),  # beyond int64
        frame("GenerateMsg", uid=7, input_ids=[1], sampling=SAMPLING | {"seed": 1.5}),
        frame("TokenMsg", uid=1, token_id=None),
        frame("TokenizeMsg", uid=1, sampling=SAMPLING, text=b"bytes"),
        frame("ErrorMsg", uid=1, message="m", status=200),  # not an error status
    ]
    for f in bad:
        with pytest.raises(BadMessage):
            decode(f)
    assert decode(frame("TokenMsg", uid=1, token_id=5)) == TokenMsg(1, 5)
    sp = decode(frame("GenerateMsg", uid=1, input_ids=[1], sampling=SAMPLING | {"temperature": 0})).sampling
    assert sp.temperature == 0, "an int where a float is declared is fine (msgpack keeps 0 an int)"


def test_request_ids_are_random_and_never_reused(monkeypatch):
    import secrets

    from minisgl.message import Addresses
    from minisgl.server import frontend

    fe = frontend.Frontend(Addresses.under("/nonexistent"))
    uids = [fe.new_uid() for _ in range(2000)]
    assert len(set(uids)) == len(uids)
    assert all(0 < u < 2**63 for u in uids), "uids must stay positive int64s for the scheduler"
    assert max(uids) > 2**60 and sorted(uids) != uids, f"request ids look guessable: {uids[:5]}"
    # a draw that is 0 or already in use (a running request, a stats request) is drawn again
    draws = iter([0, 5, 9, 11])
    monkeypatch.setattr(secrets, "randbits", lambda bits: next(draws))
    fe.routes, fe.stats_waiters = {5: None}, {9: None}
    assert fe.new_uid() == 11


def test_the_folder_is_removed_when_the_server_stops(server, paths):
    """Last in this module: it stops the shared server."""
    (folder,) = {os.path.dirname(p) for p in paths.values()}
    assert os.path.isdir(folder), f"no socket folder: {paths}"
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(15) == 0, server.logs()
    assert wait_until(lambda: not os.path.exists(folder), 5), f"{folder} was left behind: {os.listdir(folder)}"
