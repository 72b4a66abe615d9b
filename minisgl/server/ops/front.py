"""The front of ``--dp N``: the one address clients reach; it checks the API key on every route (as a
single server does: all but ``/health``) and forwards to sglang-router, which listens on loopback only.

sglang-router checks ``--api-key`` on some of its routes and not on others (0.3.2 answered
``/engine_metrics``, which fans out to every replica, ``/v1/models``, ``/get_server_info``,
``/readiness`` and ``/health_generate`` without it), so it is never exposed: whatever route it adds in a
later version is behind this check too. The front also gives the router's answers OpenAI's shape where
the router has its own: a ``/v1/completions`` without ``model`` gets ``"model": "unknown"`` (what the
router writes into a chat request without one, served as a request that names no model) instead of the
router's plain-text 422, and any other error the router answers in plain text becomes ``{"error":
{...}}`` (its 422 for a body it cannot read a 400, as a replica answers). A streamed answer passes
through as it comes; a client that leaves closes the router's stream, which closes the replica's (it
aborts the request).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time

import httpx

from minisgl.server.errors import error_response
from minisgl.server.ops.middleware import Guard

logger = logging.getLogger("minisgl.dp")

HOP = {b"host", b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"te", b"upgrade"}
UNNAMED = "unknown"  # openai_routes.ROUTER_UNNAMED: served as a request without a model


class Front:
    """ASGI app forwarding every request to ``upstream`` (the router); wrap it in ``Guard``."""

    def __init__(self, upstream: str):
        self.upstream = upstream
        self.client: httpx.AsyncClient | None = None  # made in the server's event loop

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        if self.client is None:
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)  # a stream holds one
            self.client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0), limits=limits)
        body = b""
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        if scope["method"] == "POST" and scope["path"] == "/v1/completions":
            body = _named(body)
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in HOP]
        url = self.upstream + scope["path"] + (f"?{scope['query_string'].decode()}" if scope["query_string"] else "")
        try:
            req = self.client.build_request(scope["method"], url, headers=headers, content=body)
            resp = await self.client.send(req, stream=True)
        except httpx.HTTPError as e:
            return await error_response(503, f"the router is unreachable ({type(e).__name__})")(scope, receive, send)
        try:
            if resp.status_code >= 400 and "json" not in resp.headers.get("content-type", ""):
                text = (await resp.aread()).decode(errors="replace").strip() or resp.reason_phrase
                status = 400 if resp.status_code == 422 else resp.status_code  # a malformed body: 400, as ours
                return await error_response(status, text)(scope, receive, send)
            out = [(k.encode(), v.encode()) for k, v in resp.headers.items() if k.encode() not in HOP]
            await send({"type": "http.response.start", "status": resp.status_code, "headers": out})
            stream = asyncio.ensure_future(_relay(resp, send))
            left = asyncio.ensure_future(_disconnected(receive))
            await asyncio.wait({stream, left}, return_when=asyncio.FIRST_COMPLETED)
            whole = stream.done() and not stream.cancelled() and stream.exception() is None
            for task in (stream, left):
                task.cancel()
            await asyncio.gather(stream, left, return_exceptions=True)
            if whole:
                await send({"type": "http.response.body", "body": b""})
        finally:
            await resp.aclose()  # the router's stream closes with the client's


async def _relay(resp: httpx.Response, send) -> None:
    async for chunk in resp.aiter_raw():
        await send({"type": "http.response.body", "body": chunk, "more_body": True})


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _named(body: bytes) -> bytes:
    """A completions body that names no model names ``UNNAMED`` (sglang-router refuses it otherwise)."""
    try:
        req = json.loads(body)
    except ValueError:
        return body  # the replica says what is wrong with it
    if isinstance(req, dict) and "model" not in req:
        return json.dumps({**req, "model": UNNAMED}).encode()
    return body


def start_front(host: str, port: int, upstream: str, api_key: str | None) -> tuple[object, threading.Thread]:
    """Serve the front on ``host:port`` in a thread of this process; returns (uvicorn server, thread)
    once it listens. ``server.should_exit = True`` stops it. Raises ``OSError`` if it cannot listen."""
    import uvicorn

    config = uvicorn.Config(Guard(Front(upstream), api_key), host=host, port=port, lifespan="off",
                            log_level="warning", access_log=False, timeout_keep_alive=5)  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="dp-front", daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise OSError(f"the front could not listen on {host}:{port}")
        time.sleep(0.05)
    return server, thread
