"""Lab 05: the admission policy.

You implement ``FairAdmission``, an ``AdmissionPolicy`` (the interface, imported below; this
docstring states its contract) that is handed an ``AdmissionContext`` (its methods are the ones
named below: ``match``, ``unmatch``, ``pages_needed``, ``available_pages``, ``reserved_pages``,
``has_room``, ``waits_for_batch_prefix``, ``admit``). Write all three methods here: the engine's own
policies and the interface's default ``reserved_len`` are off limits (a lab that derives from, calls
or aliases them scores 0). Before each prefill batch the scheduler calls ``admit(waiting, ctx)``;
every request your policy admits through ``ctx.admit`` starts in that batch. Yours reserves each
request's whole ``max_tokens`` (as the engine's ``reserve-all``) but, unlike it, lets small
requests go past a big one that does not fit, with aging so that the big one is not starved::

    waiting:  A(fits)  B(too big)  C(fits)  D(fits)  E(fits)
    admit:    A        skip: B     C        D        stop: B was passed AGING times (here 2; the lab's is 4)

Contract (the grader compares every decision with a reference policy on the same scheduler state):

* **Reservation.** ``reserved_len(req)`` is ``req.max_device_len - 1``: KV for the prompt and every
  token the request may generate (the last sampled token is never fed back). A running request then
  never runs out of memory: under this policy the scheduler never retracts a request.
* **Fits.** ``fits(req, ctx)`` first locks the request's cached prefix with ``ctx.match(req)``, then
  checks ``ctx.pages_needed(req) <= ctx.available_pages() - ctx.reserved_pages``, both read *after*
  the match (locking a prefix takes its pages out of the available ones; the request then needs
  fewer). If it fits, return True and keep the match (``ctx.admit`` uses it); if not,
  ``ctx.unmatch(req)`` and return False.
* **Admit.** Go through ``waiting`` in order (oldest first) and stop as soon as ``ctx.has_room`` is
  False (the batch's token budget is spent, no table row is left, or a prompt was cut). Skip a
  request for which ``ctx.waits_for_batch_prefix(req)`` (it waits one batch for a prefix this batch
  computes; it is not *passed over*). Admit each request that fits, in order (FIFO among those that
  fit). A request that does not fit is passed over: the ones behind it may still be admitted
  (skip-ahead), and each request admitted after it in this call adds one to its count in
  ``self.passed_over`` (by ``uid``). Once a request passed over in this call has a count of
  ``AGING`` or more, admit nobody else in this call: the memory that frees up is its. An admitted
  request's count is dropped.
* Decisions depend only on the scheduler's state and the counts (never on time or randomness):
  tensor-parallel ranks must all decide alike.

Pitfalls the grader recognises (its messages name them):

* reserving only the prompt (the outputs then run out of memory, and the scheduler must retract);
* the reservation counted in tokens instead of pages, or a partial last page not counted (with
  pages of several tokens: use ``ctx.pages_needed``); ``<`` where ``<=`` belongs (a request that
  needs exactly the pages left fits);
* ignoring ``ctx.reserved_pages`` (memory promised to running requests is promised twice: over-commit);
* reading ``available_pages()`` before ``ctx.match`` (the matched prefix is counted both as available
  and as already held: over-commit), or checking the memory before matching at all (a request that
  shares a prefix is refused although it fits);
* a refused request not unmatched (its prefix stays locked: never evictable, a leaked lock);
* admitting past ``ctx.has_room``: past the token budget, or with no table row left;
* stopping at the first request that does not fit (head-of-line blocking), skip-ahead without aging
  (a big request starves behind a stream of small ones), aging on the sum of the passed-over
  counts instead of each request's own, or admitting out of arrival order.

Grading: ``python -m autograder lab05`` runs fixed scheduler states against the reference, random
workloads on the real scheduler (a model-free engine, small KV pools of 1-, 2- and 4-token pages,
``debug_checks=True``), then the real engine with ``components={"admission": "lab05"}`` on a tiny
model.
"""

from __future__ import annotations

from collections.abc import Sequence

from minisgl.core import Req
from minisgl.scheduler.admission import AdmissionContext, AdmissionPolicy


class FairAdmission(AdmissionPolicy):
    """Reserve-all admission with skip-ahead and aging (the contract is the module docstring)."""

    AGING = 4  # later admissions a passed-over request tolerates; then nobody passes it

    def __init__(self):
        self.passed_over: dict[int, int] = {}  # uid -> requests admitted ahead of it while it waited

    def reserved_len(self, req: Req) -> int:
        """The positions ``[0, reserved_len)`` of ``req`` to hold KV for: all it may ever need."""
        # BEGIN SOLUTION hint="reserve the prompt and every output: all positions the request may ever feed"
        return req.max_device_len - 1
        # END SOLUTION

    def fits(self, req: Req, ctx: AdmissionContext) -> bool:
        """Match (lock) ``req``'s cached prefix, then whether its reservation fits in the pages left;
        a request that does not fit is unmatched again."""
        # BEGIN SOLUTION hint="ctx.match first; then pages_needed vs available_pages() - reserved_pages; unmatch if not"
        ctx.match(req)
        if ctx.pages_needed(req) <= ctx.available_pages() - ctx.reserved_pages:
            return True
        ctx.unmatch(req)
        return False
        # END SOLUTION

    def admit(self, waiting: Sequence[Req], ctx: AdmissionContext) -> None:
        """Admit requests of ``waiting`` in order while ``ctx.has_room``: skip-ahead, with aging."""
        live = {r.uid for r in waiting}  # counts of requests that left the queue are dropped
        self.passed_over = {uid: n for uid, n in self.passed_over.items() if uid in live}
        # BEGIN SOLUTION hint="for each request in order: stop without room or once a skipped one aged; fits -> admit"
        skipped: list[Req] = []
        for req in waiting:
            if not ctx.has_room or any(self.passed_over.get(r.uid, 0) >= self.AGING for r in skipped):
                break
            if ctx.waits_for_batch_prefix(req):
                continue
            if not self.fits(req, ctx):
                skipped.append(req)
                continue
            ctx.admit(req)
            self.passed_over.pop(req.uid, None)
            for r in skipped:
                self.passed_over[r.uid] = self.passed_over.get(r.uid, 0) + 1
        # END SOLUTION
