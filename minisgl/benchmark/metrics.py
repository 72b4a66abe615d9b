"""Latency metrics of a request trace: the definitions every benchmark here reports.

A **trace** is one ``RequestTrace`` per request: when it arrived, when each of its output tokens
reached the client, when it ended, and whether it was aborted. ``online.py`` records one from a
server's stream (``--trace PATH`` saves it), ``trace_requests`` records one in-process from the
scheduler's steps. ``latency_metrics`` turns it into the numbers::

    arrival      first token                                    finish
       |-----TTFT-----|--ITL--|--ITL--|--ITL--| ... |--ITL--|---|
       |------------------------------ E2E ---------------------|
                      |--------- TPOT x (tokens - 1) -----------|

* **TTFT** time to first token: ``token_times[0] - arrival`` (queueing + prefill + one step).
* **TPOT** time per output token after the first: ``(finish - token_times[0]) / (n - 1)`` for a
  request of ``n >= 2`` tokens; a request of one token has none.
* **ITL** inter-token latency: every gap ``token_times[i + 1] - token_times[i]`` of every request,
  pooled: each gap is one sample (a long request weighs as many gaps as it has).
* **E2E** ``finish - arrival``.
* Aborted requests count as ``aborted``; they are left out of every latency and of the output tokens.
* Throughput: completed requests and their output tokens per second of ``duration`` (the run's
  wall time; by default the span from the first arrival to the last finish, aborted requests too).
* Each latency is summarised as ``mean``, ``p50``, ``p90``, ``p99`` (``percentile``: linear
  interpolation between the closest ranks, as numpy's default), ``nan`` without samples.

The benchmark looks the function up by name in ``METRICS`` (``--metrics NAME``; lab 12 registers
its own), so a replacement is used exactly where the default is.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from minisgl.registry import Registry

STATS = ("mean", "p50", "p90", "p99")


@dataclass
class RequestTrace:
    """One request of a run; times in seconds from one common origin (the run's start)."""

    arrival: float  # sent by the client / added to the scheduler
    token_times: list[float] = field(default_factory=list)  # when each output token arrived, in order
    finish: float = math.nan  # when it ended: its last token (or the end of its stream), or the abort
    aborted: bool = False
    prompt_tokens: int = 0

    @property
    def output_tokens(self) -> int:
        return len(self.token_times)


class RequestMetrics(NamedTuple):
    ttft: float
    tpot: float | None  # None: one output token, no time *per* token after the first
    itls: list[float]  # the gaps between consecutive tokens (empty for one token)
    e2e: float


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (``0 <= p <= 100``) of ``values``: sorted, rank ``k = (n - 1) * p / 100``,
    interpolated linearly between ranks ``floor(k)`` and ``ceil(k)``; ``nan`` when empty."""
    xs = sorted(values)
    if not xs:
        return math.nan
    k = (len(xs) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summary(values: Sequence[float]) -> dict[str, float]:
    """``{"mean", "p50", "p90", "p99"}`` of ``values`` (all ``nan`` when empty)."""
    if not values:
        return dict.fromkeys(STATS, math.nan)
    return {
        "mean": sum(values) / len(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
    }


def request_metrics(req: RequestTrace) -> RequestMetrics:
    """TTFT, TPOT, ITLs and E2E of one request with at least one output token."""
    t = req.token_times
    return RequestMetrics(
        ttft=t[0] - req.arrival,
        tpot=(req.finish - t[0]) / (len(t) - 1) if len(t) > 1 else None,
        itls=[b - a for a, b in zip(t, t[1:])],
        e2e=req.finish - req.arrival,
    )


def latency_metrics(trace: Sequence[RequestTrace], duration: float | None = None) -> dict[str, Any]:
    """The benchmark's numbers of a trace (definitions in the module docstring)."""
    done = [r for r in trace if not r.aborted]
    per = [request_metrics(r) for r in done]
    if duration is None:
        duration = max(r.finish for r in trace) - min(r.arrival for r in trace) if trace else 0.0
    tokens = sum(r.output_tokens for r in done)
    rate = lambda n: n / duration if duration > 0 else math.nan  # noqa: E731
    return {
        "completed": len(done),
        "aborted": len(trace) - len(done),
        "output_tokens": tokens,
        "duration_s": duration,
        "request_throughput": rate(len(done)),
        "output_throughput": rate(tokens),
        "ttft_s": summary([m.ttft for m in per]),
        "tpot_s": summary([m.tpot for m in per if m.tpot is not None]),
        "itl_s": summary([x for m in per for x in m.itls]),
        "e2e_s": summary([m.e2e for m in per]),
    }


MetricsFn = Callable[..., dict[str, Any]]  # latency_metrics(trace, duration=None)
METRICS: Registry[MetricsFn] = Registry("latency metrics", {"default": latency_metrics})


# ---- traces: saved, loaded, recorded in-process ----------------------------------------------------------
def save_trace(path: str | Path, trace: Sequence[RequestTrace]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps([asdict(r) for r in trace]))


def load_trace(path: str | Path) -> list[RequestTrace]:
    return [RequestTrace(**d) for d in json.loads(Path(path).read_text())]


def trace_requests(
    llm,
    prompts: Sequence[list[int]],
    params: Sequence,
    arrivals: Sequence[float] | None = None,
    abort_after: dict[int, float] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> list[RequestTrace]:
    """Serve ``prompts`` in-process on ``llm``'s scheduler, each added when its arrival time (seconds
    after the start; default all at 0: offline load) has come, and record when each token reaches
    the host. ``abort_after``: request index -> seconds after its arrival at which it is aborted if
    still unfinished. One trace per prompt, in prompt order; times from the start."""
    sched = llm.scheduler
    n = len(prompts)
    arrivals = list(arrivals) if arrivals is not None else [0.0] * n
    abort_after = dict(abort_after or {})
    uids = [next(llm._uids) for _ in range(n)]
    index = {u: i for i, u in enumerate(uids)}
    trace = [RequestTrace(arrival=a, prompt_tokens=len(p)) for a, p in zip(arrivals, prompts)]
    order = sorted(range(n), key=lambda i: arrivals[i])
    live: set[int] = set()
    t0 = clock()
    while order or live:
        now = clock() - t0
        while order and arrivals[order[0]] <= now:
            i = order.pop(0)
            sched.add_request(uids[i], list(prompts[i]), params[i])
            live.add(i)
        for i in [i for i in live if i in abort_after and now >= arrivals[i] + abort_after[i]]:
            sched.abort(uids[i])
            trace[i].aborted, trace[i].finish = True, now
            live.discard(i)
        if not live:
            if order:
                time.sleep(max(0.0, arrivals[order[0]] - (clock() - t0)))
            continue
        events = sched.step()
        now = clock() - t0
        for ev in events:
            i = index.get(ev.uid)
            if i is None or i not in live:
                continue
            trace[i].token_times.append(now)
            if ev.finish_reason is not None:
                trace[i].finish = now
                live.discard(i)
    return trace
