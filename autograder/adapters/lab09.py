"""Lab 09 adapter: the ``PaddedPlan`` class of ``lab09_cuda_graphs.py``, used only through the
``GraphPlan`` interface (``minisgl.engine.graph.GraphPlan``) and its ``candidates`` helper, and the swap-in:
the class registered in ``minisgl.engine.graph.GRAPH_PLANS`` as ``"lab09"``
(``LLM(components={"graph_plan": "lab09"})``; the engine captures CUDA graphs only on a GPU, so on CPU the
grader captures and replays simulated graphs through your plan: ``autograder/graph_sim.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from autograder.impl import require
from minisgl.engine.graph import GRAPH_PLANS, GraphPlan

STEM = "lab09_cuda_graphs"


def plan_class() -> type[GraphPlan]:
    cls = require(STEM, "PaddedPlan")
    if not (isinstance(cls, type) and issubclass(cls, GraphPlan)):
        raise TypeError("PaddedPlan must be a class derived from minisgl.engine.graph.GraphPlan")
    return cls


def make_plan() -> GraphPlan:
    return plan_class()()


@contextmanager
def registered_plan(cls: type[GraphPlan], name: str = "lab09") -> Iterator[str]:
    """``cls`` as the engine's ``components={"graph_plan": name}`` inside the block; yields the name."""
    with GRAPH_PLANS.registered(name, cls):
        yield name
