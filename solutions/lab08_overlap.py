"""Lab 08: the overlap loop, and when a finished request's memory may go back.

You implement ``OverlapLoop``, a ``SchedulerLoop`` (the interface, ``minisgl.scheduler.loop.SchedulerLoop``:
``step()`` and ``in_flight``; it drives the scheduler's ``Phases``, the protocol next to it). The engine's
plain loop runs the phases in order: a step plans, launches and processes one batch, so the device idles
while the host plans and processes::

    plain    host:   sched₁ launch₁ wait···· process₁ | sched₂ launch₂ wait···· process₂ | ...
             device:                fwd₁····          |               fwd₂····

Yours is one step behind: each ``step()`` launches the next batch *before* it processes the results of
the previous one, so the host's work hides behind the device's::

    overlap  host:   sched₁ launch₁ | sched₂ launch₂ wait process₁ | sched₃ launch₃ wait process₂ | ...
             device:        fwd₁··········|········ fwd₂·················|········ fwd₃···

Write it here (derive from ``SchedulerLoop``; write ``__init__``, ``step``, ``free_finished`` and
``in_flight``): a class that derives from, calls or aliases the engine's ``OverlapLoop`` or ``PlainLoop``
scores 0. The grader runs your loop on a recording stand-in for the scheduler's phases, then inside the real
engine, against the plain loop's tokens. What must hold:

* **One new batch a step, planned first.** A ``step()`` asks ``schedule()`` once, first. A batch it returns
  is prepared, launched and its tokens' copy to the host started (``to_host``) in that same step, before
  the host waits for or processes anything; ``None`` means nothing new (nothing is prepared or launched).
* **One step behind.** Every launched batch is processed exactly once, in launch order, in the step after
  the one that launched it, after that step's new batch (if any) was launched and its copy started: the
  device always has the next batch queued while the host works. ``process`` gets the batch's host copy
  (what ``to_host`` returned first for it, never ``launch``'s device tensor), and only after ``wait`` on
  that batch's own ready handle. The step returns what ``process`` returned, ``[]`` when it processed
  nothing.
* **Drain.** A step whose ``schedule()`` returns ``None`` still processes the batch launched in the step
  before; after it nothing is in flight.
* ``in_flight`` is True exactly while a launched batch waits to be processed (the scheduler keeps stepping
  while it is: ``Scheduler.has_work``).
* **Memory.** ``process`` finishes requests (EOS, length) without freeing them, and an abort (between
  steps) finishes one too: ``take_finished()`` returns each finished request once, still holding its
  table row and KV pages. Each must be given back, ``free(req)``, exactly once, at the end of a step (after
  its ``process``): in the first step after which no launched, unprocessed batch contains it
  (``batch.reqs``). Not earlier (the memory is still read), not later (memory held for nothing keeps
  waiting requests out).

Example: ``schedule()`` returns batches A, B, then ``None`` twice; request ``r`` samples EOS in A but is
already in B (it rides along), request ``q`` reaches its length limit in A (the planner knew: it is not in B)::

    step 1: schedule -> A, prepare A, launch A, to_host(A)                      returns []
    step 2: schedule -> B, prepare B, launch B, to_host(B), wait A, process A  returns A's tokens; free q
    step 3: schedule -> None, wait B, process B                                  returns B's tokens; free r
    step 4: schedule -> None                                                     returns []

Why the tokens are the plain loop's: nothing batch ``i+1`` needs comes from the host. A request that
finished in batch ``i`` (it sampled EOS) is not known to be finished when batch ``i+1`` is planned: it
rides along one step, and ``process`` drops its extra token.

Why the memory waits: batch ``i+1`` was built with that request's row and pages, and the device reads
them whenever it runs the batch; the host knows it has only once the batch's copy landed and it was
processed. Freed earlier, they may go to the next request the host admits, whose page-table entries and
prompt the host writes at once: on an engine that prepares on a second stream, or where the page table
is host memory the device reads (a CPU forward on a worker thread), the running batch then reads another
request's pages. (minisgl's GPU path queues those writes after the batch, on one stream, so there it
would happen to be harmless; the contract is what holds everywhere, and the grader checks it at every
``free``.) A request that finished at its length limit is known done when the next batch is planned:
it is not in it, and goes back at once.

Pitfalls the grader recognises (its messages name them):

* processing a batch in the same step that launched it (that is the plain loop: nothing overlaps);
* processing before ``schedule()`` or before ``launch`` of the next batch (the device idles while the
  host works);
* waiting for or processing the pending batch before ``to_host`` of the new one (its copy then overlaps
  nothing, and the next step waits for all of it);
* processing one step late (two batches pending), or the newest pending batch first;
* never draining the last batch when ``schedule()`` returns None, or dropping its tokens;
* processing without ``wait`` (on a GPU the host copy may not have landed yet), waiting on another batch's
  copy (the one just launched), or processing ``launch``'s device tensor instead of the host copy;
* calling ``prepare``/``launch`` with None; ``in_flight`` that does not say whether a batch is
  pending; processing a batch twice;
* freeing a finished request while the batch just launched still contains it (freed early: the request
  that rode along), or freeing what ``take_finished`` returns before ``process`` of the step ran;
* keeping a request that no launched batch reads (freed a step late: checking the held requests as a
  group, "is any of them in the new batch", instead of each one), or never freeing the held ones when
  nothing new is launched (the drain: memory that never comes back); freeing a request twice.

Grading: ``python -m autograder lab08`` runs fixed and random schedules on a recording stand-in for
the scheduler's phases (the order of every call is checked, and every ``free`` against the batches in
flight), then the engine with your loop (``components={"loop": "lab08"}``) on a tiny model, with
requests arriving mid-run, finishing at different steps and one aborted: the tokens must be the plain
loop's, and no request's memory may be freed while a launched batch that reads it is unprocessed.
"""

