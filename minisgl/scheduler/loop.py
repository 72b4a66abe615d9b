"""The scheduler loop: how one ``step()`` runs the four phases of a batch.

::

    schedule -> prepare -> launch (forward + sample, async on a GPU) -> process (host: tokens out)

The plain loop runs them in order and waits for each batch's tokens. The overlap loop launches
batch ``i+1`` *before* processing batch ``i``, so the host's work of one step hides behind the
device's work of the next::

    host:    sched₁ launch₁ | sched₂ launch₂ process₁ | sched₃ launch₃ process₂ | ...
    device:          fwd₁.......... | fwd₂.............. | fwd₃..............

It is correct because nothing batch ``i+1`` needs comes from the host: its inputs are read from the
token pool on the device, and memory freed while it runs is reused only by later work on the same
stream. A request that finished in batch ``i`` (on EOS) rides along in batch ``i+1`` once; its extra
token is dropped. Both loops give the same tokens.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Protocol

import torch

from minisgl.core import Batch
from minisgl.registry import Registry
from minisgl.scheduler.events import TokenEvent
from minisgl.utils import nvtx_range


class Phases(Protocol):
    """The scheduler's side of the loop contract (``minisgl.scheduler.Scheduler``)."""

    def schedule(self) -> Batch | None:
        """The next batch (requests' counters advanced as if it ran), or None when idle."""

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
        """Hand out a launched batch's tokens (host tensor); finish requests and free their memory."""


class SchedulerLoop(ABC):
    """Lab 08's seam, registered in ``LOOPS``. ``step()`` runs at most one new batch and returns the
    tokens that reached the host during the call; every launched batch is processed exactly once,
    in launch order, after its copy landed (``wait``), and never before the next batch was planned
    from the state the previous ones left."""

    def __init__(self, sched: Phases):
        self.sched = sched

    @abstractmethod
    def step(self) -> list[TokenEvent]: ...

    @property
    @abstractmethod
    def in_flight(self) -> bool:
        """A launched batch whose tokens are not processed yet."""


class PlainLoop(SchedulerLoop):
    def step(self) -> list[TokenEvent]:
        s = self.sched
        with nvtx_range("schedule"):
            batch = s.schedule()
        if batch is None:
            return []
        with nvtx_range("prepare"):
            info = s.prepare(batch)
        with nvtx_range("forward"):
            tokens, ready = s.to_host(s.launch(batch, info))
        with nvtx_range("process"):
            s.wait(ready)
            return s.process(batch, tokens)

    @property
    def in_flight(self) -> bool:
        return False


class OverlapLoop(SchedulerLoop):
    def __init__(self, sched: Phases):
        super().__init__(sched)
        self._pending: tuple[Batch, torch.Tensor, Any] | None = None  # launched, not processed

    def step(self) -> list[TokenEvent]:
        s = self.sched
        with nvtx_range("schedule"):
            batch = s.schedule()
        launched = None
        if batch is not None:
            with nvtx_range("prepare"):
                info = s.prepare(batch)
            with nvtx_range("forward"):
                launched = (batch, *s.to_host(s.launch(batch, info)))
        events: list[TokenEvent] = []
        if self._pending is not None:
            done, tokens, ready = self._pending
            with nvtx_range("process"):
                s.wait(ready)
                events = s.process(done, tokens)
        self._pending = launched
        return events

    @property
    def in_flight(self) -> bool:
        return self._pending is not None


# name -> factory(scheduler)
LOOPS: Registry[type[SchedulerLoop]] = Registry("scheduler loop", {"plain": PlainLoop, "overlap": OverlapLoop})
