"""The API server's end of the ZMQ pipeline (see ``minisgl.message``).

A request becomes one ``TokenizeMsg`` per generated sequence (``n`` per prompt), each with its own
uid: 63 random bits, so that nobody can aim a forged message at a request. Replies come back on
one PULL socket and are routed by uid to the queue of the HTTP request that owns the sequence; a
malformed frame is dropped (``minisgl.server.ipc``) and nothing stops the receiving task.

Liveness: at most one ``PingMsg`` is in flight through tokenizer -> scheduler -> detokenizer -> here,
a new one a second after the last came back. ``health()`` reports a problem when one has been in
flight longer than ``health_timeout``, unless the scheduler keeps saying it is inside one long
step (``BusyMsg``, at most ``MAX_STEP_S``): a stopped or hung worker shows within the bound, a
long prefill or a first-time kernel compile does not.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from minisgl.message import (
    AbortMsg,
    Addresses,
    BatchReplyMsg,
    BusyMsg,
    ErrorMsg,
    FlushCacheReqMsg,
    PingMsg,
    ReadyMsg,
    StatsMsg,
    StatsReqMsg,
    TextMsg,
    TextReqMsg,
    TokenizeMsg,
    encode,
)
from minisgl.server.args import HEALTH_TIMEOUT_S
from minisgl.server.errors import ApiError
from minisgl.server.ipc import MsgReader, bind_inbox

if TYPE_CHECKING:
    from fastapi import Request

logger = logging.getLogger("minisgl.server")

STATS_TIMEOUT_S = 10.0
# /v1/tokenize: the tokenizer worker answers after the prompts queued before it (an 8 MiB prompt
# takes seconds to tokenize), so it gets longer than a stats request
TEXT_TIMEOUT_S = 60.0
READY_PARTS = {"tokenizer", "scheduler"}
# from the detokenizer (and the tokenizer: ErrorMsg, TextMsg)
ACCEPTS = (BatchReplyMsg, ErrorMsg, StatsMsg, TextMsg, ReadyMsg, PingMsg, BusyMsg)
PING_EVERY_S = 1.0
MAX_STEP_S = 300.0  # a step longer than this is a hang, busy or not (CPU: an 8k-token prefill ~60 s)


class Frontend:
    """Sends requests into the pipeline and routes what comes back to the waiting HTTP requests.
    ``request_timeout`` (seconds, None = none) bounds each request (``Generation``); ``detokenizer``
    names the ``DETOKENIZERS`` entry whose ``StopStrings`` each sequence runs."""

    def __init__(
        self,
        addrs: Addresses,
        request_timeout: float | None = None,
        health_timeout: float = HEALTH_TIMEOUT_S,
        detokenizer: str = "default",
    ):
        from minisgl.tokenizer.detokenizer import text_streams

        self.addrs = addrs
        self.text_streams = text_streams(detokenizer)  # its stop_strings class cuts each sequence's text
        self.request_timeout, self.health_timeout = request_timeout, health_timeout
        self.routes: dict[int, asyncio.Queue] = {}  # uid -> queue of the HTTP request that owns it
        # uid -> the HTTP request waiting for one answer (StatsMsg, TextMsg): stats, flush, tokenize
        self.stats_waiters: dict[int, asyncio.Future] = {}
        self.served_model_name: str | None = None  # --served-model-name (set by the launcher)
        self.workers: dict[str, dict] = {}  # ReadyMsg.info by worker
        self.ready = asyncio.Event()
        self.failure: str | None = None  # set when the engine is gone (crash or shutdown)
        self.reader = MsgReader("api-server", ACCEPTS)
        self._ping_seq = 0
        self._ping_sent: float | None = None  # monotonic time of the ping in flight
        self._busy: tuple[float, float] = (-1e9, 0.0)  # (received at, step seconds) of the last BusyMsg
        self._task: asyncio.Task | None = None
        self._pinger: asyncio.Task | None = None

    @property
    def info(self) -> dict[str, Any]:
        return self.workers.get("scheduler", {})

    @property
    def model_name(self) -> str:
        """The name clients see (``/v1/models``, every response's ``model``): ``--served-model-name``,
        else ``--model`` as given (or the embedded model's name)."""
        return self.served_model_name or str(self.info.get("model", "minisgl"))

    async def start(self) -> None:
        import zmq
        import zmq.asyncio

        self._actx = zmq.asyncio.Context()
        self._inbox = bind_inbox(self._actx, self.addrs.frontend)
        # a plain (blocking-API) socket: aborts are sent from `finally` blocks of cancelled streams,
        # where nothing can be awaited; no high-water mark, so a send never blocks
        self._sctx = zmq.Context()
        self._out = self._sctx.socket(zmq.PUSH)
        self._out.setsockopt(zmq.SNDHWM, 0)
        self._out.connect(self.addrs.tokenizer)
        self._task = asyncio.create_task(self._recv_loop())
        self._task.add_done_callback(self._recv_loop_ended)
        self._pinger = asyncio.create_task(self._ping_loop())

    def close(self) -> None:
        for task in (self._task, self._pinger):
            if task is not None:
                task.cancel()
        for sock in (getattr(self, "_inbox", None), getattr(self, "_out", None)):
            if sock is not None:
                sock.close(linger=0)
        for ctx in (getattr(self, "_actx", None), getattr(self, "_sctx", None)):
            if ctx is not None:
                ctx.term()

    async def _recv_loop(self) -> None:
        while True:
            msg = self.reader.read(await self._inbox.recv())
            if msg is not None:
                try:
                    self._dispatch(msg)
                except Exception as e:
                    self.reader.drop(f"cannot route {type(msg).__name__}: {type(e).__name__}: {e}")
            # recv() does not suspend while frames are waiting: let HTTP requests (and a shutdown)
            # run between two frames, or a flood would starve them
            await asyncio.sleep(0)

    def _recv_loop_ended(self, task: asyncio.Task) -> None:
        if not task.cancelled():  # it never returns: it failed, and every reply would be lost
            logger.error("the API server stopped receiving replies: %r", task.exception())
            self.fail_all(f"the API server stopped receiving replies ({task.exception()!r})")

    async def _ping_loop(self) -> None:
        await self.ready.wait()
        while True:
            await asyncio.sleep(PING_EVERY_S)
            if self._ping_sent is None:
                self._ping_seq += 1
                self._ping_sent = time.monotonic()
                self._out.send(encode(PingMsg(self._ping_seq)))

    def health(self) -> str | None:
        """Why the server cannot serve now (None: it can)."""
        if self.failure is not None:
            return self.failure
        if not self.ready.is_set():
            return "the model is loading"
        now, sent = time.monotonic(), self._ping_sent
        if sent is None or now - sent <= self.health_timeout:
            return None
        busy_at, step_s = self._busy
        if now - busy_at <= self.health_timeout:  # the scheduler is alive, inside one long step
            if step_s <= MAX_STEP_S:
                return None
            return f"the scheduler has been inside one step for {step_s:.0f} s (limit {MAX_STEP_S:.0f} s): hung?"
        return (
            f"no heartbeat from the engine for {now - sent:.1f} s (--health-timeout {self.health_timeout:g}): "
            "a worker process (tokenizer, scheduler or detokenizer) is stopped or hung"
        )

    def _dispatch(self, msg: Any) -> None:
        if isinstance(msg, BatchReplyMsg):
            for r in msg.replies:
                q = self.routes.get(r.uid)
                if q is not None:
                    q.put_nowait(r)
        elif isinstance(msg, ErrorMsg):
            q = self.routes.get(msg.uid)
            if q is not None:
                q.put_nowait(msg)
        elif isinstance(msg, (StatsMsg, TextMsg)):
            fut = self.stats_waiters.pop(msg.uid, None)
            if fut is not None and not fut.done():
                fut.set_result(msg.stats if isinstance(msg, StatsMsg) else msg)
        elif isinstance(msg, ReadyMsg):
            self.workers[msg.who] = msg.info
            logger.info("%s is ready", msg.who)
            if READY_PARTS <= set(self.workers):
                self.ready.set()
        elif isinstance(msg, PingMsg):
            if msg.seq == self._ping_seq:
                self._ping_sent = None
        elif isinstance(msg, BusyMsg):
            self._busy = (time.monotonic(), msg.step_s)

    def check_ready(self) -> None:
        if self.failure is not None:
            raise ApiError(503, self.failure)
        if not self.ready.is_set():
            raise ApiError(503, "the model is still loading; retry when GET /health answers 200")

    def new_uid(self) -> int:
        """A request id nobody can guess (63 random bits: an int64 everywhere), not one in use."""
        while True:
            uid = secrets.randbits(63)
            if uid and uid not in self.routes and uid not in self.stats_waiters:
                return uid

    def submit(self, msgs: list[TokenizeMsg], queue: asyncio.Queue) -> None:
        for m in msgs:
            self.routes[m.uid] = queue
            self._out.send(encode(m))

    def abort(self, uid: int) -> None:
        self.routes.pop(uid, None)
        if self.failure is None:
            import zmq

            self._out.send(encode(AbortMsg(uid)), zmq.NOBLOCK)

    def forget(self, uid: int) -> None:
        self.routes.pop(uid, None)

    async def _ask(self, make: Callable[[int], Any], what: str, timeout: float = STATS_TIMEOUT_S) -> Any:
        """Send ``make(uid)`` down the pipeline and wait for the one answer that comes back with
        that uid (a ``StatsMsg``'s dict, or a ``TextMsg``); 503 if none comes in time."""
        self.check_ready()
        uid = self.new_uid()
        fut = asyncio.get_running_loop().create_future()
        self.stats_waiters[uid] = fut
        self._out.send(encode(make(uid)))
        try:
            result = await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise ApiError(503, f"the engine did not answer the {what} request in time") from None
        finally:
            self.stats_waiters.pop(uid, None)
        if result is None:  # fail_all: the engine is gone
            raise ApiError(503, self.failure or "the engine stopped")
        return result

    async def stats(self) -> dict[str, Any]:
        return await self._ask(StatsReqMsg, "stats")

    async def flush_cache(self) -> dict[str, Any]:
        """The scheduler's answer: ``{"flushed": bool, "message": str, "freed_tokens": int}``."""
        return await self._ask(FlushCacheReqMsg, "flush_cache")

    async def text(
        self, texts: list[str] | None = None, token_ids: list[list[int]] | None = None, **flags: bool
    ) -> TextMsg:
        """Tokenize ``texts`` or detokenize ``token_ids`` in the tokenizer worker (which holds the
        tokenizer: the API server loads none); ``flags``: ``TextReqMsg``'s. A 400 for input the
        tokenizer refuses."""
        make = lambda uid: TextReqMsg(uid, texts, token_ids, **flags)
        reply: TextMsg = await self._ask(make, "tokenize", TEXT_TIMEOUT_S)
        if reply.error is not None:
            raise ApiError(400, reply.error, "prompt" if texts is not None else "tokens")
        return reply

    def fail_all(self, message: str) -> None:
        """The engine is gone: every waiting request gets a 503 instead of hanging."""
        if self.failure is None:
            self.failure = message
        for uid, q in list(self.routes.items()):
            q.put_nowait(ErrorMsg(uid, message, 503))
        self.routes.clear()
        for fut in self.stats_waiters.values():
            if not fut.done():
                fut.set_result(None)


def frontend_of(request: Request) -> Frontend:
    """The app's one ``Frontend`` (``create_app`` puts it in ``app.state``)."""
    return request.app.state.frontend
