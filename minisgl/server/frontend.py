"""The API server's end of the ZMQ pipeline (see ``minisgl.message``).

A request becomes one ``TokenizeMsg`` per generated sequence (``n`` per prompt), each with its own
uid. Replies come back on one PULL socket and are routed by uid to the queue of the HTTP request
that owns the sequence.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import TYPE_CHECKING, Any

from minisgl.message import (
    AbortMsg,
    Addresses,
    BatchReplyMsg,
    ErrorMsg,
    ReadyMsg,
    StatsMsg,
    StatsReqMsg,
    TokenizeMsg,
    decode,
    encode,
)
from minisgl.server.errors import ApiError

if TYPE_CHECKING:
    from fastapi import Request

logger = logging.getLogger("minisgl.server")

STATS_TIMEOUT_S = 10.0
READY_PARTS = {"tokenizer", "scheduler"}


class Frontend:
    """Sends requests into the pipeline and routes what comes back to the waiting HTTP requests."""

    def __init__(self, addrs: Addresses):
        self.addrs = addrs
        self.routes: dict[int, asyncio.Queue] = {}  # uid -> queue of the HTTP request that owns it
        self.stats_waiters: dict[int, asyncio.Future] = {}
        self.workers: dict[str, dict] = {}  # ReadyMsg.info by worker
        self.ready = asyncio.Event()
        self.failure: str | None = None  # set when the engine is gone (crash or shutdown)
        self._uids = itertools.count(1)
        self._task: asyncio.Task | None = None

    @property
    def info(self) -> dict[str, Any]:
        return self.workers.get("scheduler", {})

    async def start(self) -> None:
        import zmq
        import zmq.asyncio

        self._actx = zmq.asyncio.Context()
        self._inbox = self._actx.socket(zmq.PULL)
        self._inbox.bind(self.addrs.frontend)
        # a plain (blocking-API) socket: aborts are sent from `finally` blocks of cancelled streams,
        # where nothing can be awaited; no high-water mark, so a send never blocks
        self._sctx = zmq.Context()
        self._out = self._sctx.socket(zmq.PUSH)
        self._out.setsockopt(zmq.SNDHWM, 0)
        self._out.connect(self.addrs.tokenizer)
        self._task = asyncio.create_task(self._recv_loop())

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for sock in (getattr(self, "_inbox", None), getattr(self, "_out", None)):
            if sock is not None:
                sock.close(linger=0)
        for ctx in (getattr(self, "_actx", None), getattr(self, "_sctx", None)):
            if ctx is not None:
                ctx.term()

    async def _recv_loop(self) -> None:
        while True:
            msg = decode(await self._inbox.recv())
            try:
                self._dispatch(msg)
            except Exception:
                logger.exception("cannot route %s", type(msg).__name__)

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
        elif isinstance(msg, StatsMsg):
            fut = self.stats_waiters.pop(msg.uid, None)
            if fut is not None and not fut.done():
                fut.set_result(msg.stats)
        elif isinstance(msg, ReadyMsg):
            self.workers[msg.who] = msg.info
            logger.info("%s is ready", msg.who)
            if READY_PARTS <= set(self.workers):
                self.ready.set()
        else:
            logger.warning("unexpected message %s", type(msg).__name__)

    def check_ready(self) -> None:
        if self.failure is not None:
            raise ApiError(503, self.failure)
        if not self.ready.is_set():
            raise ApiError(503, "the model is still loading; retry when GET /health answers 200")

    def new_uid(self) -> int:
        return next(self._uids)

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

    async def stats(self) -> dict[str, Any]:
        self.check_ready()
        uid = self.new_uid()
        fut = asyncio.get_running_loop().create_future()
        self.stats_waiters[uid] = fut
        self._out.send(encode(StatsReqMsg(uid)))
        try:
            result = await asyncio.wait_for(fut, STATS_TIMEOUT_S)
        except TimeoutError:
            raise ApiError(503, "the scheduler did not answer the stats request in time") from None
        finally:
            self.stats_waiters.pop(uid, None)
        if result is None:
            raise ApiError(503, self.failure or "the engine stopped")
        return result

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
