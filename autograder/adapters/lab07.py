"""Lab 07 adapter: ``chunk_time``, ``fit_cost`` and the ``TimedChunking`` class of ``lab07_chunking.py``, the
class used only through the ``ChunkingPolicy`` interface (``minisgl.scheduler.ChunkingPolicy``), and the
swap-in that lets the real engine run on it: the class (with a cost model) registered in
``minisgl.scheduler.CHUNKING_POLICIES`` as ``"lab07"`` (``LLM(components={"chunking": "lab07"})``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from autograder.impl import require
from minisgl.scheduler.chunking import CHUNKING_POLICIES, ChunkingPolicy, PrefillCost

STEM = "lab07_chunking"


def chunk_time(cost: PrefillCost, start: int, end: float) -> float:
    return require(STEM, "chunk_time")(cost, start, end)


def fit_cost(samples: list[tuple[int, int, float]]) -> PrefillCost:
    return require(STEM, "fit_cost")(samples)


def policy_class() -> type[ChunkingPolicy]:
    cls = require(STEM, "TimedChunking")
    if not (isinstance(cls, type) and issubclass(cls, ChunkingPolicy)):
        raise TypeError("TimedChunking must be a class derived from minisgl.scheduler.chunking.ChunkingPolicy")
    return cls


def make_policy(cost: PrefillCost | None = None) -> ChunkingPolicy:
    return policy_class()(cost)


def with_cost(cls: type, cost: PrefillCost) -> Callable[[], ChunkingPolicy]:
    """What the scheduler constructs (it calls the registered entry with no arguments): ``cls(cost)``."""
    return lambda: cls(cost)


@contextmanager
def registered_policy(cls: type, cost: PrefillCost, name: str = "lab07") -> Iterator[str]:
    """``cls(cost)`` as the engine's ``components={"chunking": name}`` inside the block; yields the name."""
    with CHUNKING_POLICIES.registered(name, with_cost(cls, cost)):  # type: ignore[arg-type]
        yield name
