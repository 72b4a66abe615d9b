"""Lab 12: latency metrics from a request trace, and the decode roofline of a model on a GPU.

The types (``RequestTrace``, ``RequestMetrics``, ``GPU``, ``StepBytes``, ``Roofline``, ``ModelConfig``)
are imported below for you to use; the functions are yours to write: the engine's own functions of
these names are off limits (a lab that aliases or calls them is graded 0).

Part A — metrics. A trace is a list of ``RequestTrace`` (a dataclass), one per request, times in
seconds from one origin: ``arrival`` (sent), ``token_times`` (when each output token arrived, in
order), ``finish`` (when it ended: its last token or the end of its stream, or the abort) and
``aborted``. What a serving benchmark reports, per request::

    arrival      first token                                    finish
       |-----TTFT-----|--ITL--|--ITL--|--ITL--| ... |--ITL--|---|
       |------------------------------ E2E ---------------------|
                      |<-- shared by the tokens after the first ->|  TPOT: the time each of them took

* **TTFT**: how long the request waited for its first token, from its *own* arrival.
* **TPOT**: the time per output token *after the first* (the first is TTFT's): the span from the first
  token to the finish, spread over the tokens that came after it. A request of one token has none.
* **ITLs**: the gaps between consecutive tokens of a request (a chunk that carries several tokens at
  one time gives gaps of 0: samples like any other). **E2E**: from arrival to finish.
* ``request_metrics(req)``, for a request with at least one token: its ``RequestMetrics(ttft, tpot,
  itls, e2e)``, ``tpot`` ``None`` for one token. Example: arrival 1.0, tokens at 1.5, 1.75 and 2.25,
  finish 2.5 -> ``RequestMetrics(ttft=0.5, tpot=0.5, itls=[0.25, 0.5], e2e=1.5)``.
* ``percentile(values, p)``, ``0 <= p <= 100``: numpy's default definition (``numpy.percentile(values,
  p)``, method "linear": between the two closest ranks of the sorted values, interpolated), *not* the
  nearest-rank one; ``nan`` for no values. Examples: ``[1, 2, 3, 4]`` -> 2.5 at p50 and 3.7 at p90
  (nearest-rank would say 2 and 4); ``[5, 1, 4, 2, 3]`` at p25 -> 2.0; ``[7]`` -> 7.0 at any ``p``.
* ``summary(values)``: ``{"mean": ..., "p50": ..., "p90": ..., "p99": ...}`` in that order; every
  entry ``nan`` for no values.
* ``latency_metrics(trace, duration=None)``: a dict with, in this order, ``completed`` (requests not
  aborted), ``aborted``, ``output_tokens`` (of completed requests), ``duration_s``,
  ``request_throughput`` and ``output_throughput`` (completed requests, and their output tokens, per
  second of the duration), then ``ttft_s``, ``tpot_s``, ``itl_s``, ``e2e_s``, each a ``summary``.
  ``duration`` is the run's wall time; ``None`` means the span from the earliest arrival to the latest
  finish of *all* requests (aborted ones too; 0 for an empty trace). A throughput over a duration that
  is not positive is ``nan``. The samples: one TTFT and one E2E per completed request, one TPOT per
  completed request that has one, and the ITLs of all completed requests *pooled* (each gap one
  sample, so a long request weighs more). An aborted request counts in ``aborted`` and nowhere else.
  Example: requests (arrival 0.0, tokens 0.5 0.75 1.0), (0.25, a token at 1.0) and (0.5, tokens 1.0
  1.25, finish 1.5, aborted) -> completed 2, aborted 1, output_tokens 4, duration_s 1.5,
  request_throughput 2 / 1.5, output_throughput 4 / 1.5; TTFT samples 0.5 and 0.75 (p50 0.625), one
  TPOT sample 0.25, ITL samples 0.25 and 0.25, E2E samples 1.0 and 0.75.

Part B — the decode roofline: how fast a decode step could be if it only had to read its bytes.

* ``decode_step_bytes(cfg, batch_size, context_len, ...)``: the bytes one GPU
  reads in one decode step of ``batch_size`` requests, each attending to ``context_len`` positions, as
  ``StepBytes(weights, kv)``. Weights: every matrix the step multiplies by, once whatever the batch:
  each layer's attention projections (q, k, v, o, with grouped-query attention's narrower k and v) and
  MLP (gate, up, down), and the LM head, read at every step whether or not it is tied to the embedding;
  not the embedding table (its lookup reads one row per request), nor norms and biases (< 0.1%).
  ``weight_bytes`` per weight. KV: the K and V of every position each request attends to, in every
  layer, for the KV heads only, ``kv_bytes`` per value. Over ``tp`` GPUs each part splits on its own:
  the query heads and MLP columns evenly; the KV heads and the LM head's vocabulary rows rounded up (a
  KV head is replicated when ``tp`` exceeds them; the last vocabulary shard is padded).
* ``decode_roofline(cfg, gpu, ...)``: the step's time if one GPU's bytes stream at ``gpu.bandwidth``
  (the GPUs read at once), and the tokens per second that gives (one token per request per step):
  ``Roofline(step_s, tokens_per_s)``.
* ``param_count(cfg)``: the model's parameters as ``transformers``' ``num_parameters()`` counts them:
  the embedding, each layer's projections (with their biases when ``attention_bias`` (q, k, v, o) or
  ``mlp_bias`` (gate, up, down) says so, each flag on its own), its two norms and Qwen3's per-head q and
  k norms (``qk_norm``), the final norm, and an untied LM head (a tied one *is* the embedding: counted
  once).
* Example, a Qwen3 config (q/k norms) of ``hidden_size`` 64, ``intermediate_size`` 128, 2 layers, 4
  heads, 2 KV heads, ``head_dim`` 16, vocabulary 100, tied: ``param_count`` 80,512;
  ``decode_step_bytes(cfg, 3, 10)`` -> ``StepBytes(weights=160256, kv=7680)`` (bf16);
  ``tp=2`` -> ``(80128, 3840)``; ``tp=4`` -> ``(44160, 3840)`` (one KV head each, replicated);
  on a ``GPU("toy", 1e6, 0.0)`` (1 MB/s), ``decode_roofline(cfg, gpu, 3, 10)`` ->
  ``Roofline(step_s=0.167936, tokens_per_s=17.86...)``.

Pitfalls the grader recognises (its messages name them): TTFT measured from something other than the
request's arrival; TPOT counting the first token; ITL averaged per request instead of pooled, or its
gaps of 0 dropped; a nearest-rank or off-by-one percentile, or one of unsorted values; aborted
requests in the latencies or the output tokens; a one-token request given a TPOT (or a two-token one
denied its); the span without the aborted requests; a throughput over a zero duration; KV counted
with the query heads instead of the KV heads, or for one layer; the tied LM head left out of the
step, the embedding table read in the step, or the untied LM head left out of the parameters;
``weight_bytes`` used for the KV (or the reverse); under tensor parallelism the whole model divided
by ``tp``, or KV heads and vocabulary rows rounded down.

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
    # BEGIN SOLUTION what="the percentile of the values, interpolated linearly between the closest ranks" hint="sort; the 0-based rank is k = (n - 1) * p / 100; interpolate between the values at floor(k) and ceil(k); nan if empty"
    xs = sorted(values)
    if not xs:
        return math.nan
    k = (len(xs) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)
    # END SOLUTION


def summary(values: Sequence[float]) -> dict[str, float]:
    """``{"mean", "p50", "p90", "p99"}`` of ``values``; all ``nan`` when there are none."""
    # BEGIN SOLUTION what="the mean and the three percentiles of the values" hint="the mean, then percentile at 50, 90 and 99; every entry nan without values"
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
    # BEGIN SOLUTION what="the TTFT, TPOT, ITLs and E2E of one request" hint="TTFT from its own arrival; TPOT = (finish - first token) / (n - 1), None for one token; the gaps between consecutive tokens; E2E to the finish"
    first, n = req.token_times[0], len(req.token_times)
    tpot = (req.finish - first) / (n - 1) if n >= 2 else None
    gaps = [later - earlier for earlier, later in zip(req.token_times[:-1], req.token_times[1:])]
    return RequestMetrics(ttft=first - req.arrival, tpot=tpot, itls=gaps, e2e=req.finish - req.arrival)
    # END SOLUTION


def latency_metrics(trace: Sequence[RequestTrace], duration: float | None = None) -> dict[str, Any]:
    """The benchmark's numbers of ``trace`` (the module docstring lists the keys and definitions)."""
    # BEGIN SOLUTION what="the counts, duration, throughputs and latency summaries of a trace" hint="split completed from aborted; the duration given or the span of all requests; throughputs nan unless the duration is positive; pool the samples of the completed requests and summarise each"
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
    # BEGIN SOLUTION what="the number of parameters, as transformers counts them" hint="embedding + layers (projections, biases per flag, two norms, q/k norms) + final norm + an untied LM head"
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
    # BEGIN SOLUTION what="the weight and KV bytes one GPU reads in one decode step" hint="per GPU: the layer matrices and the LM head at weight_bytes; batch * context * layers * 2 * KV heads * head_dim at kv_bytes; heads / tp, ceil(KV heads / tp), intermediate / tp, ceil(vocab / tp)"
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
    # BEGIN SOLUTION what="the bandwidth bound of one decode step: its time and its tokens per second" hint="one GPU's bytes (decode_step_bytes) over gpu.bandwidth; batch_size tokens per step"
    step_bytes = decode_step_bytes(cfg, batch_size, context_len, weight_bytes, kv_bytes, tp)
    seconds = (step_bytes.weights + step_bytes.kv) / gpu.bandwidth
    return Roofline(step_s=seconds, tokens_per_s=batch_size / seconds)
    # END SOLUTION
