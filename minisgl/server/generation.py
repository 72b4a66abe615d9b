"""One HTTP request's sequences as the client sees them, and how they are answered (a JSON body or
a stream of server-sent events).

The HTTP status is chosen only once every sequence has produced its first reply (a token or a
refusal), so bad input always gets a proper 4xx, even on a stream.

Stop *strings* are applied here, on the text (stop *token ids* are the scheduler's job), by the
server's ``StopStrings`` (``minisgl.tokenizer.detokenizer``): text that might be the start of a stop
string is held back until it is known not to be one, and a sequence that hits one is aborted in the
scheduler.

With ``--request-timeout`` (``Frontend.request_timeout``), a request still unfinished that many
seconds after it was submitted is aborted: a 504 before a stream begins, an error event after.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from minisgl.message import ErrorMsg, ReplyMsg, TokenizeMsg
from minisgl.server.errors import ApiError, ClientDisconnected, error_body
from minisgl.tokenizer.detokenizer import StopStrings

if TYPE_CHECKING:
    from minisgl.server.frontend import Frontend


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
    prompt_tokens: int = 0
    cached_tokens: int = 0

    def feed(self, r: ReplyMsg) -> None:
        self.started = True
        self.prompt_tokens, self.cached_tokens = r.prompt_tokens, r.cached_tokens
        if self.finish_reason is not None:
            return
        self.token_ids += r.token_ids
        self.text += self.stops.feed(r.text)
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

    async def start(self, request: Request | None) -> None:
        """Submit, and wait until every sequence has produced something (or raise its error)."""
        if self.fe.request_timeout is not None:
            self._deadline = time.monotonic() + self.fe.request_timeout
        self.fe.submit(self.msgs, self.queue)
        try:
            while not all(s.started for s in self.seqs):
                await self._pump(request)
        finally:
            self.stop_watching()

    async def updates(self, request: Request | None = None) -> AsyncIterator[Seq]:
        """Yield each sequence when it has news, until all are finished."""
        for s in self.seqs:  # what start() already received
            yield s
        while not self.done:
            seq = await self._pump(request)
            if seq is not None:
                yield seq

    async def run(self, request: Request | None) -> None:
        try:
            async for _ in self.updates(request):
                pass
        finally:
            self.stop_watching()

    async def _pump(self, request: Request | None) -> Seq | None:
        item = await self._next(request)
        if isinstance(item, ErrorMsg):
            raise ApiError(item.status, item.message, item.param, item.code)
        seq = self.by_uid.get(item.uid)
        if seq is None:
            return None
        seq.feed(item)
        if seq.finish_reason is not None:
            if seq.hit_stop_string:
                self.fe.abort(seq.uid)  # the engine would go on generating
            else:
                self.fe.forget(seq.uid)
        return seq

    async def _next(self, request: Request | None) -> Any:
        left = None if self._deadline is None else self._deadline - time.monotonic()
        if left is not None and left <= 0:
            raise self._timed_out()
        if self._getter is None:
            if not self.queue.empty():
                return self.queue.get_nowait()
            # one getter task, never cancelled while we wait on it: cancelling a queue.get() that
            # has just taken an item would lose that item
            self._getter = asyncio.ensure_future(self.queue.get())
        waits = {self._getter}
        if request is not None:
            if self._gone is None:
                self._gone = asyncio.ensure_future(_client_gone(request))
            waits.add(self._gone)
        await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        if self._getter.done():
            item, self._getter = self._getter.result(), None
            return item
        if self._gone is not None and self._gone.done():
            raise ClientDisconnected()
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
    error, client gone), the sequences still running are aborted."""
    try:
        await gen.start(request)
    except BaseException:
        gen.close()
        raise
    if stream:

        async def sse_events():
            for ev in head:
                yield ev
            async for s in gen.updates():
                for ev in events(s):
                    yield ev
            for ev in tail():
                yield ev
            yield SSE_DONE

        return StreamingResponse(stream_events(gen, sse_events()), media_type="text/event-stream")
    try:
        await gen.run(request)
    finally:
        gen.close()
    return body()
