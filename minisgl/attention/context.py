"""The forward context: what a layer deep inside the model needs about the current pass (its batch
and the attention backend that owns the KV pool) but should not be passed through every call."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from minisgl.attention.base import AttentionBackend
from minisgl.core import Batch


@dataclass
class ForwardContext:
    batch: Batch | None = None
    attn_backend: AttentionBackend | None = None


_CTX = ForwardContext()


def get_ctx() -> ForwardContext:
    return _CTX


@contextmanager
def forward_context(batch: Batch, attn_backend: AttentionBackend) -> Iterator[ForwardContext]:
    """Several engines may live in one process (tests, notebooks): each pass sets its own."""
    saved = (_CTX.batch, _CTX.attn_backend)
    _CTX.batch, _CTX.attn_backend = batch, attn_backend
    try:
        yield _CTX
    finally:
        _CTX.batch, _CTX.attn_backend = saved
