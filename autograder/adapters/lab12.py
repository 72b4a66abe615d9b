"""Lab 12 adapter: the functions of ``lab12_benchmark.py``, and the swap-in that lets the benchmarks
compute their numbers with them: ``latency_metrics`` registered in ``minisgl.benchmark.metrics.METRICS``
as ``"lab12"`` (``python -m minisgl.benchmark.online --metrics lab12``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from autograder.impl import load, require
from autograder.originality import original
from minisgl.benchmark import metrics, roofline
from minisgl.benchmark.metrics import METRICS, RequestMetrics, RequestTrace
from minisgl.benchmark.roofline import GPU, Roofline, StepBytes
from minisgl.models.config import ModelConfig

STEM = "lab12_benchmark"


def percentile(values: Sequence[float], p: float) -> float:
    return require(STEM, "percentile")(list(values), p)


def summary(values: Sequence[float]) -> dict[str, float]:
    return require(STEM, "summary")(list(values))


def request_metrics(req: RequestTrace) -> RequestMetrics:
    return require(STEM, "request_metrics")(req)


def latency_metrics(trace: Sequence[RequestTrace], duration: float | None = None) -> dict[str, Any]:
    return require(STEM, "latency_metrics")(list(trace), duration)


def param_count(cfg: ModelConfig) -> int:
    return require(STEM, "param_count")(cfg)


def decode_step_bytes(cfg: ModelConfig, batch_size: int, context_len: int, **kw) -> StepBytes:
    return require(STEM, "decode_step_bytes")(cfg, batch_size, context_len, **kw)


def decode_roofline(cfg: ModelConfig, gpu: GPU, batch_size: int, context_len: int, **kw) -> Roofline:
    return require(STEM, "decode_roofline")(cfg, gpu, batch_size, context_len, **kw)


@contextmanager
def reference_helpers(*names: str) -> Iterator[None]:
    """Inside the block the lab module's functions ``names`` are the reference's, so a test of
    ``latency_metrics`` (or ``decode_roofline``) grades that function alone: partial credit per function."""
    module = load(STEM)
    saved = {n: getattr(module, n, None) for n in names}
    for n in names:
        # the reference itself, not its tripwire (originality.py): the grader put it there, not the student
        setattr(module, n, original(getattr(metrics, n, None) or getattr(roofline, n)))
    try:
        yield
    finally:
        for n, fn in saved.items():
            setattr(module, n, fn)


@contextmanager
def registered_metrics(name: str = "lab12") -> Iterator[str]:
    """The lab's ``latency_metrics`` as the benchmarks' ``--metrics name`` inside the block."""
    with METRICS.registered(name, require(STEM, "latency_metrics")):
        yield name
