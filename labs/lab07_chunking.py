"""Lab 07: chunks of equal time.

A fixed token budget (``GreedyChunking``) cuts a long prompt into chunks of equal *size*, but the decoding
requests wait for each chunk's *time*, and a chunk's time grows with where it starts: its queries attend to
every key before them. Lesson 07 measures it on the embedded model: the last chunk of a long prompt costs more
than its first, so a budget small enough for the last chunk's gap makes every earlier
chunk too small (more chunks: a later first token). You write the engine-grade policy: fit a cost model to
measured extends, and size each chunk by *time*, so that no batch a decoding request waits for takes longer
than the configured gap, and each chunk is the longest that fits (the fewest chunks: the earliest first
token under that gap)::

    cost: per_token 1, per_pair 1/8; busy budget 8 -> the gap target is chunk_time(cost, 0, 8) = 12.5
    a 40-token prompt while requests decode:
    batch 1: prefill [ 0 ........ 8 ✂]   time 8 + 36/8     = 12.5   (exactly the target: allowed)
    batch 2: decode
    batch 3: prefill [ 8 .... 13 ✂]      time 5 + 55/8     = 11.875 (14 would take 14.625)
    batch 4: decode    ... each chunk shorter than the last, each within 12.5

You implement three parts (``minisgl.scheduler.chunking`` defines ``PrefillCost``, the interface
``ChunkingPolicy``, and its docstrings say where the scheduler asks each method):

* ``chunk_time(cost, start, end)``: the modelled time of computing positions ``[start, end)`` of one request:
  ``cost.per_token`` for each new token, plus ``cost.per_pair`` for each (query, key) pair it computes. The
  token at position ``p`` attends to every position up to and including itself, so a chunk after a cached
  prefix pays for the prefix's keys too. An empty range takes 0; an unlimited ``end`` (``inf``) takes
  ``inf``, with ``per_pair == 0`` too. Examples (``per_token`` 1, ``per_pair`` 1/8): ``[0, 8)`` -> 12.5 (8
  tokens, 36 pairs); ``[8, 13)`` -> 11.875; ``[5, 5)`` -> 0; ``[0, inf)`` -> ``inf``.
* ``fit_cost(samples)``: the ``PrefillCost`` that best explains measured extends ``(start, end, seconds)``,
  in the least-squares sense with no intercept (a sample's prediction is its ``chunk_time``) and no
  negative coefficient: when the best fit would make one coefficient negative, that one is 0 and the other
  is the best fit alone. When the samples cannot tell the two coefficients apart (every sample has the same
  number of pairs per token, as a single sample always does), ``per_pair`` is 0. Examples: samples from
  ``per_token`` 2, ``per_pair`` 1/4, exactly -> that model; the one sample ``(0, 4, 10.0)`` -> ``per_token``
  2.5, ``per_pair`` 0. ``ValueError`` for no samples, or a sample that computes no token (its end not after
  its start).
* ``TimedChunking``, a ``ChunkingPolicy`` (write all three methods; ``__init__`` is given):

  * ``budget(busy, idle, num_decoding)``: the tokens the next prefill batch may compute: ``busy`` while any
    request decodes, ``idle`` while none does (either may be ``inf``; ``idle`` may be the smaller). It also
    starts this batch's clock, ``self.time_left``, the modelled time the batch may still take: while
    requests decode, the time of a ``busy``-token chunk from position 0 (the gap the configuration
    promises the streams); while none does, unlimited (nobody waits: the first token as early as
    possible). Every call starts it afresh. Examples with the cost above: ``(8, 64, 2)`` -> 8, clock 12.5;
    ``(8, 64, 0)`` -> 64, clock ``inf``; ``(inf, 64, 1)`` with ``per_pair`` 0 -> ``inf``, clock ``inf``.
  * ``extend_end(req, tokens_left)``: where ``req``'s extend in this batch ends (an ``int``). It starts at
    the request's ``cached_len`` (a cached prefix, or the chunks before) and ends at the largest position,
    at most the request's ``device_len`` (the prompt, plus the outputs of a retracted request), whose
    extend has at most ``tokens_left`` tokens and a modelled time within the clock (a time exactly equal
    to what is left fits). An extend is never empty: when not even one token fits, it is one token (it
    makes progress; the cut ends the batch). The extend's time is charged to the clock, which the
    requests of one batch share. Example (the cost above, after ``budget(8, 64, 2)``): a 40-token prompt
    with nothing cached and 8 tokens left -> 8 (time 12.5, the whole clock); in the next batch, from 8 ->
    13 (time 11.875; 14 would take 14.625).
  * ``decode_first(after_chunk, num_decodable)``: whether the next batch decodes the running requests
    before any prefill: exactly when the last batch cut a prompt and at least one request can decode.

  The clock is the only state, and it lives for one batch: no progress of a request is kept (a retracted
  request starts over from its ``cached_len``; tensor-parallel ranks must decide alike). With
  ``per_pair == 0`` its batches are exactly ``GreedyChunking``'s.

Write it all here: a class or function that derives from, calls or aliases the engine's own chunking policies
or cost functions scores 0.

Pitfalls the grader recognises (its messages name them):

* pairs counted from 0 instead of from ``start`` (a chunk after a cached prefix is cheaper than it is), or
  ``p`` keys instead of ``p + 1``; ``nan`` from ``0 * inf``;
* a fit with a negative coefficient, or a crash (division by zero) when the samples cannot tell the two
  coefficients apart;
* the idle budget (or no clock) while requests decode; a clock while nothing decodes (needless chunks);
* a cut past the time left, or one token short of it (``<`` where the contract says ``<=``); an empty
  extend when no token fits; ignoring ``tokens_left`` or ``device_len`` (``prompt_len`` for a retracted
  request);
* a clock that is not charged (two requests each take the whole gap), or not started afresh by ``budget``
  (every batch after the first gets less time), or one without the attention term;
* no decode step between two chunks (the running streams stall for the whole prompt).

Grading: ``python -m autograder lab07`` checks each part on fixed cases (costs and times that are exact in
binary floating point), random workloads on the real scheduler (a model-free engine) batch by batch against
the engine's ``TimedChunking``, then the real engine with ``components={"chunking": "lab07"}`` on a tiny
model: the unchunked engine's tokens, the time of every batch within the gap, no stream or request starved,
memory given back, retracted requests carried on. Nothing reads a clock: every time is a cost model's.
"""

