"""The scheduler loop: how one ``step()`` runs the phases of a batch, and when a finished request's
memory goes back.

::

    schedule -> prepare -> launch (forward + sample, async on a GPU) -> to_host, wait -> process
    (process finishes requests; their row and KV pages go back through ``free``, the loop's call)

The plain loop runs them in order and waits for each batch's tokens. The overlap loop launches
batch ``i+1`` *before* processing batch ``i``, so the host's work of one step hides behind the
device's work of the next::

    host:    sched₁ launch₁ | sched₂ launch₂ process₁ | sched₃ launch₃ process₂ | ...
    device:          fwd₁.......... | fwd₂.............. | fwd₃..............

Its tokens are the plain loop's because nothing batch ``i+1`` needs comes from the host: its inputs
are read from the token pool on the device. A request that finished in batch ``i`` (on EOS) is
already in batch ``i+1`` when ``process(i)`` finds out: it rides along once, its extra token is
dropped, and its memory is freed only after batch ``i+1`` was processed.

Why then: a launched batch reads its requests' rows (page table, token pool) and KV pages whenever
the device runs it, and the host knows it has only once that batch's copy landed (``wait``).
Memory given back earlier may go to the next request the host plans, whose page-table entries and
prompt the host writes at once. On minisgl's GPU path those writes queue on the batch's own stream,
after it; they do not where device memory is the host's (on the CPU the page table *is* a host
tensor: a forward run by a worker thread reads it while the host plans) or where the next batch is
prepared on a second stream (Mini-SGLang, which frees the same way). The rule holds on all of them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Protocol

import torch

from minisgl.core import Batch, Req
from minisgl.registry import Registry
from minisgl.scheduler.events import TokenEvent


class Phases(Protocol):
    """The scheduler's side of the loop contract (``minisgl.scheduler.Scheduler``)."""

    def schedule(self) -> Batch | None:
        """The next batch (requests' counters advanced as if it ran), or None when idle. A request
        ``process`` finished is never in a batch planned after that ``process``."""

    def prepare(self, batch: Batch) -> Any:
        """Allocate the batch's KV, build its tensors; returns the sampling info for ``launch``."""

    def launch(self, batch: Batch, info: Any) -> torch.Tensor:
        """Run the forward pass and sampling (asynchronous on a GPU); the sampled ids, on the device,
        are also written into the token pool, where the next batch reads its inputs."""

    def to_host(self, tokens: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Start copying ``tokens`` to the host; returns the host tensor and what to wait on."""

    def wait(self, ready: Any) -> None:
        """Block until a ``to_host`` copy has landed."""

    def process(self, batch: Batch, tokens: torch.Tensor) -> list[TokenEvent]:
        """Hand out a launched batch's tokens (host tensor) and finish the requests that are done
        (EOS, length). A finished request keeps its row and KV pages until ``free``."""

    def take_finished(self) -> list[Req]:
        """The requests finished (by ``process``, or aborted) since the last call, still holding
        their memory, each returned once."""

    def free(self, req: Req) -> None:
        """Give a finished request's row and KV pages back (whole pages to the prefix cache); once
        per request, and only when no launched, unprocessed batch contains it."""


class SchedulerLoop(ABC):
    """Lab 08's seam, registered in ``LOOPS``. ``step()`` runs at most one new batch and returns the
    tokens that reached the host during the call; every launched batch is processed exactly once,
    in launch order, after its copy landed (``wait``), and never before the next batch was planned
    from the state the previous ones left. Every request ``take_finished`` returns is ``free``d once,
    in the first step where no launched, unprocessed batch contains it."""

    def __init__(self, sched: Phases):
        self.sched = sched

    @abstractmethod
    def step(self) -> list[TokenEvent]: ...

    @property
    @abstractmethod
    def in_flight(self) -> bool:
        """A launched batch whose tokens are not processed yet."""


# name -> factory(scheduler); the engine's loops are in loops.py, imported on first use
LOOPS: Registry[type[SchedulerLoop]] = Registry(
    "scheduler loop", {"plain": "minisgl.scheduler.loops:PlainLoop", "overlap": "minisgl.scheduler.loops:OverlapLoop"}
)
