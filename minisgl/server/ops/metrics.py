"""``GET /metrics``: the server's counters in Prometheus' text format, under SGLang's names.

The names, types, label (``model_name``) and histogram buckets are SGLang's (``sglang:*``, as its
``srt/metrics/collector.py`` defines them), so a Grafana dashboard built for SGLang reads this
server too. Two sources:

- gauges, read from the scheduler at scrape time (``Frontend.stats``, what ``GET /stats`` shows):
  running and queued requests, the KV pool's size, use and share used, the prefix-cache hit rate,
  speculative decoding's acceptance rate and length;
  left out while the engine is loading or gone (the rest of the page still answers); and from the same
  stats the scheduler's own counts: its tokens per second since the last scrape, its retractions, the
  queue waits it measured (``ServerMetrics._from_scheduler``);
- counters and histograms, measured here in the API server, per sequence (a choice: ``n`` of them
  per prompt, each one request to the scheduler, as in SGLang): its prompt and generated tokens,
  time to first token, the time between two tokens, per output token, and its end-to-end latency (``SeqTimer``).

Each app owns its ``CollectorRegistry`` (never the global one): a process may run several apps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from minisgl.server.errors import ApiError
from minisgl.server.frontend import frontend_of

router = APIRouter()
logger = logging.getLogger("minisgl.server")

LABELS = ("model_name",)
# SGLang's default buckets (seconds)
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2, 0.4)
ITL_BUCKETS += (0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0)
E2E_BUCKETS = TTFT_BUCKETS + (600, 1200, 1800, 2400)
QUEUE_BUCKETS = (0.0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90, 100, 200, 300, 400, 500)
QUEUE_BUCKETS += (600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000, 2500, 3000)
# an SGLang collector that had it beside the inter-token latency (the newest has only the latter)
TPOT_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09, 0.1, 0.15, 0.2, 0.3, 0.4, 0.6)
TPOT_BUCKETS += (0.8, 1.0, 2.0)


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
        self.tpot = Histogram(
            "sglang:time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            LABELS,
            registry=r,
            buckets=TPOT_BUCKETS,
        )
        # fed from the scheduler's stats at each scrape (set_gauges): the waits seen, the last reading
        self.queue_time = Histogram(
            "sglang:queue_time_seconds",
            "Histogram of queueing time in seconds.",
            LABELS,
            registry=r,
            buckets=QUEUE_BUCKETS,
        )
        self.retracted = Counter(
            "sglang:num_retracted_requests", "Total number of retracted requests.", LABELS, registry=r
        )
        self.gen_throughput = Gauge("sglang:gen_throughput", "The generation throughput (token/s).", LABELS, registry=r)
        self.retracted_now = Gauge("sglang:num_retracted_reqs", "The number of retracted requests.", LABELS, registry=r)
        self._waits_seen, self._last = 0, (time.monotonic(), 0, 0)  # (when, generated tokens, retractions)
        self.log_requests = False  # --log-requests
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            LABELS,
            registry=r,
            buckets=E2E_BUCKETS,
        )

    def timer(self, submitted: float, uid: int = 0) -> SeqTimer:
        """The clock of one sequence (``uid``) submitted at ``submitted`` (``time.monotonic()``)."""
        return SeqTimer(self, self.model(), submitted, uid)

    def _from_scheduler(self, stats: dict[str, Any], model: str) -> None:
        """The series the scheduler counts: the queue waits it measured since the last scrape, the tokens per
        second it generated since then (SGLang's gauge: over its last logging interval), its retractions."""
        now, waits = time.monotonic(), stats["queue_times"]
        new = min(waits["count"] - self._waits_seen, len(waits["latest"]))  # older ones fell out of its window
        for wait in waits["latest"][len(waits["latest"]) - new :]:
            self.queue_time.labels(model).observe(wait)
        when, generated, retracted = self._last
        tokens, retractions = stats["generated_tokens"], stats["retracted_requests"]
        self.gen_throughput.labels(model).set((tokens - generated) / (now - when) if now > when else 0.0)
        self.retracted.labels(model).inc(retractions - retracted)
        self.retracted_now.labels(model).set(retractions - retracted)
        self._waits_seen, self._last = waits["count"], (now, tokens, retractions)

    def set_gauges(self, stats: dict[str, Any] | None) -> None:
        """Set every gauge from the scheduler's ``stats``; None (no answer) removes them, so a scrape
        never shows a stale value. Once the model is known, the counters and histograms show too,
        at 0 until something happens (so that ``rate()`` sees their start)."""
        model = self.model()
        for gauge in (*self.gauges.values(), self.gen_throughput, self.retracted_now):
            gauge.clear()
        for name, gauge in self.gauges.items():
            if stats is not None:
                gauge.labels(model).set(GAUGES[name][1](stats))
        if stats is not None and "queue_times" in stats:  # the scheduler's counters (a stats without them: gauges only)
            self._from_scheduler(stats, model)
        if stats is not None:
            for metric in (self.prompt_tokens, self.generation_tokens, self.cached_tokens, self.num_requests):
                metric.labels(model)
            for metric in (self.num_aborted, self.ttft, self.itl, self.e2e, self.tpot, self.queue_time):
                metric.labels(model)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class SeqTimer:
    """One sequence's timeline: submitted -> first token (TTFT) -> each later token (ITL) -> end (E2E).

    Times are ``time.monotonic()`` readings taken when the API server handles a reply. A reply that
    brings ``k`` tokens ``dt`` after the last one counts ``k`` inter-token gaps of ``dt / k`` (as
    SGLang does); the extra tokens of the first reply count no gap. ``end`` counts once."""

    def __init__(self, m: ServerMetrics, model: str, submitted: float, uid: int = 0):
        self.submitted, self.uid = submitted, uid
        self.first: float | None = None  # when the first token came
        self.last: float | None = None  # when the latest token came; None before the first
        self.prompt = self.generated = 0
        self.ended = False
        self._m, self._model = m, model

    def reply(self, now: float, new_tokens: int, first: bool, prompt_tokens: int, cached_tokens: int) -> None:
        """A reply came: ``first`` (the sequence's first reply: it carries the prompt's counts)
        with ``new_tokens`` tokens."""
        m, model = self._m, self._model
        if first:
            self.prompt = prompt_tokens
            m.prompt_tokens.labels(model).inc(prompt_tokens)
            m.cached_tokens.labels(model).inc(cached_tokens)
        if new_tokens <= 0:
            return
        m.generation_tokens.labels(model).inc(new_tokens)
        self.generated += new_tokens
        if self.last is None:
            self.first = now
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
            if self.first is not None and self.generated > 1:  # the time per token after the first
                self._m.tpot.labels(self._model).observe((now - self.first) / (self.generated - 1))
        else:
            self._m.num_aborted.labels(self._model).inc()
        if self._m.log_requests:
            how = "finished" if finished else "aborted"
            logger.info("request %x %s: %d prompt tokens, %d output tokens", self.uid, how, self.prompt, self.generated)


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
