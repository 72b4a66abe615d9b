"""The API server: FastAPI routes in front, the ZMQ pipeline behind (see ``minisgl.message``).

A request becomes one ``TokenizeMsg`` per generated sequence (``n`` per prompt), each with its own
uid. Replies come back on one PULL socket and are routed by uid to the queue of the HTTP request
that owns the sequence. The HTTP status is chosen only once every sequence has produced its first
reply (a token or a refusal), so bad input always gets a proper 4xx, even on a stream.

Stop *strings* are applied here, on the text (stop *token ids* are the scheduler's job): text
that might be the start of a stop string is held back until it is known not to be one, and a
sequence that hits one is aborted in the scheduler.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import json
import logging
import os
import re
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from minisgl.core import SamplingParams
from minisgl.message import (
    AbortMsg,
    BatchReplyMsg,
    ErrorMsg,
    ReadyMsg,
    ReplyMsg,
    StatsMsg,
    StatsReqMsg,
    TokenizeMsg,
    decode,
    encode,
)
from minisgl.server.process import Addresses
from minisgl.server.protocol import (
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
)

logger = logging.getLogger("minisgl.server")

MAX_BODY_BYTES = 8 << 20  # larger request bodies get a 413
STATS_TIMEOUT_S = 10.0
OPEN_PATHS = {"/health"}  # answered without an API key (load balancers probe it)
READY_PARTS = {"tokenizer", "scheduler"}


# ---- errors ------------------------------------------------------------------------------------
class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


class ClientDisconnected(Exception):
    pass


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error object."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status)


_UNION_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def format_validation_errors(errors: list[dict]) -> tuple[str, str | None]:
    """pydantic's error list as one readable sentence and the first offending field."""
    parts: list[str] = []
    param = None
    for e in errors[:4]:
        if e.get("type") == "json_invalid":
            return f"the request body is not valid JSON ({e.get('ctx', {}).get('error', 'parse error')})", None
        # drop 'body' and the tags pydantic adds for the member of a union it tried ('list[int]', ...)
        loc = [
            str(x)
            for x in e.get("loc", ())
            if isinstance(x, int) or (x != "body" and x not in _UNION_TAGS and re.fullmatch(r"[a-z_][a-z0-9_]*", x))
        ]
        where = ".".join(loc)
        msg = str(e.get("msg", "invalid value")).removeprefix("Value error, ")
        if not where and e.get("type") == "missing":
            msg = "the request body is missing: send a JSON object"
        parts.append(f"{where}: {msg}" if where else msg)
        param = param or where or None
    return "; ".join(dict.fromkeys(parts)) or "invalid request", param


# ---- the ZMQ side ------------------------------------------------------------------------------
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


# ---- one request's sequences -------------------------------------------------------------------
@dataclass
class Seq:
    """One generated sequence (a choice) as the client sees it."""

    index: int
    uid: int
    stops: list[str]
    text: str = ""  # the answer so far, cut at a stop string
    sent: int = 0  # characters of text already sent to the client
    token_ids: list[int] = field(default_factory=list)
    ids_sent: int = 0
    finish_reason: str | None = None
    finish_sent: bool = False
    started: bool = False
    hit_stop_string: bool = False
    prompt_tokens: int = 0
    cached_tokens: int = 0
    _searched: int = 0  # text[:_searched] holds no stop string

    def feed(self, r: ReplyMsg) -> None:
        self.started = True
        self.prompt_tokens, self.cached_tokens = r.prompt_tokens, r.cached_tokens
        if self.finish_reason is not None:
            return
        self.token_ids += r.token_ids
        self.text += r.text
        if self.stops:
            longest = max(map(len, self.stops))
            start = max(0, self._searched - longest + 1)
            hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
            if hits:
                self.text = self.text[: min(hits)]
                self.finish_reason, self.hit_stop_string = "stop", True
                return
            self._searched = len(self.text)
        if r.finish_reason is not None:
            if r.finish_reason not in ("stop", "length"):
                raise ApiError(500, f"the engine ended the request unexpectedly ({r.finish_reason})")
            self.finish_reason = r.finish_reason

    def take_text(self) -> str:
        """New text that is safe to send: not possibly the start of a stop string."""
        end, unsent = len(self.text), len(self.text) - self.sent
        if self.finish_reason is None:  # hold back the longest tail that begins some stop string
            for s in self.stops:
                for k in range(min(len(s) - 1, unsent), 0, -1):
                    if self.text.endswith(s[:k]):
                        end = min(end, len(self.text) - k)
                        break
        out, self.sent = self.text[self.sent : end], max(self.sent, end)
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
        self.seqs = [Seq(i, m.uid, stops) for i, m in enumerate(msgs)]
        self.by_uid = {s.uid: s for s in self.seqs}
        self._getter: asyncio.Future | None = None
        self._gone: asyncio.Future | None = None  # done when the client disconnects
        self.created = int(time.time())

    @property
    def done(self) -> bool:
        return all(s.finish_reason is not None for s in self.seqs)

    async def start(self, request: Request | None) -> None:
        """Submit, and wait until every sequence has produced something (or raise its error)."""
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
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        if self._getter.done():
            item, self._getter = self._getter.result(), None
            return item
        raise ClientDisconnected()

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


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def stream_chunker(rid: str, kind: str, created: int, model: str, include_usage: bool):
    """``chunk(choices, usage)`` -> one SSE event of a streamed response of this ``kind``; ``usage``
    is sent only when the client asked for it (``stream_options.include_usage``)."""

    def chunk(choices: list[dict], usage: dict | None = None) -> str:
        obj = {"id": rid, "object": kind, "created": created, "model": model, "choices": choices}
        if include_usage:
            obj["usage"] = usage
        return sse(obj)

    return chunk


