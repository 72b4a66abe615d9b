"""The data model: sampling parameters, a request, a batch, and the forward context.

The life of a request, in lengths (positions are token indices in the request's sequence)::

    prompt tokens                          sampled tokens
    |<------------- prompt_len ------------->|<-- outputs -->|
    |<--- cached_len: KV in the pool --->|                   |
    |<------------------------- device_len ----------------->|  tokens in the token pool
                                         [cached_len, device_len) is what the next
                                         forward pass extends (all of it or a chunk)

Invariant: ``cached_len < device_len <= max_device_len``. A prefill (or a chunk of one) extends
``[cached_len, cached_len + chunk)``; when a pass reaches ``device_len`` the sampled token is kept
and ``device_len`` grows by one. A decode pass extends exactly one token. The scheduler moves these
counters when it *schedules* a batch (so the next batch can be planned before this one finishes,
which overlap scheduling needs); outputs are appended when the sampled token reaches the host.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch

if TYPE_CHECKING:
    from minisgl.attention.base import AttentionBackend


@dataclass
class SamplingParams:
    """How to pick tokens. ``temperature == 0`` means greedy; ``top_k <= 0`` and ``top_p == 1``
    disable those filters. ``seed`` makes a sampled request repeatable whatever it is batched with."""

    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    max_tokens: int = 256
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None

    def validate(self) -> None:
        """Raise ``ValueError`` naming the field and what to change."""
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens <= 0:
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 means greedy), got {self.temperature!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool):
            raise ValueError(f"top_k must be an integer (<= 0 disables it), got {self.top_k!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


FinishReason = Literal["stop", "length", "abort"]


@dataclass(eq=False)
class Req:
    """One request inside the scheduler. ``eq=False``: requests compare (and hash) by identity."""

    uid: int
    input_ids: list[int]
    sampling: SamplingParams
    seed: int  # the sampling seed actually used (SamplingParams.seed or one drawn at submission)
    table_idx: int = -1  # row in the request table (page table + token pool)
    cached_len: int = 0
    device_len: int = 0
    max_device_len: int = 0
    output_ids: list[int] = field(default_factory=list)
    cache_handle: Any = None  # prefix-cache handle of the locked matched prefix
    alloc_len: int = 0  # positions [0, alloc_len) have KV slots in the page table
    hit_len: int = 0  # prompt tokens served from the prefix cache at admission
    locked_len: int = 0  # positions [0, locked_len) are the cache's, locked by cache_handle
    finish_reason: FinishReason | None = None

    def __post_init__(self) -> None:
        self.device_len = len(self.input_ids)
        self.max_device_len = len(self.input_ids) + self.sampling.max_tokens

    @property
    def prompt_len(self) -> int:
        return len(self.input_ids)

    @property
    def num_scheduled_outputs(self) -> int:
        """Tokens sampled or being sampled on the device (>= len(output_ids))."""
        return self.device_len - self.prompt_len

    @property
    def can_decode(self) -> bool:
        """True while one more decode step may still produce a wanted token."""
        return self.finish_reason is None and self.device_len < self.max_device_len

    def all_token_ids(self) -> list[int]:
        return self.input_ids + self.output_ids


@dataclass(eq=False)
class Batch:
    """One forward pass. ``reqs[i]`` extends positions ``[starts[i], ends[i])``.

    ``phase`` is ``"prefill"`` when any request extends more than its last token (or is a first
    chunk), else ``"decode"``. Tensors below are filled by the scheduler before the forward pass;
    ``attn_metadata`` by the attention backend, once per batch."""

    reqs: list[Req]
    phase: Literal["prefill", "decode"]
    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    # rows that sample a kept token (their pass reaches device_len); others are mid-prompt chunks
    sample_mask: list[bool] = field(default_factory=list)
    input_ids: torch.Tensor | None = None  # [num_tokens] on device
    positions: torch.Tensor | None = None  # [num_tokens]
    out_loc: torch.Tensor | None = None  # [num_tokens] KV slot of each new token
    table_idx: torch.Tensor | None = None  # [padded_size] request-table rows
    logit_idx: torch.Tensor | None = None  # [padded_size] index of each request's last token
    attn_metadata: Any = None
    padded_size: int = 0  # >= len(reqs) when a CUDA graph pads the batch

    @property
    def size(self) -> int:
        return len(self.reqs)

    @property
    def is_prefill(self) -> bool:
        return self.phase == "prefill"

    @property
    def is_decode(self) -> bool:
        return self.phase == "decode"

    @property
    def num_tokens(self) -> int:
        return sum(e - s for s, e in zip(self.starts, self.ends))


@dataclass
class ForwardContext:
    """What a layer deep inside the model needs but should not be passed through every call."""

    batch: Batch | None = None
    attn_backend: AttentionBackend | None = None  # owns the KV pool it reads and writes


_CTX = ForwardContext()


def get_ctx() -> ForwardContext:
    return _CTX


@contextmanager
def forward_context(batch: Batch, attn_backend: AttentionBackend):
    """Several engines may live in one process (tests, notebooks): each pass sets its own."""
    saved = (_CTX.batch, _CTX.attn_backend)
    _CTX.batch, _CTX.attn_backend = batch, attn_backend
    try:
        yield _CTX
    finally:
        _CTX.batch, _CTX.attn_backend = saved
