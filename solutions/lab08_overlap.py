"""Lab 08: the overlap loop.

You implement ``OverlapLoop``, a ``SchedulerLoop`` (the interface, ``minisgl.scheduler.loop.SchedulerLoop``:
``step()`` and ``in_flight``; it drives the scheduler's ``Phases``, the protocol next to it). The engine's
plain loop runs the phases in order: a step plans, launches and processes one batch, so the device idles
while the host plans and processes::

    plain    host:   sched₁ launch₁ wait···· process₁ | sched₂ launch₂ wait···· process₂ | ...
             device:                fwd₁····          |               fwd₂····

Yours is one step behind: each ``step()`` launches the next batch *before* it processes the
results of the previous one, so the host's work hides behind the device's::

    overlap  host:   sched₁ launch₁ | sched₂ launch₂ wait process₁ | sched₃ launch₃ wait process₂ | ...
             device:        fwd₁··········|········ fwd₂·················|········ fwd₃···

Contract (the grader runs your loop on a recording stand-in for the scheduler, then inside the real
engine, against the plain loop's tokens; derive from ``SchedulerLoop`` and write ``step`` and ``in_flight``
here: a class that derives from, calls or aliases the engine's ``OverlapLoop`` or ``PlainLoop`` scores 0):

* **One step.** ``sched.schedule()`` first: the next batch, planned from the state the previous
  batches left (the scheduler advances a request's counters when it prepares a batch, so batch
  ``i+1`` can be planned before batch ``i``'s tokens are known). If it is a batch:
  ``info = sched.prepare(batch)``, ``tokens = sched.launch(batch, info)`` (the forward pass, queued
  on the device; its inputs come from the token pool on the device, where ``launch`` of the batch
  before wrote its samples), then ``sched.to_host(tokens)``, which starts the copy of the sampled
  ids to the host and returns ``(host_tokens, ready)``. Only then, if a batch launched in an earlier
  step is still pending: ``sched.wait(its ready)`` and ``sched.process(that batch, its host
  tokens)``. The step returns what that ``process`` returned (``[]`` when nothing was processed).
* **Keep the launched batch pending**: ``(batch, host_tokens, ready)`` for the next step. Every
  launched batch is processed exactly once, in launch order, in the step after its launch.
* **Drain.** When ``schedule()`` returns None there is nothing to launch (never call ``prepare``
  with None), but the pending batch, if any, is still processed and its tokens returned.
* ``in_flight`` is True exactly while a launched batch waits to be processed (the scheduler keeps
  stepping while it is: ``Scheduler.has_work``).

Why the tokens are the plain loop's: nothing batch ``i+1`` needs comes from the host. A request that
finished in batch ``i`` (it sampled EOS) is not known to be finished when batch ``i+1`` is planned:
it rides along one step, and ``process`` drops its extra token. Its memory is freed by ``process``,
after batch ``i+1`` was launched, so its slots are never reused by a batch that is not queued after it.

Pitfalls the grader recognises (its messages name them):

* processing a batch in the same step that launched it (that is the plain loop: nothing overlaps);
* processing before ``schedule()`` or before ``launch`` of the next batch (the device idles while the
  host works; before launch, a finished request's memory is freed while the next batch still uses it);
* waiting for or processing the pending batch before ``to_host`` of the new one (its copy then overlaps
  nothing, and the next step waits for all of it);
* processing one step late (two batches pending), or the newest pending batch first;
* never draining the last batch when ``schedule()`` returns None, or dropping its tokens;
* processing without ``wait`` (on a GPU the host copy may not have landed yet), waiting on another batch's
  copy (the one just launched), or processing ``launch``'s device tensor instead of the host copy;
* calling ``prepare``/``launch`` with None; ``in_flight`` that does not say whether a batch is
  pending; processing a batch twice.

Grading: ``python -m autograder lab08`` runs fixed and random schedules on a recording stand-in for
the scheduler's phases (the order of every call is checked), then the engine with your loop
(``components={"loop": "lab08"}``) on a tiny model, with requests arriving mid-run and finishing at
different steps: the tokens must be the plain loop's, and no request's memory may be freed before a
batch that computes it was launched.
"""

from __future__ import annotations

from typing import Any

import torch

from minisgl.core import Batch
from minisgl.scheduler.events import TokenEvent
from minisgl.scheduler.loop import Phases, SchedulerLoop


class OverlapLoop(SchedulerLoop):
    """The one-step-behind loop (the contract is the module docstring)."""

    def __init__(self, sched: Phases):
        super().__init__(sched)
        self.pending: tuple[Batch, torch.Tensor, Any] | None = None  # launched, not processed yet

    def step(self) -> list[TokenEvent]:
        """Launch the next batch (if any), then process the one launched in the previous step."""
        # BEGIN SOLUTION hint="schedule; a batch: prepare, launch, to_host; then wait, process self.pending"
        s = self.sched
        batch = s.schedule()
        launched = None
        if batch is not None:
            device_tokens = s.launch(batch, s.prepare(batch))
            host_tokens, ready = s.to_host(device_tokens)
            launched = (batch, host_tokens, ready)
        events: list[TokenEvent] = []
        if self.pending is not None:
            previous, previous_tokens, previous_ready = self.pending
            s.wait(previous_ready)
            events = s.process(previous, previous_tokens)
        self.pending = launched
        return events
        # END SOLUTION

    @property
    def in_flight(self) -> bool:
        """A launched batch whose tokens are not processed yet."""
        # BEGIN SOLUTION hint="whether a launched batch is pending"
        return self.pending is not None
        # END SOLUTION