SSE_DONE = "data: [DONE]\n\n"


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


# ---- the app -----------------------------------------------------------------------------------
class Guard:
    """ASGI middleware: the API key check and the request-size limit, before any routing."""

    def __init__(self, app, api_key: str | None, max_body: int = MAX_BODY_BYTES):
        self.app, self.api_key, self.max_body = app, api_key, max_body

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if self.api_key is not None and scope["path"] not in OPEN_PATHS:
            given = headers.get(b"authorization", b"").decode("latin-1")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
                msg = "missing or wrong API key: send the header `Authorization: Bearer <key>`"
                return await error_response(401, msg, code="invalid_api_key")(scope, receive, send)
        too_big = lambda: error_response(413, f"the request body is larger than {self.max_body} bytes")
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            return await too_big()(scope, receive, send)
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        # a chunked body has no length up front: read it here, counting, then replay it
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body:
                return await too_big()(scope, receive, send)
            if not msg.get("more_body"):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def create_app(addrs: Addresses, api_key: str | None = None) -> FastAPI:
    fe = Frontend(addrs)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await fe.start()
        try:
            yield
        finally:
            fe.fail_all("the server is shutting down")
            fe.close()

    app = FastAPI(title="minisgl", lifespan=lifespan)
    app.state.frontend = fe
    app.add_middleware(Guard, api_key=api_key)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError):
        return error_response(e.status, e.message, e.param, e.code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, e: RequestValidationError):
        return error_response(400, *format_validation_errors(list(e.errors())))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        if e.status_code == 404:
            return error_response(404, f"no route {request.method} {request.url.path}", code="not_found")
        if e.status_code == 405:
            return error_response(405, f"{request.method} is not allowed on {request.url.path}")
        return error_response(e.status_code, str(e.detail))

    @app.exception_handler(ClientDisconnected)
    async def _gone(request: Request, e: ClientDisconnected):
        return Response(status_code=499)  # nobody reads it; the request was aborted

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):
        logger.exception("internal error on %s", request.url.path)
        return error_response(500, f"internal error: {type(e).__name__}: {e}")

    # ---- helpers shared by the generation routes ----
    def model_name() -> str:
        return str(fe.info.get("model", "minisgl"))

    def check_common(req, max_tokens: int | None) -> None:
        fe.check_ready()
        bad = req.unsupported_field()
        if bad is not None:
            raise ApiError(400, f"{bad} is not supported by this server", param=bad)
        ctx = int(fe.info["max_seq_len"])
        if max_tokens is not None and max_tokens > ctx:
            raise ApiError(400, f"max_tokens is {max_tokens} but the model's context is {ctx} tokens", "max_tokens")

    def checked(sp: SamplingParams) -> SamplingParams:
        try:
            sp.validate()
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        return sp

    def choice_sampling(sp: SamplingParams, j: int) -> SamplingParams:
        # the n choices of a seeded request must differ, and still be repeatable
        return sp if sp.seed is None or j == 0 else replace(sp, seed=(sp.seed + j) % 2**63)

    async def begin(gen: Generation, request: Request) -> None:
        try:
            await gen.start(request)
        except BaseException:
            gen.close()
            raise

    async def finish(gen: Generation, request: Request) -> None:
        try:
            await gen.run(request)
        finally:
            gen.close()

    # ---- routes ----
    @app.get("/health")
    async def health():
        if fe.failure is not None:
            return error_response(503, fe.failure)
        if not fe.ready.is_set():
            return error_response(503, "the model is loading")
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        fe.check_ready()
        return {"object": "list", "data": [_model_card(fe.info)]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        fe.check_ready()
        if model_id != model_name():
            raise ApiError(404, f"model {model_id!r} not found; this server serves {model_name()!r}", "model")
        return _model_card(fe.info)

    @app.get("/stats")
    async def stats():
        s = await fe.stats()
        procs = {"api_server": os.getpid(), **getattr(app.state, "processes", {})}
        s["server"] = {"open_sequences": len(fe.routes), "processes": procs}
        return s

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        max_tokens = req.requested_max_tokens
        check_common(req, max_tokens)
        sp = checked(req.sampling(max_tokens or 1))
        messages = [m.as_template_input() for m in req.messages]
        msgs = [
            TokenizeMsg(fe.new_uid(), choice_sampling(sp, j), messages=messages, auto_max_tokens=max_tokens is None)
            for j in range(req.n)
        ]
        gen = Generation(fe, msgs, req.stop, req.n)
        await begin(gen, request)
        rid, model = f"chatcmpl-{uuid.uuid4().hex}", model_name()

        chunk = stream_chunker(rid, "chat.completion.chunk", gen.created, model, req.include_usage)

        async def events():
            for s in gen.seqs:
                d = {"role": "assistant", "content": ""}
                yield chunk([{"index": s.index, "delta": d, "logprobs": None, "finish_reason": None}])
            async for s in gen.updates():
                text = s.take_text()
                if text:
                    d = {"content": text}
                    yield chunk([{"index": s.index, "delta": d, "logprobs": None, "finish_reason": None}])
                reason = s.take_finish()
                if reason:
                    yield chunk([{"index": s.index, "delta": {}, "logprobs": None, "finish_reason": reason}])
            if req.include_usage:
                yield chunk([], gen.usage())
            yield SSE_DONE

        if req.stream:
            return StreamingResponse(stream_events(gen, events()), media_type="text/event-stream")
        await finish(gen, request)
        choices = [
            {
                "index": s.index,
                "message": {"role": "assistant", "content": s.text},
                "logprobs": None,
                "finish_reason": s.finish_reason,
            }
            for s in gen.seqs
        ]
        return {
            "id": rid,
            "object": "chat.completion",
            "created": gen.created,
            "model": model,
            "choices": choices,
            "usage": gen.usage(),
        }

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        check_common(req, req.max_tokens)
        sp = checked(req.sampling(req.max_tokens or COMPLETIONS_DEFAULT_MAX_TOKENS))
        msgs = []
        for p in req.prompts():
            for j in range(req.n):
                text, ids = (p, None) if isinstance(p, str) else (None, p)
                msgs.append(TokenizeMsg(fe.new_uid(), choice_sampling(sp, j), text=text, input_ids=ids))
        gen = Generation(fe, msgs, req.stop, req.n)
        await begin(gen, request)
        rid, model = f"cmpl-{uuid.uuid4().hex}", model_name()

        chunk = stream_chunker(rid, "text_completion", gen.created, model, req.include_usage)

        async def events():
            async for s in gen.updates():
                # a chunk per step with new tokens, even if their text is not complete yet (or the
                # model has no tokenizer): clients time tokens by chunks
                text, new_ids = s.take_text(), s.take_ids()
                reason = s.take_finish()
                if text or new_ids or reason:
                    yield chunk([{"index": s.index, "text": text, "logprobs": None, "finish_reason": reason}])
            if req.include_usage:
                yield chunk([], gen.usage())
            yield SSE_DONE

        if req.stream:
            return StreamingResponse(stream_events(gen, events()), media_type="text/event-stream")
        await finish(gen, request)
        choices = [
            {"index": s.index, "text": s.text, "logprobs": None, "finish_reason": s.finish_reason} for s in gen.seqs
        ]
        return {
            "id": rid,
            "object": "text_completion",
            "created": gen.created,
            "model": model,
            "choices": choices,
            "usage": gen.usage(),
        }

    @app.post("/generate")
    async def generate(req: GenerateRequest, request: Request):
        """Native API: greedy by default (``SamplingParams``' defaults); returns token ids too."""
        fe.check_ready()
        if (req.text is None) == (req.input_ids is None):
            raise ApiError(400, "give exactly one of text or input_ids", "text")
        if req.text == "" or req.input_ids == []:
            raise ApiError(400, "the prompt is empty", "text" if req.text is not None else "input_ids")
        p = req.sampling_params
        ctx = int(fe.info["max_seq_len"])
        if p.max_new_tokens > ctx:
            raise ApiError(400, f"max_new_tokens is {p.max_new_tokens} but the context is {ctx} tokens")
        msg = TokenizeMsg(fe.new_uid(), checked(p.sampling()), text=req.text, input_ids=req.input_ids)
        gen = Generation(fe, [msg], p.stop)
        await begin(gen, request)
        rid = uuid.uuid4().hex

        def meta(s: Seq) -> dict:
            return {
                "id": rid,
                "finish_reason": s.finish_reason,
                "prompt_tokens": s.prompt_tokens,
                "completion_tokens": len(s.token_ids),
                "cached_tokens": s.cached_tokens,
            }

        async def events():
            async for s in gen.updates():
                text, ids = s.take_text(), s.take_ids()
                reason = s.take_finish()
                if text or ids or reason:
                    yield sse({"text": text, "output_ids": ids, "meta_info": meta(s) | {"finish_reason": reason}})
            yield SSE_DONE

        if req.stream:
            return StreamingResponse(stream_events(gen, events()), media_type="text/event-stream")
        await finish(gen, request)
        s = gen.seqs[0]
        return {"text": s.text, "output_ids": s.token_ids, "meta_info": meta(s)}

    return app


def _model_card(info: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": str(info.get("model", "minisgl")),
        "object": "model",
        "created": 0,
        "owned_by": "minisgl",
        "max_model_len": info.get("max_seq_len"),
    }
