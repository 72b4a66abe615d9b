"""Chunks of equal time (``components={"chunking": "timed"}``): the chunking policy sized by a fitted
``PrefillCost`` rather than by a token count (lab 07 asks for it; ``chunking.py`` states the seam); and
``"adaptive"``, the same in seconds, measured as it runs (what ``--step-time`` turns on)."""

from __future__ import annotations

import math
from collections import deque

from minisgl.core import Req
from minisgl.scheduler.chunking import ChunkingPolicy, PrefillCost
from minisgl.scheduler.events import BatchEvent


def chunk_time(cost: PrefillCost, start: int, end: float) -> float:
    """The time of computing positions ``[start, end)`` of one request (``end`` may be ``inf``)."""
    if math.isinf(end):
        return math.inf
    n = end - start
    return cost.per_token * n + cost.per_pair * n * (start + end + 1) / 2


def tokens_in(cost: PrefillCost, time: float) -> float:
    """The most tokens a prompt computes from position 0 within ``time`` (``chunk_time(cost, 0, n) <= time``)."""
    a, b = cost.per_pair / 2, cost.per_token + cost.per_pair / 2  # chunk_time(cost, 0, n) = a n^2 + b n
    if a > 0:
        return math.floor((math.sqrt(b * b + 4 * a * time) - b) / (2 * a))
    return math.floor(time / b) if b > 0 else math.inf


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


class AdaptiveChunking(TimedChunking):
    """Prefill batches of about ``target_s`` seconds (``--step-time``), idle or not, on any machine: the
    cost model's shape is ``TimedChunking``'s, its scale (seconds per unit) is measured as the engine runs,
    from the last ``WINDOW`` prefill batches (their seconds over their units, so large batches weigh more).
    Until the first measurement a batch is at most ``FIRST_TOKENS`` (a small, safe first step). Token budgets
    still cap every batch. The scheduler feeds ``observe`` every processed batch. Tensor-parallel ranks must
    all decide alike: rank 0 measures and logs each new scale (``on_pace``), the others (``measures =
    False``) ``calibrate`` to it.

    The measured speed never cuts a short prompt: a batch may always hold ``FIRST_TOKENS`` tokens, and a
    prompt with at most that many left is cut by the token budget only, never by time. So a prompt that
    short, prefilled alone, is one extend whatever the engine measured (its tokens cannot change with
    the speed the traffic before it left behind); only a longer prompt's cuts follow the speed."""

    WINDOW = 8
    FIRST_TOKENS = 128  # the most a batch computes before any measurement (CPU_PREFILL_LENGTH); never cut by time
    measures = True  # False on tensor-parallel ranks 1..N-1

    def __init__(self, cost: PrefillCost | None = None, target_s: float = 0.5):
        super().__init__(cost)
        self.target_s = target_s
        self.forget()

    def forget(self) -> None:
        """Back to unmeasured (the warm-up's steps compiled kernels); the next prefill batch is the first
        again, not measured (``observe``). Tensor-parallel ranks follow (``on_pace(None)``)."""
        self.seconds_per_unit: float | None = None  # the scale in use (None: not measured yet)
        self._tokens = math.inf  # the token budget of the batch being built
        self._samples: deque[tuple[float, float]] = deque(maxlen=self.WINDOW)  # (units, seconds)
        self._first = True
        if self.on_pace is not None:
            self.on_pace(None)

    def budget(self, busy: float, idle: float, num_decoding: int) -> float:
        tokens = busy if num_decoding else idle
        if self.seconds_per_unit is None:
            tokens, self.time_left = min(tokens, self.FIRST_TOKENS), math.inf
        else:  # as many tokens as the target's time holds from position 0, and FIRST_TOKENS at least
            self.time_left = self.target_s / self.seconds_per_unit
            tokens = min(tokens, max(self.FIRST_TOKENS, tokens_in(self.cost, self.time_left)))
        self._tokens = tokens
        return tokens

    def extend_end(self, req: Req, tokens_left: float) -> int:
        if req.device_len - req.cached_len > self.FIRST_TOKENS:
            return super().extend_end(req, tokens_left)
        end = int(min(req.device_len, req.cached_len + tokens_left))  # a short prompt: tokens decide
        self.time_left -= chunk_time(self.cost, req.cached_len, end)
        return end

    def alongside(self, waiting: list[Req]) -> list[Req]:
        """While a long prompt is being chunked, the waiting requests (in order) that may start in the next
        batch before its next chunk: each whole, all together within half the batch's time and tokens, so
        a short request arriving behind a long one starts within a step instead of after the whole prompt.
        (Called after ``budget``.)"""
        time_left, tokens_left, joiners = self.time_left / 2, self._tokens / 2, []
        for req in waiting:
            need = chunk_time(self.cost, 0, req.device_len)
            if need > time_left or req.device_len > tokens_left:
                break
            joiners.append(req)
            time_left, tokens_left = time_left - need, tokens_left - req.device_len
        return joiners

    def observe(self, ev: BatchEvent) -> None:
        """Rescale from a processed prefill batch's time (a decode batch says nothing about prefill speed).
        The first prefill batch is not measured: it pays what a step pays once (the wait for the C++
        kernels' compile on a machine without them, allocations, first calls), 92x a later one's time
        on the 2-core CPU with an empty kernel cache."""
        # the whole step, planning to tokens (on a CPU the forward pass runs inside the launch)
        seconds = ev.t_done - ev.t_scheduled
        if not self.measures or ev.kind != "prefill" or ev.t_scheduled <= 0 or seconds <= 0:
            return
        if self._first:
            self._first = False
            return
        units = sum(chunk_time(self.cost, s, e) for s, e in zip(ev.starts, ev.ends))
        self._samples.append((units, seconds))
        scale = sum(t for _, t in self._samples) / sum(u for u, _ in self._samples)
        self.calibrate(scale)
        if self.on_pace is not None:
            self.on_pace(scale)

    def calibrate(self, seconds_per_unit: float | None) -> None:
        self.seconds_per_unit = seconds_per_unit
