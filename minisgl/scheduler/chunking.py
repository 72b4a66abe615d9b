"""Chunked prefill: how much of a prompt a prefill batch computes, and when decodes cut in.

A prefill batch computes at most ``max_prefill_length`` new tokens. A prompt that does not fit in
what is left of the batch is cut: its first chunk runs now, the rest in later batches (its KV up to
the cut is written, so each next chunk attends to the earlier ones as a cached prefix)::

    batch 1: [req A: 0 ........ 600 | req B: 0 ... 412 ✂]        budget 1024
    batch 2: decode of A and the other running requests          (one decode step between chunks)
    batch 3: [req B: 412 ............... 1436 ✂]

A fixed token budget makes chunks of equal *size*, but not of equal *time*: a chunk's queries attend
to every key before them, so the last chunk of a long prompt costs more than its first. The policy
registered as ``"timed"`` (``components={"chunking": "timed"}``) sizes every chunk by a fitted
``PrefillCost`` instead, so that no batch a decoding request waits for takes longer than a
``max_prefill_length`` chunk from position 0.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from minisgl.core import Req
from minisgl.registry import Registry

if TYPE_CHECKING:
    from minisgl.scheduler.events import BatchEvent


class ChunkingPolicy(ABC):
    """Lab 07's seam, registered in ``CHUNKING_POLICIES``. Three methods decide; the members after them
    are optional (a policy that measures the engine's speed overrides them; the defaults do nothing)."""

    measures = False  # True: the scheduler feeds ``observe`` each processed batch (False on TP ranks 1..N-1)
    target_s = 0.5  # a measuring policy's prefill batch time (``--step-time`` sets it)
    on_pace: Callable[[float | None], None] | None = None  # tensor parallelism: rank 0 logs each new speed

    @abstractmethod
    def budget(self, busy: float, idle: float, num_decoding: int) -> float:
        """New tokens the next prefill batch may compute: the configured budgets are ``busy``
        (``max_prefill_length``) and ``idle`` (``idle_prefill_length``; ``inf``: none), and
        ``num_decoding`` requests decode now (each waits for this batch: its time is a gap in their
        streams)."""

    @abstractmethod
    def extend_end(self, req: Req, tokens_left: float) -> int:
        """Where ``req``'s extend in this batch ends, given ``tokens_left > 0`` new tokens left in the
        batch (``inf``: no budget). It starts at ``req.cached_len``; the result is in
        ``(req.cached_len, req.device_len]`` (``device_len``: the prompt, plus the outputs of a
        retracted request) and at most ``req.cached_len + tokens_left``. A result below
        ``device_len`` cuts the prompt: the request continues first in the next prefill batch."""

    @abstractmethod
    def decode_first(self, after_chunk: bool, num_decodable: int) -> bool:
        """Whether the next batch decodes the running requests (``num_decodable`` of them) rather
        than prefilling, when both could run; ``after_chunk``: the last batch cut a prompt."""

    def alongside(self, waiting: list[Req]) -> list[Req]:
        """While a prompt is being chunked, the waiting requests that start whole before its next chunk
        (called after ``budget``); none by default."""
        return []

    def observe(self, ev: BatchEvent) -> None:
        """A processed batch's event (only while ``measures``)."""
        return None

    def forget(self) -> None:
        """Drop what was measured (the warm-up's steps compiled kernels: no measure of speed)."""
        return None


class GreedyChunking(ChunkingPolicy):
    """Fill the batch: a prompt takes all the tokens left; one decode step between two chunks, so
    a long prompt delays the running requests' next token by one chunk at most."""

    def budget(self, busy: float, idle: float, num_decoding: int) -> float:
        return busy if num_decoding else idle  # nobody waits for a batch while nothing decodes

    def extend_end(self, req: Req, tokens_left: float) -> int:
        return int(min(req.device_len, req.cached_len + tokens_left))

    def decode_first(self, after_chunk: bool, num_decodable: int) -> bool:
        return after_chunk and num_decodable > 0


@dataclass(frozen=True)
class PrefillCost:
    """A prefill extend's time, fitted from measured batches (lesson 07): ``per_token`` for each new
    token (the matmuls) plus ``per_pair`` for each (query, key) pair its attention computes (the new
    token at position ``p`` attends to the ``p + 1`` keys ``[0, p]``). Any unit: only ratios matter."""

    per_token: float = 1.0
    per_pair: float = 0.0


CHUNKING_POLICIES: Registry[type[ChunkingPolicy]] = Registry(
    "chunking policy",
    {
        "default": GreedyChunking,  # with step_time set (the server's default on a CPU): "adaptive"
        "timed": "minisgl.scheduler.timed:TimedChunking",
        "adaptive": "minisgl.scheduler.timed:AdaptiveChunking",
    },
)
