"""Lab 12: latency metrics from a request trace, and the decode roofline of a model on a GPU.

The types (``RequestTrace``, ``RequestMetrics``, ``GPU``, ``StepBytes``, ``Roofline``, ``ModelConfig``)
are imported below for you to use; the functions are yours to write: the engine's own functions of
these names are off limits (a lab that aliases or calls them is graded 0).

Part A — metrics. A trace is a list of ``RequestTrace`` (a dataclass), one per request, times in
seconds from one origin: ``arrival`` (sent), ``token_times`` (when each output token arrived, in
order), ``finish`` (when it ended: its last token or the end of its stream, or the abort) and
``aborted``::

    arrival      first token                                    finish
       |-----TTFT-----|--ITL--|--ITL--|--ITL--| ... |--ITL--|---|
       |------------------------------ E2E ---------------------|
                      |--------- TPOT x (tokens - 1) -----------|

* ``percentile(values, p)``, ``0 <= p <= 100``: sort the values; the rank is ``k = (n - 1) * p / 100``
  (0-based); the result is interpolated linearly between the values at ranks ``floor(k)`` and
  ``ceil(k)`` (numpy's default, "linear"; *not* nearest-rank). ``nan`` for no values.
* ``summary(values)``: ``{"mean": ..., "p50": ..., "p90": ..., "p99": ...}`` in that order; every
  entry ``nan`` for no values.
* ``request_metrics(req)`` for a request with at least one token: ``RequestMetrics(ttft, tpot, itls, e2e)``
  with ``ttft = token_times[0] - arrival`` (from the request's own arrival), ``e2e = finish - arrival``,
  ``itls`` every gap between consecutive token times, and ``tpot = (finish - token_times[0]) / (n - 1)``
  for ``n >= 2`` tokens (the first token is TTFT's, not TPOT's); ``None`` for one token (no ITL either).
* ``latency_metrics(trace, duration=None)`` returns a dict with, in this order: ``completed`` (not
  aborted), ``aborted``, ``output_tokens`` (of completed requests), ``duration_s``,
  ``request_throughput`` (completed / duration), ``output_throughput`` (output tokens / duration),
  then ``ttft_s``, ``tpot_s``, ``itl_s``, ``e2e_s``, each a ``summary``. ``duration`` is the run's wall
  time; ``None`` means the span from the earliest arrival to the latest finish of *all* requests (aborted
  ones too; 0 for an empty trace). A throughput is ``nan`` when the duration is not positive. Samples:
  one TTFT and one E2E per completed request, one TPOT per completed request of two tokens or more,
  and the ITLs of all completed requests **pooled** (each gap one sample). Aborted requests are counted
  in ``aborted`` and nowhere else: no latency, no output tokens.

Part B — the decode roofline. A decode step of ``batch_size`` requests, each attending to
``context_len`` positions, reads on each GPU:

* weights: every layer's q, k, v, o projections (``hidden x num_heads*head_dim``, two of
  ``hidden x num_kv_heads*head_dim``, ``num_heads*head_dim x hidden``) and gate, up, down
  (``hidden x intermediate`` each), and the LM head (``vocab x hidden``), ``weight_bytes`` per element.
  The LM head is read at every step, tied to the embedding or not; the embedding table itself is not
  (its lookup reads one row per request), nor are norms and biases (left out: < 0.1%);
* KV: ``batch_size * context_len`` positions x ``num_layers`` x 2 (K and V) x ``num_kv_heads`` x
  ``head_dim``, ``kv_bytes`` per element (grouped-query attention stores the KV heads only).
* Tensor parallelism over ``tp`` GPUs: each holds ``num_heads / tp`` query heads,
  ``ceil(num_kv_heads / tp)`` KV heads (replicated when ``tp > num_kv_heads``), ``intermediate / tp``
  MLP columns and ``ceil(vocab / tp)`` LM-head rows (norms aside, everything splits).
* ``decode_roofline``: the step takes one GPU's bytes over ``gpu.bandwidth`` (all GPUs read at once),
  and yields ``batch_size`` tokens: ``Roofline(step_s, tokens_per_s)``.
* ``param_count(cfg)``: the model's parameters as ``transformers`` counts them: embedding, layers
  (projections; biases when ``attention_bias`` (q, k, v, o) / ``mlp_bias`` (gate, up, down); two norms of
  ``hidden``; Qwen3's q and k norms of ``head_dim``), the final norm, and an untied LM head (a tied one
  *is* the embedding: counted once).

Pitfalls the grader recognises (its messages name them): TTFT measured from something other than the
request's arrival; TPOT counting the first token; ITL averaged per request instead of pooled; a
nearest-rank or off-by-one percentile; aborted requests in the latencies or the output tokens; a
one-token request given a TPOT; KV counted with ``num_heads`` instead of ``num_kv_heads``, or for one
layer; the tied LM head left out of the step, the embedding table read in the step, or the untied LM
head left out of the parameters; ``weight_bytes`` used for the KV (or the reverse).

Grading: ``python -m autograder lab12`` checks fixed and random traces against the reference, then
runs the engine on a tiny model under a Poisson load (one request aborted) and compares your metrics of
that trace, registered as the benchmark's ``--metrics lab12``, with the engine's; and the roofline
and parameter count of the real architectures (Qwen3-0.6B, Qwen3-14B, Qwen3-32B, Llama-3.1-8B).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from minisgl.benchmark.metrics import RequestMetrics, RequestTrace
from minisgl.benchmark.roofline import GPU, Roofline, StepBytes
from minisgl.models.config import ModelConfig


# ---- Part A: metrics -------------------------------------------------------------------------------------
def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile of ``values``, interpolated linearly between the closest ranks."""
    # BEGIN SOLUTION hint="sort; rank k = (n - 1) * p / 100; interpolate between floor(k) and ceil(k); nan if empty"
    xs = sorted(values)
    if not xs:
        return math.nan
    k = (len(xs) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)
    # END SOLUTION


