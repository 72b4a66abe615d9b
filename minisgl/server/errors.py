"""HTTP errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Every failure a client can see goes through here, including FastAPI's own (a body that fails
validation becomes one readable 400 sentence, an unknown route a 404 that names it) and
unexpected exceptions (a 500 that names the exception rather than a bare "Internal Server Error").

An error response never costs the client its keep-alive connection: Starlette's handler for
``Exception`` re-raises after answering, and uvicorn then closes the connection (the client's next
request on it may meet a reset), so unexpected exceptions are answered by ``InternalErrors`` instead.
"""

from __future__ import annotations

import logging
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger("minisgl.server")


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


class ClientDisconnected(Exception):
    pass


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error object."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    # a message that quotes the input could hold a lone surrogate, which the UTF-8 body cannot carry
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
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


def install_error_handlers(app: FastAPI) -> None:
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

    app.add_middleware(InternalErrors)  # added last: outside every other middleware


class InternalErrors:
    """An exception nothing else handled becomes a 500 in OpenAI's shape, and is *not* re-raised, so
    the server keeps the connection open. One raised after the response began (mid-stream) cannot
    be answered any more: it propagates, and the server ends that connection."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as e:
            if started:
                raise
            logger.exception("internal error on %s", scope.get("path"))
            await error_response(500, f"internal error: {type(e).__name__}: {e}")(scope, receive, send)
