"""Lab 07 adapter: the ``BudgetChunking`` class of ``lab07_chunking.py``, used only through the
``ChunkingPolicy`` interface (``minisgl.scheduler.ChunkingPolicy``), and the swap-in that lets the real
engine run on it: the class registered in ``minisgl.scheduler.CHUNKING_POLICIES`` as ``"lab07"``
(``LLM(components={"chunking": "lab07"})``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from autograder.impl import require
from minisgl.scheduler.chunking import CHUNKING_POLICIES, ChunkingPolicy

STEM = "lab07_chunking"


def policy_class() -> type[ChunkingPolicy]:
    cls = require(STEM, "BudgetChunking")
    if not (isinstance(cls, type) and issubclass(cls, ChunkingPolicy)):
        raise TypeError("BudgetChunking must be a class derived from minisgl.scheduler.chunking.ChunkingPolicy")
    return cls


def make_policy() -> ChunkingPolicy:
    return policy_class()()


@contextmanager
def registered_policy(cls: type[ChunkingPolicy], name: str = "lab07") -> Iterator[str]:
    """``cls`` as the engine's ``components={"chunking": name}`` inside the block; yields the name."""
    with CHUNKING_POLICIES.registered(name, cls):
        yield name
