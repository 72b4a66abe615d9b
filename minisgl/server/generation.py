"""One HTTP request's sequences as the client sees them, and how they are answered (a JSON body or a stream of SSE).

The HTTP status is chosen once every sequence has produced its first reply (a token, or a refusal:
milliseconds), so bad input always gets a proper 4xx, even on a stream. A stream begins anyway after
``--sse-keepalive`` s (queued behind a full KV pool), and gets a ``KEEPALIVE`` after each such silence.

Stop *strings* are applied here, on the text (stop *token ids* are the scheduler's job), by the server's
``StopStrings`` (``minisgl.tokenizer.detokenizer``): text that might be the start of a stop string is held
back until it is known not to be one, and a sequence that hits one is aborted in the scheduler.

With ``--request-timeout`` (``Frontend.request_timeout``), a request still unfinished that many seconds after it
was submitted is aborted: a 504 before a stream begins, an error event after.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from minisgl.logprobs.api import SeqLogprobs
from minisgl.message import ErrorMsg, ReplyMsg, TokenizeMsg
from minisgl.server.errors import ApiError, ClientDisconnected, error_body
from minisgl.tokenizer.detokenizer import StopStrings

if TYPE_CHECKING:
    from minisgl.server.frontend import Frontend
    from minisgl.server.ops.metrics import SeqTimer, ServerMetrics


class Tick:
    """What ``Generation.pump`` returns when ``tick`` seconds passed with nothing from the engine."""


TICK = Tick()


@dataclass
class Seq:
    """One generated sequence (a choice) as the client sees it."""

    index: int
    uid: int
    stops: StopStrings  # the sequence's stop strings (cuts the text, holds back a possible start)
    text: str = ""  # the answer so far that may be sent: cut at a stop string, never its start
    sent: int = 0  # characters of text already sent to the client
    token_ids: list[int] = field(default_factory=list)
    ids_sent: int = 0
    finish_reason: str | None = None
    finish_sent: bool = False
    started: bool = False
    hit_stop_string: bool = False
    tail: str = ""  # the received text's end (past the cut): where the stop string that ended it begins
    prompt_tokens: int = 0
    cached_tokens: int = 0
    lp: SeqLogprobs = field(default_factory=SeqLogprobs)

    def feed(self, r: ReplyMsg) -> None:
        self.started = True
        self.prompt_tokens, self.cached_tokens = r.prompt_tokens, r.cached_tokens
        if self.finish_reason is not None:
            return
        self.token_ids += r.token_ids
        self.lp.feed(r)
        self.text += self.stops.feed(r.text)
        self.tail = (self.tail + r.text)[-max(map(len, self.stops.stops)) - len(r.text) :] if self.stops.stops else ""
        if self.stops.stopped:
            self.finish_reason, self.hit_stop_string = "stop", True
            return
        if r.finish_reason is not None:
            if r.finish_reason not in ("stop", "length"):
                raise ApiError(500, f"the engine ended the request unexpectedly ({r.finish_reason})")
            self.text += self.stops.flush()
            self.finish_reason = r.finish_reason

    def take_text(self) -> str:
        """New text that is safe to send: not possibly the start of a stop string."""
        out, self.sent = self.text[self.sent :], len(self.text)
        return out

    def take_ids(self) -> list[int]:
        out, self.ids_sent = self.token_ids[self.ids_sent :], len(self.token_ids)
        return out

    def take_finish(self) -> str | None:
        """The finish reason, once (after all the text has been taken)."""
        if self.finish_reason is None or self.finish_sent or self.sent < len(self.text):
            return None
        self.finish_sent = True
        return self.finish_reason


class Generation:
    """The sequences of one HTTP request, fed from one queue."""

    def __init__(self, fe: Frontend, msgs: list[TokenizeMsg], stops: list[str], n: int = 1):
        self.fe, self.msgs, self.n = fe, msgs, n
        self.metrics: ServerMetrics | None = None  # set before start() to time the sequences
        self._timers: dict[int, SeqTimer] = {}  # uid -> its clock, while it runs (with metrics)
        self.queue: asyncio.Queue = asyncio.Queue()
        self.seqs = [Seq(i, m.uid, fe.text_streams.stop_strings(stops)) for i, m in enumerate(msgs)]
        self.by_uid = {s.uid: s for s in self.seqs}
        self._getter: asyncio.Future | None = None
        self._gone: asyncio.Future | None = None  # done when the client disconnects
        self._deadline: float | None = None  # monotonic; set when submitted, if there is a timeout
        self.created = int(time.time())

    @property
    def done(self) -> bool:
        return all(s.finish_reason is not None for s in self.seqs)

    @property
    def all_started(self) -> bool:
        return all(s.started for s in self.seqs)

    async def start(self, request: Request | None, patience: float | None = None) -> bool:
        """Submit, and wait until every sequence has produced something (or raise its error).
        With ``patience`` (seconds), wait no longer: returns whether every sequence has replied."""
        now = time.monotonic()
        if self.fe.request_timeout is not None:
            self._deadline = now + self.fe.request_timeout
        if self.metrics is not None:
            self._timers = {m.uid: self.metrics.timer(now, m.uid) for m in self.msgs}
        self.fe.submit(self.msgs, self.queue)
        until = None if patience is None else now + patience
        try:
            while not self.all_started:
                if await self.pump(request, None if until is None else until - time.monotonic()) is TICK:
                    return False
            return True
        finally:
            self.stop_watching()

    async def updates(self, request: Request | None = None, beat: KeepAlive | None = None) -> AsyncIterator[Seq | Tick]:
        """Yield each sequence when it has news, until all are done; ``TICK`` when a keep-alive is owed (``beat``)."""
        for s in self.seqs:  # what start() already received
            yield s
        while not self.done:
            seq = await self.pump(request, None if beat is None else beat.left())
            if seq is not None:
                yield seq

    async def run(self, request: Request | None) -> None:
        try:
            async for _ in self.updates(request):
                pass
        finally:
            self.stop_watching()

    async def pump(self, request: Request | None, tick: float | None = None) -> Seq | Tick | None:
        """Feed one reply to its sequence (returned; None: not ours); ``TICK`` if ``tick`` s pass first."""
        item = await self._next(request, tick)
        if item is TICK:
            return TICK
        if isinstance(item, ErrorMsg):
            self._timers.pop(item.uid, None)  # refused (or the engine is gone): neither done nor aborted
            raise ApiError(item.status, item.message, item.param, item.code)
        seq = self.by_uid.get(item.uid)
        if seq is None:
            return None
        first, had = not seq.started, len(seq.token_ids)
        seq.feed(item)
        if (timer := self._timers.get(seq.uid)) is not None:
            now = time.monotonic()
            timer.reply(now, len(seq.token_ids) - had, first, seq.prompt_tokens, seq.cached_tokens)
            if seq.finish_reason is not None:
                timer.end(now, finished=True)
        if seq.finish_reason is not None:  # after a stop string the engine would go on generating: abort it
            (self.fe.abort if seq.hit_stop_string else self.fe.forget)(seq.uid)
        return seq

    async def _next(self, request: Request | None, tick: float | None = None) -> Any:
        left = None if self._deadline is None else self._deadline - time.monotonic()
        if left is not None and left <= 0:
            raise self._timed_out()
        if self._getter is None:
            if not self.queue.empty():
                return self.queue.get_nowait()
            if tick is not None and tick <= 0:
                return TICK
            # one getter task, never cancelled while we wait on it: cancelling a queue.get() that
            # has just taken an item would lose that item (a tick leaves it pending for the next call)
            self._getter = asyncio.ensure_future(self.queue.get())
        waits = {self._getter}
        if request is not None:
            if self._gone is None:
                self._gone = asyncio.ensure_future(_client_gone(request))
            waits.add(self._gone)
        ticks = tick is not None and (left is None or tick < left)  # the tick ends the wait, not the deadline
        timeout = max(0.0, tick) if ticks else left
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if self._getter.done():
            item, self._getter = self._getter.result(), None
            return item
        if self._gone is not None and self._gone.done():
            raise ClientDisconnected()
        if ticks:
            return TICK
        raise self._timed_out()

    def _timed_out(self) -> ApiError:
        # the caller's `finally` (close) aborts the sequences still running
        msg = f"the request did not finish within {self.fe.request_timeout:g} s (--request-timeout); it was aborted"
        return ApiError(504, msg, code="request_timeout")

    def stop_watching(self) -> None:
        """Stop listening for the client leaving (a streaming response listens by itself)."""
        if self._gone is not None:
            self._gone.cancel()
            self._gone = None

    def close(self) -> None:
        """Abort what is still running (client gone, error, shutdown) and stop routing."""
        for s in self.seqs:
            if s.finish_reason is None:
                self.fe.abort(s.uid)
                if (timer := self._timers.get(s.uid)) is not None:
                    timer.end(time.monotonic(), finished=False)
            else:
                self.fe.forget(s.uid)
        if self._getter is not None:
            self._getter.cancel()
            self._getter = None
        self.stop_watching()

    def usage(self) -> dict[str, Any]:
        first = [s for s in self.seqs if s.index % self.n == 0]  # the n choices of a prompt share it
        prompt = sum(s.prompt_tokens for s in first)
        completion = sum(len(s.token_ids) for s in self.seqs)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(s.cached_tokens for s in first)},
        }


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects. Only while nobody else reads ``receive`` (the body
    has been read; a streaming response is not running yet)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


# ---- answering: a JSON body or server-sent events ----------------------------------------------
def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


SSE_DONE = "data: [DONE]\n\n"
KEEPALIVE = ": keep-alive\n\n"  # an SSE comment: clients skip it; its bytes reset their read timeouts


class KeepAlive:
    """When a stream last sent a byte; ``left()``: seconds until it owes the client a ``KEEPALIVE``."""

    def __init__(self, every: float | None):
        self.every, self.last = every or None, time.monotonic()  # every: seconds; None (or 0): never

    def left(self) -> float | None:
        return None if self.every is None else self.every - (time.monotonic() - self.last)

    def sent(self, ev: str) -> str:
        self.last = time.monotonic()
        return ev


def stream_chunker(rid: str, kind: str, created: int, model: str, include_usage: bool):
    """``chunk(choices, usage)`` -> one SSE event of a streamed response of this ``kind``; ``usage``
    is sent only when the client asked for it (``stream_options.include_usage``)."""

    def chunk(choices: list[dict], usage: dict | None = None) -> str:
        obj = {"id": rid, "object": kind, "created": created, "model": model, "choices": choices}
        if include_usage:
            obj["usage"] = usage
        return sse(obj)

    return chunk


async def stream_events(gen: Generation, events) -> AsyncIterator[str]:
    """Run ``events`` (an async generator of SSE strings); end with an error event if the engine
    fails mid-stream; abort the sequences if the client goes away (the generator is cancelled)."""
    try:
        async for ev in events:
            yield ev
    except ApiError as e:
        yield sse(error_body(e.status, e.message, e.param, e.code))
        yield SSE_DONE
    finally:
        gen.close()


async def stream_or_collect(
    gen: Generation,
    request: Request,
    stream: bool,
    events: Callable[[Seq], Iterable[str]],
    body: Callable[[], dict[str, Any]],
    head: Iterable[str] = (),
    tail: Callable[[], Iterable[str]] = tuple,
) -> StreamingResponse | dict[str, Any]:
    """Submit ``gen`` and wait for every sequence's first reply (an engine refusal raises its 4xx
    here, before a stream begins). Then either stream ``head``, ``events(seq)`` for each update,
    ``tail()`` and ``[DONE]``, or run to the end and return ``body()``. Whatever way it ends (done,
    error, client gone), the sequences still running are aborted. A stream waits at most the app's
    ``sse_keepalive_s`` (None: off), then begins with keep-alive comments and holds ``head`` and the
    events back until every sequence has replied: a client sees the same events either way."""
    state = request.app.state
    gen.metrics = getattr(state, "metrics", None)
    beat = KeepAlive(getattr(state, "sse_keepalive_s", None) if stream else None)
    try:
        started = await gen.start(request, beat.every)
    except BaseException:
        gen.close()
        raise
    if stream:

        async def sse_events():
            held = not started  # head and events wait until every sequence has replied
            for ev in () if held else head:
                yield beat.sent(ev)
            async for s in gen.updates(beat=beat):
                if s is TICK:
                    yield beat.sent(KEEPALIVE)
                elif held and gen.all_started:
                    held = False  # then all that every sequence gathered meanwhile, as if it had just come
                    for ev in itertools.chain(head, *(events(x) for x in gen.seqs)):
                        yield beat.sent(ev)
                elif not held:
                    for ev in events(s):
                        yield beat.sent(ev)
            for ev in tail():
                yield ev
            yield SSE_DONE

        return StreamingResponse(stream_events(gen, sse_events()), media_type="text/event-stream")
    try:
        await gen.run(request)
    finally:
        gen.close()
    return body()
