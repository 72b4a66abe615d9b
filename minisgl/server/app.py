"""The API server's FastAPI app: FastAPI routes in front, the ZMQ pipeline behind.

``errors`` (OpenAI-shaped errors), ``middleware`` (API key, body size), ``frontend`` (the ZMQ
client), ``generation`` (one request's sequences, stop strings, streaming, SSE keep-alive), the routes
in ``openai_routes``, ``native_routes`` and ``ops.sglang_routes``, and ``metrics`` (``GET /metrics``, for Prometheus).
"""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI

from minisgl.message import Addresses
from minisgl.server import native_routes, openai_routes
from minisgl.server.args import HEALTH_TIMEOUT_S, SSE_KEEPALIVE_S
from minisgl.server.errors import install_error_handlers
from minisgl.server.frontend import Frontend
from minisgl.server.ops import metrics, sglang_routes
from minisgl.server.ops.metrics import ServerMetrics
from minisgl.server.ops.middleware import Guard
from minisgl.server.protocol import MAX_SEQUENCES_PER_REQUEST


def create_app(
    addrs: Addresses,
    api_key: str | None = None,
    max_sequences_per_request: int = MAX_SEQUENCES_PER_REQUEST,
    request_timeout: float | None = None,
    health_timeout: float = HEALTH_TIMEOUT_S,
    detokenizer: str = "default",
    sse_keepalive_s: float = SSE_KEEPALIVE_S,
) -> FastAPI:
    """The app, with its ``Frontend`` in ``app.state.frontend``; the launcher may put the worker
    pids in ``app.state.processes`` (``GET /stats`` shows them). A request may ask for at most
    ``max_sequences_per_request`` sequences (prompts x n); ``detokenizer`` names the ``DETOKENIZERS``
    entry whose stop strings it applies. A stream with nothing to send for ``sse_keepalive_s``
    seconds (0: off) gets a keep-alive comment (``generation``); ``app.state.metrics`` counts for
    ``GET /metrics``."""
    fe = Frontend(addrs, request_timeout, health_timeout, detokenizer)

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
    app.state.max_sequences_per_request = max_sequences_per_request
    app.state.sse_keepalive_s = sse_keepalive_s or None
    app.state.metrics = ServerMetrics(lambda: fe.model_name)  # this app's own registry
    app.add_middleware(Guard, api_key=api_key)
    install_error_handlers(app)
    app.include_router(native_routes.router)
    app.include_router(openai_routes.router)
    app.include_router(metrics.router)
    app.include_router(sglang_routes.router)
    return app
