"""ASGI middleware that runs before any routing: the API key check and the request-size limit."""

from __future__ import annotations

import hmac

from minisgl.server.errors import error_response

MAX_BODY_BYTES = 8 << 20  # larger request bodies get a 413
# answered without an API key (load balancers probe it); /metrics is not: its counters describe
# the traffic, so a Prometheus scraper sends the key (its `authorization` setting)
OPEN_PATHS = {"/health"}


def bearer_token(authorization: bytes) -> bytes | None:
    """The credentials of an ``Authorization: Bearer <token>`` header value; the scheme's name is
    case-insensitive (RFC 7235), and one or more spaces follow it."""
    scheme, _, token = authorization.partition(b" ")
    return token.lstrip(b" ") if scheme.lower() == b"bearer" else None


class Guard:
    """Refuses a missing or wrong API key (401) and a body larger than ``max_body`` (413)."""

    def __init__(self, app, api_key: str | None, max_body: int = MAX_BODY_BYTES):
        self.app, self.max_body = app, max_body
        # ASCII (checked by the command line): the header's bytes compare with these exactly
        self.api_key = api_key.encode("ascii") if api_key is not None else None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if self.api_key is not None and scope["path"] not in OPEN_PATHS:
            token = bearer_token(headers.get(b"authorization", b""))
            # compare_digest takes the same time wherever the key and the token differ
            if token is None or not hmac.compare_digest(token, self.api_key):
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