from __future__ import annotations

import math

from minisgl.core import Req
from minisgl.scheduler.chunking import ChunkingPolicy, PrefillCost


class TimedChunking(ChunkingPolicy):
    """Chunks sized by time under a cost model (the contract is the module docstring)."""

    def __init__(self, cost: PrefillCost | None = None):
        self.cost = cost or PrefillCost(per_token=1.0, per_pair=1 / 512)
        self.time_left = math.inf  # of the batch being built: budget() starts it, extend_end() charges it

    def budget(self, busy: float, idle: float, num_decoding: int) -> float:
        """New tokens the next prefill batch may compute; starts the batch's clock."""
        raise NotImplementedError("Lab 07: the token budget and the batch's clock (a hint: python -m autograder lab07 --hint)")

    def extend_end(self, req: Req, tokens_left: float) -> int:
        """Where ``req``'s extend in this batch ends (from its ``cached_len`` on); charges the clock."""
        raise NotImplementedError("Lab 07: where the extend ends, and its time charged to the clock (a hint: python -m autograder lab07 --hint)")

    def decode_first(self, after_chunk: bool, num_decodable: int) -> bool:
        """Whether the next batch decodes the running requests rather than prefilling."""
        raise NotImplementedError("Lab 07: whether to decode before prefilling (a hint: python -m autograder lab07 --hint)")


def chunk_time(cost: PrefillCost, start: int, end: float) -> float:
    """The time of computing positions ``[start, end)`` of one request under ``cost``."""
    raise NotImplementedError("Lab 07: the modelled time of an extend (a hint: python -m autograder lab07 --hint)")


def fit_cost(samples: list[tuple[int, int, float]]) -> PrefillCost:
    """The least-squares ``PrefillCost`` (both coefficients >= 0) of measured ``(start, end, seconds)``."""
    raise NotImplementedError("Lab 07: the least-squares cost model (a hint: python -m autograder lab07 --hint)")
