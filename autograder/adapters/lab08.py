"""Lab 08 adapter: the ``OverlapLoop`` class of ``lab08_overlap.py``, used only through the
``SchedulerLoop`` interface (``minisgl.scheduler.loop.SchedulerLoop``: ``step()`` and ``in_flight``), and the
swap-in that lets the real engine run on it: a loop factory registered in ``minisgl.scheduler.LOOPS``
as ``"lab08"`` (``LLM(components={"loop": "lab08"})``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from autograder.impl import require
from minisgl.scheduler.loop import LOOPS, Phases, SchedulerLoop

STEM = "lab08_overlap"


def loop_class() -> type[SchedulerLoop]:
    cls = require(STEM, "OverlapLoop")
    if not (isinstance(cls, type) and issubclass(cls, SchedulerLoop)):
        raise TypeError("OverlapLoop must be a class derived from minisgl.scheduler.loop.SchedulerLoop")
    return cls


def make_loop(phases: Phases) -> SchedulerLoop:
    return loop_class()(phases)


@contextmanager
def registered_loop(factory: Callable[[Phases], SchedulerLoop], name: str = "lab08") -> Iterator[str]:
    """``factory`` (a loop class, or a function of the scheduler returning a loop) as the engine's
    ``components={"loop": name}`` inside the block; yields the name."""
    with LOOPS.registered(name, factory):
        yield name
