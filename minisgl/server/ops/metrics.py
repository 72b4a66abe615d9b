"""``GET /metrics``: the server's counters in Prometheus' text format, under SGLang's names.

The names, types, label (``model_name``) and histogram buckets are SGLang's (``sglang:*``, as its
``srt/metrics/collector.py`` defines them), so a Grafana dashboard built for SGLang reads this
server too. Two sources:

- gauges, read from the scheduler at scrape time (``Frontend.stats``, what ``GET /stats`` shows):
  running and queued requests, the KV pool's size, use and share used, the prefix-cache hit rate,
  speculative decoding's acceptance rate and length;
  left out while the engine is loading or gone (the rest of the page still answers);
- counters and histograms, measured here in the API server, per sequence (a choice: ``n`` of them
  per prompt, each one request to the scheduler, as in SGLang): its prompt and generated tokens,
  time to first token, the time between two tokens, and its end-to-end latency (``SeqTimer``).

Each app owns its ``CollectorRegistry`` (never the global one): a process may run several apps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from minisgl.server.errors import ApiError
from minisgl.server.frontend import frontend_of

router = APIRouter()

LABELS = ("model_name",)
# SGLang's default buckets (seconds)
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2, 0.4)
ITL_BUCKETS += (0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0)
E2E_BUCKETS = TTFT_BUCKETS + (600, 1200, 1800, 2400)


# gauge name -> (help, how to read it from the scheduler's stats)
GAUGES: dict[str, tuple[str, Callable[[dict[str, Any]], float]]] = {
    "sglang:num_running_reqs": ("The number of running requests.", lambda s: s["running_requests"]),
    "sglang:num_queue_reqs": ("The number of requests in the waiting queue.", lambda s: s["waiting_requests"]),
    # SGLang's "used": the pool less what is free or evictable (our used + protected slots)
    "sglang:num_used_tokens": (
        "The number of used tokens.",
        lambda s: s["kv"]["total_slots"] - s["kv"]["free_slots"] - s["kv"]["evictable_slots"],
    ),
    "sglang:max_total_num_tokens": (
        "Maximum total number of tokens in the KV cache pool.",
        lambda s: s["kv"]["total_slots"],
    ),
    "sglang:token_usage": ("The token usage.", lambda s: s["kv"]["usage"]),
    "sglang:cache_hit_rate": ("The prefix cache hit rate.", lambda s: s["cache"]["hit_rate"]),
    # speculative decoding (0 without it): accepted drafts / proposed, and tokens per verify incl. the bonus
    "sglang:spec_accept_rate": (
        "The average acceptance rate of speculative decoding.",
        lambda s: s["speculative"]["accept_rate"],
    ),
    "sglang:spec_accept_length": (
        "The average acceptance length of speculative decoding.",
        lambda s: s["speculative"]["accept_length"],
    ),
}


class ServerMetrics:
    """One app's registry and metrics; ``model`` gives the ``model_name`` label's value (the served
    model's name, known once the scheduler has reported ready)."""

    def __init__(self, model: Callable[[], str]):
        self.model = model
        self.registry = r = CollectorRegistry()
        self.gauges = {name: Gauge(name, doc, LABELS, registry=r) for name, (doc, _) in GAUGES.items()}
        self.prompt_tokens = Counter("sglang:prompt_tokens", "Number of prefill tokens processed.", LABELS, registry=r)
        self.generation_tokens = Counter(
            "sglang:generation_tokens", "Number of generation tokens processed.", LABELS, registry=r
        )
        self.cached_tokens = Counter("sglang:cached_tokens", "Number of cached prompt tokens.", LABELS, registry=r)
        self.num_requests = Counter("sglang:num_requests", "Number of requests processed.", LABELS, registry=r)
        self.num_aborted = Counter("sglang:num_aborted_requests", "Number of requests aborted.", LABELS, registry=r)
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            LABELS,
            registry=r,
            buckets=TTFT_BUCKETS,
        )
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            LABELS,
            registry=r,
            buckets=ITL_BUCKETS,
        )
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            LABELS,
            registry=r,
            buckets=E2E_BUCKETS,
        )

    def timer(self, submitted: float) -> SeqTimer:
        """The clock of one sequence submitted at ``submitted`` (``time.monotonic()``)."""
        return SeqTimer(self, self.model(), submitted)

    def set_gauges(self, stats: dict[str, Any] | None) -> None:
        """Set every gauge from the scheduler's ``stats``; None (no answer) removes them, so a scrape
        never shows a stale value. Once the model is known, the counters and histograms show too,
        at 0 until something happens (so that ``rate()`` sees their start)."""
        model = self.model()
        for name, gauge in self.gauges.items():
            gauge.clear()
            if stats is not None:
                gauge.labels(model).set(GAUGES[name][1](stats))
        if stats is not None:
            for metric in (self.prompt_tokens, self.generation_tokens, self.cached_tokens, self.num_requests):
                metric.labels(model)
            for metric in (self.num_aborted, self.ttft, self.itl, self.e2e):
                metric.labels(model)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class SeqTimer:
    """One sequence's timeline: submitted -> first token (TTFT) -> each later token (ITL) -> end (E2E).

    Times are ``time.monotonic()`` readings taken when the API server handles a reply. A reply that
    brings ``k`` tokens ``dt`` after the last one counts ``k`` inter-token gaps of ``dt / k`` (as
    SGLang does); the extra tokens of the first reply count no gap. ``end`` counts once."""

    def __init__(self, m: ServerMetrics, model: str, submitted: float):
        self.submitted = submitted
        self.last: float | None = None  # when the latest token came; None before the first
        self.ended = False
        self._m, self._model = m, model

    def reply(self, now: float, new_tokens: int, first: bool, prompt_tokens: int, cached_tokens: int) -> None:
        """A reply came: ``first`` (the sequence's first reply: it carries the prompt's counts)
        with ``new_tokens`` tokens."""
        m, model = self._m, self._model
        if first:
            m.prompt_tokens.labels(model).inc(prompt_tokens)
            m.cached_tokens.labels(model).inc(cached_tokens)
        if new_tokens <= 0:
            return
        m.generation_tokens.labels(model).inc(new_tokens)
        if self.last is None:
            m.ttft.labels(model).observe(now - self.submitted)
        else:
            itl = m.itl.labels(model)
            for _ in range(new_tokens):
                itl.observe((now - self.last) / new_tokens)
        self.last = now

    def end(self, now: float, finished: bool) -> None:
        """The sequence finished (``finished``: stop or length) or was aborted (client gone, timeout,
        an engine error); only the first call counts."""
        if self.ended:
            return
        self.ended = True
        if finished:
            self._m.num_requests.labels(self._model).inc()
            self._m.e2e.labels(self._model).observe(now - self.submitted)
        else:
            self._m.num_aborted.labels(self._model).inc()


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus' text exposition format. Behind ``--api-key`` like every route but ``/health``."""
    m: ServerMetrics = request.app.state.metrics  # create_app's
    try:
        stats = await frontend_of(request).stats()
    except ApiError:  # loading, stopping, or the scheduler did not answer: counters only
        stats = None
    # no await between setting the gauges and rendering: a concurrent scrape cannot interleave
    m.set_gauges(stats)
    return Response(m.exposition(), media_type=CONTENT_TYPE_LATEST)