def summary(values: Sequence[float]) -> dict[str, float]:
    """``{"mean", "p50", "p90", "p99"}`` of ``values``; all ``nan`` when there are none."""
    # BEGIN SOLUTION hint="the mean and percentile(values, 50 / 90 / 99); every entry nan without values"
    if not values:
        return {"mean": math.nan, "p50": math.nan, "p90": math.nan, "p99": math.nan}
    return {
        "mean": sum(values) / len(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
    }
    # END SOLUTION


def request_metrics(req: RequestTrace) -> RequestMetrics:
    """TTFT, TPOT (``None`` for one token), ITLs and E2E of one request with at least one token."""
    # BEGIN SOLUTION hint="ttft from arrival; tpot = (finish - first) / (n - 1) or None; itls = gaps; e2e"
    first, n = req.token_times[0], len(req.token_times)
    tpot = (req.finish - first) / (n - 1) if n >= 2 else None
    gaps = [later - earlier for earlier, later in zip(req.token_times[:-1], req.token_times[1:])]
    return RequestMetrics(ttft=first - req.arrival, tpot=tpot, itls=gaps, e2e=req.finish - req.arrival)
    # END SOLUTION


def latency_metrics(trace: Sequence[RequestTrace], duration: float | None = None) -> dict[str, Any]:
    """The benchmark's numbers of ``trace`` (the module docstring lists the keys and definitions)."""
    # BEGIN SOLUTION hint="completed vs aborted; duration or the span; throughputs; pooled samples; summary() each"
    completed = [r for r in trace if not r.aborted]
    if duration is None:
        duration = (max(r.finish for r in trace) - min(r.arrival for r in trace)) if trace else 0.0
    tokens = sum(len(r.token_times) for r in completed)
    ttfts, tpots, itls, e2es = [], [], [], []
    for r in completed:
        m = request_metrics(r)
        ttfts.append(m.ttft)
        e2es.append(m.e2e)
        itls.extend(m.itls)
        if m.tpot is not None:
            tpots.append(m.tpot)
    return {
        "completed": len(completed),
        "aborted": len(trace) - len(completed),
        "output_tokens": tokens,
        "duration_s": duration,
        "request_throughput": len(completed) / duration if duration > 0 else math.nan,
        "output_throughput": tokens / duration if duration > 0 else math.nan,
        "ttft_s": summary(ttfts),
        "tpot_s": summary(tpots),
        "itl_s": summary(itls),
        "e2e_s": summary(e2es),
    }
    # END SOLUTION


# ---- Part B: the decode roofline -------------------------------------------------------------------------
def param_count(cfg: ModelConfig) -> int:
    """The model's parameters, as ``transformers``' ``num_parameters()`` counts them."""
    # BEGIN SOLUTION hint="embedding + layers (projections, biases, norms, q/k norms) + final norm + untied head"
    hidden, head_dim = cfg.hidden_size, cfg.head_dim
    q_width, kv_width = cfg.num_heads * head_dim, cfg.num_kv_heads * head_dim
    per_layer = 2 * hidden * q_width + 2 * hidden * kv_width + 3 * hidden * cfg.intermediate_size
    if cfg.attention_bias:
        per_layer += q_width + 2 * kv_width + hidden
    if cfg.mlp_bias:
        per_layer += 2 * cfg.intermediate_size + hidden
    per_layer += 2 * hidden + (2 * head_dim if cfg.qk_norm else 0)
    embedding = cfg.vocab_size * hidden
    lm_head = 0 if cfg.tie_word_embeddings else cfg.vocab_size * hidden
    return embedding + cfg.num_layers * per_layer + hidden + lm_head
    # END SOLUTION


def decode_step_bytes(
    cfg: ModelConfig, batch_size: int, context_len: int, weight_bytes: float = 2, kv_bytes: float = 2, tp: int = 1
) -> StepBytes:
    """The bytes one GPU reads in one decode step: ``StepBytes(weights, kv)``."""
    # BEGIN SOLUTION hint="per GPU: layer matrices + LM head at weight_bytes; B * ctx * layers * 2 * kv heads * dim"
    hidden, head_dim = cfg.hidden_size, cfg.head_dim
    heads = cfg.num_heads // tp
    kv_heads = math.ceil(cfg.num_kv_heads / tp)
    mlp_cols = cfg.intermediate_size // tp
    per_layer = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + 3 * hidden * mlp_cols
    lm_head = math.ceil(cfg.vocab_size / tp) * hidden
    weights = (cfg.num_layers * per_layer + lm_head) * weight_bytes
    kv_per_position = cfg.num_layers * 2 * kv_heads * head_dim * kv_bytes
    return StepBytes(weights=weights, kv=batch_size * context_len * kv_per_position)
    # END SOLUTION


def decode_roofline(
    cfg: ModelConfig,
    gpu: GPU,
    batch_size: int,
    context_len: int,
    weight_bytes: float = 2,
    kv_bytes: float = 2,
    tp: int = 1,
) -> Roofline:
    """The bandwidth bound of one decode step on ``gpu``: ``Roofline(step_s, tokens_per_s)``."""
    # BEGIN SOLUTION hint="one GPU's bytes (decode_step_bytes) / gpu.bandwidth; batch_size tokens per step"
    step_bytes = decode_step_bytes(cfg, batch_size, context_len, weight_bytes, kv_bytes, tp)
    seconds = (step_bytes.weights + step_bytes.kv) / gpu.bandwidth
    return Roofline(step_s=seconds, tokens_per_s=batch_size / seconds)
    # END SOLUTION
