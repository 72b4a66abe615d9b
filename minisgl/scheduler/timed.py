"""Chunks of equal time (``components={"chunking": "timed"}``): the chunking policy sized by a fitted
``PrefillCost`` rather than by a token count (lab 07 asks for it; ``chunking.py`` states the seam)."""

from __future__ import annotations

import math

from minisgl.core import Req
from minisgl.scheduler.chunking import ChunkingPolicy, PrefillCost


def chunk_time(cost: PrefillCost, start: int, end: float) -> float:
    """The time of computing positions ``[start, end)`` of one request (``end`` may be ``inf``)."""
    if math.isinf(end):
        return math.inf
    n = end - start
    return cost.per_token * n + cost.per_pair * n * (start + end + 1) / 2


def fit_cost(samples: list[tuple[int, int, float]]) -> PrefillCost:
    """The ``PrefillCost`` that best explains measured extends ``(start, end, seconds)`` (least squares,
    both coefficients >= 0: a negative one is set to 0 and the other refitted alone)."""
    if not samples or any(e <= s for s, e, _ in samples):
        raise ValueError("fit_cost needs at least one sample, each with end > start")
    rows = [(e - s, (e - s) * (s + e + 1) / 2, t) for s, e, t in samples]  # (tokens, pairs, seconds)
    nn, npp, pp = sum(n * n for n, _, _ in rows), sum(n * p for n, p, _ in rows), sum(p * p for _, p, _ in rows)
    nt, pt = sum(n * t for n, _, t in rows), sum(p * t for _, p, t in rows)
    det = nn * pp - npp * npp
    if det > 1e-12 * nn * pp:  # two independent features: solve the 2x2 normal equations
        a, b = (nt * pp - pt * npp) / det, (pt * nn - nt * npp) / det
        if a >= 0 and b >= 0:
            return PrefillCost(a, b)
        if a < 0:
            return PrefillCost(0.0, max(0.0, pt / pp))
    return PrefillCost(max(0.0, nt / nn), 0.0)  # tokens alone (every sample alike, or pairs' share < 0)


class TimedChunking(ChunkingPolicy):
    """Chunks of equal time, not of equal size: while requests decode, a prefill batch may take as long
    as a ``busy``-token chunk from position 0 under ``cost``, and each extend is the longest that fits
    in what is left of that time (later chunks of a long prompt are shorter: they attend to more keys).
    With ``per_pair == 0`` its batches are ``GreedyChunking``'s. The clock is per batch: ``budget``
    starts it, ``extend_end`` charges it, nothing carries over to the next batch."""

    # lesson 07's fit on the embedded model, 2-core CPU, torch attention: a key ~1/500 of a token's matmuls
    DEFAULT_COST = PrefillCost(per_token=1.0, per_pair=1 / 512)

    def __init__(self, cost: PrefillCost | None = None):
        self.cost = cost or self.DEFAULT_COST
        self.time_left = math.inf  # of the batch being built

    def budget(self, busy: float, idle: float, num_decoding: int) -> float:
        self.time_left = chunk_time(self.cost, 0, busy) if num_decoding else math.inf
        return busy if num_decoding else idle

    def extend_end(self, req: Req, tokens_left: float) -> int:
        start = req.cached_len
        lo, hi = start + 1, int(min(req.device_len, start + tokens_left))
        while lo < hi:  # the largest end in [start + 1, hi] whose time fits; start + 1 if none does
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if chunk_time(self.cost, start, mid) <= self.time_left else (lo, mid - 1)
        self.time_left -= chunk_time(self.cost, start, lo)
        return lo

    def decode_first(self, after_chunk: bool, num_decodable: int) -> bool:
        return after_chunk and num_decodable > 0
