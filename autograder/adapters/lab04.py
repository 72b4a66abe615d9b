"""Lab 04 adapter: the functions and the ``PagedAttentionBackend`` class of
``lab04_paged_attention.py``, the backend used only through the ``AttentionBackend`` interface
(``minisgl/attention/base.py``), and the swap-in that lets the real engine run on it: the class
registered in ``minisgl.attention.BACKENDS`` as ``"lab04"``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from autograder.impl import require
from minisgl.attention import BACKENDS
from minisgl.attention.base import AttentionBackend

STEM = "lab04_paged_attention"


def key_mask(starts: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    return require(STEM, "key_mask")(starts, ends)


def paged_attention(q, k_slots, v_slots, md, scale: float) -> torch.Tensor:
    return require(STEM, "paged_attention")(q, k_slots, v_slots, md, scale)


def metadata(kv_slots: torch.Tensor, token_req: torch.Tensor, mask: torch.Tensor):
    """The lab's ``PagedMetadata`` (given in the lab file), built by the tests for ``paged_attention``."""
    return require(STEM, "PagedMetadata")(kv_slots, token_req, mask)


def backend_class() -> type[AttentionBackend]:
    cls = require(STEM, "PagedAttentionBackend")
    if not (isinstance(cls, type) and issubclass(cls, AttentionBackend)):
        raise TypeError("PagedAttentionBackend must be a class derived from minisgl.attention.base.AttentionBackend")
    return cls


def make_backend(pool, table, num_heads: int, head_dim: int) -> AttentionBackend:
    return backend_class()(pool, table, num_heads, head_dim)


@contextmanager
def registered_backend(cls: type[AttentionBackend], name: str = "lab04") -> Iterator[str]:
    """``cls`` as the engine's ``attention_backend=name`` inside the block; yields the name."""
    with BACKENDS.registered(name, cls):
        yield name