from __future__ import annotations

from typing import Any

import torch

from minisgl.core import Batch, Req
from minisgl.scheduler.events import TokenEvent
from minisgl.scheduler.loop import Phases, SchedulerLoop


class OverlapLoop(SchedulerLoop):
    """The one-step-behind loop (the contract is the module docstring)."""

    def __init__(self, sched: Phases):
        super().__init__(sched)
        # BEGIN SOLUTION what="the loop's state between two steps" hint="the launched, unprocessed batch with what to_host returned for it (or None), and the finished requests held back"
        self.pending: tuple[Batch, torch.Tensor, Any] | None = None  # launched, not processed yet
        self.held: list[Req] = []  # finished, but the pending batch still contains them
        # END SOLUTION

    def step(self) -> list[TokenEvent]:
        """Launch the next batch (if any), process the one launched in the previous step, then free
        what no batch in flight reads (``free_finished``)."""
        # BEGIN SOLUTION what="one step of the overlap loop" hint="schedule; if a batch: prepare, launch, to_host; then, if one is pending: wait for it, process it; free_finished(the new batch); the new batch becomes the pending one"
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
        self.free_finished(batch)
        self.pending = launched
        return events
        # END SOLUTION

    def free_finished(self, in_flight: Batch | None) -> None:
        """After this step's ``process``: free every finished request (those held back in earlier steps and
        what ``take_finished()`` returns now) that ``in_flight``, the batch this step launched (None: none),
        does not contain; hold the others back for the next step."""
        # BEGIN SOLUTION what="finished requests freed or held back" hint="for each held request and each one take_finished() returns now: free it unless in_flight contains it; hold the rest for the next step"
        s = self.sched
        reading = set(in_flight.reqs) if in_flight is not None else set()
        keep = []
        for req in self.held + s.take_finished():
            if req in reading:
                keep.append(req)
            else:
                s.free(req)
        self.held = keep
        # END SOLUTION

    @property
    def in_flight(self) -> bool:
        """A launched batch whose tokens are not processed yet."""
        # BEGIN SOLUTION what="whether a launched batch waits to be processed" hint="whether one is pending"
        return self.pending is not None
        # END SOLUTION
