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

* ``chunk_time(cost, start, end)``: the time of computing positions ``[start, end)`` of one request:
  ``cost.per_token`` per new token plus ``cost.per_pair`` per (query, key) pair, where the token at
  position ``p`` attends to the ``p + 1`` keys ``[0, p]`` (itself included), so a chunk after a cached
  prefix pays for the prefix's keys too. ``end`` may be ``inf`` (then the time is ``inf``, even with
  ``per_pair == 0``); ``start == end`` costs 0.
* ``fit_cost(samples)``: the ``PrefillCost`` that best explains measured extends ``(start, end, seconds)``:
  least squares of ``seconds ~ per_token * tokens + per_pair * pairs`` (no intercept), both coefficients
  ``>= 0``. Solve the 2x2 normal equations; when the samples cannot tell the two apart (their
  determinant is 0: every sample has the same pairs per token, a single sample included), or the fit
  gives ``per_pair < 0``, fit ``per_token`` alone (``per_pair = 0``); when it gives ``per_token < 0``, fit
  ``per_pair`` alone. Never a negative coefficient. Raise ``ValueError`` for no samples, or a sample whose
  ``end <= start``.
* ``TimedChunking``, a ``ChunkingPolicy`` (write all three methods; ``__init__`` is given):

  * ``budget(busy, idle, num_decoding)``: the tokens the batch may compute, ``busy`` while any request
    decodes (``num_decoding > 0``), ``idle`` while none does (never assume ``idle >= busy``; either may be
    ``inf``). It also starts the batch's clock, ``self.time_left``: while requests decode, the time of a
    ``busy``-token chunk from position 0 (``chunk_time(cost, 0, busy)``: the gap the configuration
    promises); while none does, ``inf`` (nobody waits: the first token as early as possible).
  * ``extend_end(req, tokens_left)``: the extend starts at ``req.cached_len`` (a cached prefix, or the
    chunks before); it ends at the largest ``end <= req.device_len`` (the prompt, plus the outputs of a
    retracted request) with ``end - cached_len <= tokens_left`` and ``chunk_time(cost, cached_len, end) <=
    self.time_left`` (exactly on the time left is allowed). At least one token: an extend is never empty,
    so if not even ``cached_len + 1`` fits, the end is ``cached_len + 1`` (a target smaller than one
    token's cost still makes progress; the cut ends the batch). Charge the extend's time to
    ``self.time_left`` (several requests share one batch's clock) and return an ``int``.
  * ``decode_first(after_chunk, num_decodable)``: True exactly when the last batch cut a prompt and some
    request can decode; otherwise prefill first.

  The clock is the only state, and it lives for one batch (``budget`` resets it): no progress of a request
  is kept (a retracted request starts over from its ``req.cached_len``; tensor-parallel ranks must decide
  alike). With ``per_pair == 0`` its batches are exactly ``GreedyChunking``'s.

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
* a clock that is not charged (two requests each take the whole gap), or not reset by ``budget`` (every
  batch after the first gets less time);
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
        raise NotImplementedError("Lab 07: decoding: busy, clock chunk_time(cost, 0, busy); else idle, clock inf")

    def extend_end(self, req: Req, tokens_left: float) -> int:
        """Where ``req``'s extend in this batch ends (it starts at ``req.cached_len``); charges the clock."""
        raise NotImplementedError("Lab 07: largest end fitting tokens_left and time_left (<=); >= cached_len+1; charge")

    def decode_first(self, after_chunk: bool, num_decodable: int) -> bool:
        """Whether the next batch decodes the running requests rather than prefilling."""
        raise NotImplementedError("Lab 07: True only right after a cut prompt, and only if some request can decode")


def chunk_time(cost: PrefillCost, start: int, end: float) -> float:
    """The time of computing positions ``[start, end)`` of one request under ``cost``."""
    raise NotImplementedError("Lab 07: per_token * tokens + per_pair * pairs (p attends to p + 1 keys)")


def fit_cost(samples: list[tuple[int, int, float]]) -> PrefillCost:
    """The least-squares ``PrefillCost`` (both coefficients >= 0) of measured ``(start, end, seconds)``."""
    raise NotImplementedError("Lab 07: 2x2 normal equations over (tokens, pairs); det 0 or < 0: fit one alone")
