"""The engine's two scheduler loops, ``PlainLoop`` and ``OverlapLoop``: the contract they implement,
and why the overlap loop frees a finished request's memory when it does, is ``loop.py``."""

from __future__ import annotations

from typing import Any

import torch

from minisgl.core import Batch, Req
from minisgl.scheduler.events import TokenEvent
from minisgl.scheduler.loop import Phases, SchedulerLoop
from minisgl.utils import nvtx_range


class PlainLoop(SchedulerLoop):
    def step(self) -> list[TokenEvent]:
        s, events = self.sched, []
        with nvtx_range("schedule"):
            batch = s.schedule()
        if batch is not None:
            with nvtx_range("prepare"):
                info = s.prepare(batch)
            with nvtx_range("forward"):
                tokens, ready = s.to_host(s.launch(batch, info))
            with nvtx_range("process"):
                s.wait(ready)
                events = s.process(batch, tokens)
        for req in s.take_finished():  # nothing is in flight: every finished request's memory goes back
            s.free(req)
        return events

    @property
    def in_flight(self) -> bool:
        return False


class OverlapLoop(SchedulerLoop):
    def __init__(self, sched: Phases):
        super().__init__(sched)
        self._pending: tuple[Batch, torch.Tensor, Any] | None = None  # launched, not processed
        self._held: list[Req] = []  # finished, but the pending batch still reads their memory

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
        # NOTE: the batch just launched is the only one in flight; what it reads waits one more step
        reading = set(launched[0].reqs) if launched is not None else set()
        finished, self._held = self._held + s.take_finished(), []
        for req in finished:
            if req in reading:
                self._held.append(req)
            else:
                s.free(req)
        self._pending = launched
        return events

    @property
    def in_flight(self) -> bool:
        return self._pending is not None
