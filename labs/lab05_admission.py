"""Lab 05: a cache-aware admission policy.

Before each prefill batch the scheduler calls ``admit(waiting, ctx)`` (``waiting``: the requests not yet
started, oldest first); every request the policy hands to ``ctx.admit`` starts in that batch. Lesson 05
showed what this decision costs when it is made in arrival order: a big request blocks the small ones
behind it, and with the radix cache of lesson 06 it costs more: requests that share a cached system prompt
wait behind ones that share nothing, until that prompt is evicted and computed again. You design
``CacheAwareAdmission``, an ``AdmissionPolicy`` (``minisgl/scheduler/admission.py``) that starts the
requests with the longest cached prefix first (SGLang's ``lpm`` schedule policy), ages the ones it keeps
passing over so that none starves, and keeps the engine's memory rules. Write it all here: a class that
derives from, calls or aliases the engine's policies (or the interface's ``reserved_len``) or the grader's
scores 0.

What the context offers (``ctx``, an ``AdmissionContext``): ``has_room`` (tokens of the batch's budget and
a request-table row are left, and no prompt was cut); ``match(req)`` finds and locks the request's longest
cached prefix and returns its length in tokens (a locked prefix is never evicted, so its pages stop
counting as available), ``unmatch(req)`` gives that lock back; ``available_pages()`` (free pages plus
pages the cache could evict now); ``reserved_pages`` (promised to admitted requests, not yet allocated);
``pages_needed(req)`` (the pages ``req`` would reserve, counted in whole pages, minus the cached prefix it
matched); ``waits_for_batch_prefix(req)``; ``admit(req)``.

Terms:

* A request's **cached prefix** is the length ``ctx.match`` returns for it (it does not change during one
  call: nothing is inserted into the cache while a batch is being planned).
* A request **fits** when, with its cached prefix locked, the pages it needs are at most the available
  pages minus those promised to admitted requests.
* A request **can start** when it fits and does not wait for this batch's prefix.
* A request is **passed** once each time a request that arrived after it is admitted while it waits,
  whatever keeps it waiting (no room left, not fitting, waiting for a batch prefix, or its rank). Once it
  has been passed ``AGING`` times (4) it is **aged**. Admitted, it leaves the count.
* **Rank**: aged requests first, the oldest first; then the others, the longest cached prefix first (ties:
  your choice).

Contract:

1. **Reservation.** ``reserved_len(req)`` is the number of positions the request holds KV for, counting
   every position it may ever compute: a running request never runs out of memory, and the scheduler never
   retracts one. Example: a 10-token prompt with ``max_tokens=12`` -> 21 (the last token sampled is never
   fed back, so it needs no KV).
2. **Memory.** Only a request that fits is admitted: pages promised to running or admitted requests are
   never promised again, and a prefix that ``ctx.match`` locked is never also counted as free.
3. **No lock behind.** When ``admit`` returns, every request it matched is admitted or unmatched.
4. **Room.** Nothing is admitted once the context has no room (``has_room`` is False).
5. **Batch prefix.** A request that waits for this batch's prefix (``ctx.waits_for_batch_prefix``: a prompt
   of this batch shares a longer prefix with it than the cache holds) is not admitted in this batch: one
   batch later it reuses that prefix instead of computing it a second time. It does not stop the call.
6. **Order.** A request is admitted only if no request that can start ranks before it. Ranks change as the
   call goes on: an admission may age a request.
7. **Aging.** Once an aged request cannot start, nobody else is admitted in this call (the memory that
   frees up is its). So no request is ever passed more than ``AGING`` times.
8. **Skip-ahead.** Any other request that cannot start is skipped: the call ends only when there is no
   room, no waiting request can start, or an aged one cannot.
9. **Determinism.** Decisions depend only on the scheduler's state and your policy's own counts, never on
   time or randomness (tensor-parallel ranks must all decide alike).

Worked examples (each is a visible test; pages of one token, and room to spare, unless said):

* Memory: 40 pages; a running request holds 10 and has 9 more promised, so 21 are left. A waiting request
  with a 5-token prompt and ``max_tokens=17`` needs 21 pages -> admitted; with ``max_tokens=18`` it needs 22
  -> not admitted.
* A cached prefix: 40 pages; 15 tokens of a finished request are cached (evictable); a running request holds
  4 pages and has 6 more promised; 21 pages are free. A 15-token prompt that begins with 12 of the cached
  tokens, with ``max_tokens=20``, needs 34 - 12 = 22 pages; with its prefix locked 21 + 3 pages are
  available, 18 left after the promise -> not admitted, and the cache's locks are as they were. Had a
  running request held those 12 tokens locked (25 left), it would start.
* Measuring: the same state, waiting: that request (it ranks first and cannot start), then one that shares
  nothing and needs 24 pages -> the second starts: with no prefix locked, 30 are left.
* Order: a 12-token system prompt is cached. Waiting, oldest first: A (20 tokens, shares nothing), B (the
  system prompt and 3 tokens), C (the system prompt and 5 tokens); one row, freed as each one finishes ->
  B and C start (either first), then A, passed twice.
* Aging: request 5 shares nothing and waits with six newer requests that share the cached system prompt
  and add 3 tokens each; the token budgets of three batches are 3, 6 and 6 -> one newer request starts in
  the first (5 is passed once), two in the second (three passes), and in the third one more (four: 5 is
  aged), then 5.
* Aged and cannot start: an aged request needs more pages than are left; a newer one fits -> nobody
  starts until the aged one fits.
* Batch prefix: waiting B and C share a 20-token prompt nobody has cached, and D shares nothing -> B (or C)
  and D start; the other one starts in the next batch and computes only its last tokens.

Pitfalls the grader recognises by their effect (its messages name them):

* memory promised twice (the reservations of admitted requests ignored); a matched prefix counted as free
  (the pages left read before the match); a partial last page not counted;
* a request refused although it fits: the memory checked before matching, in tokens instead of whole pages,
  with ``<`` where a request that needs exactly the pages left fits, or while the prefixes of other waiting
  requests are still locked from measuring them;
* a lock left on a refused request; the token budget or the row limit overrun; two requests of one batch
  computing the same new prefix;
* head-of-line blocking (stopping at the first request that cannot start); arrival order instead of the
  longest cached prefix;
* starvation: no aging, aging one pass late, passes counted once per batch, or only when a request was
  tried and refused; aging too early: passes counted for requests that arrived earlier; ranks not updated
  within a call; an aged request skipped when it cannot start; aged requests ordered by prefix;
* decisions that change from one run of a workload to the next (time, randomness).

Grading: ``python -m autograder lab05`` runs fixed cases on the real scheduler (a model-free engine with
the engine's own KV pool, radix cache and request table, ``debug_checks=True``), random workloads with
pages of 1, 2 and 4 tokens (every call checked against the rules above, as it happens), the prefix-cache
hit rate on shared-prefix workloads (at least the grader's own policy's, with no request passed more than
``AGING`` times), then the real engine with ``components={"admission": "lab05"}`` on a tiny model, which
must generate the reference's tokens: an admission order never changes a request's tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

from minisgl.core import Req
from minisgl.scheduler.admission import AdmissionContext, AdmissionPolicy


class CacheAwareAdmission(AdmissionPolicy):
    """Longest cached prefix first, with aging, reserving all of ``max_tokens`` (the contract is the
    module docstring)."""

    AGING = 4  # passes after which a waiting request is aged

    def __init__(self):
        raise NotImplementedError("Lab 05: the state the policy keeps from one call to the next (a hint: python -m autograder lab05 --hint)")

    def reserved_len(self, req: Req) -> int:
        """How many positions of ``req``, from position 0, to hold KV for."""
        raise NotImplementedError("Lab 05: how many positions an admitted request holds KV for (a hint: python -m autograder lab05 --hint)")

    def admit(self, waiting: Sequence[Req], ctx: AdmissionContext) -> None:
        """Start requests of ``waiting`` (oldest first) through ``ctx.admit``, by rank, while they can start."""
        raise NotImplementedError("Lab 05: the admission: who starts in this batch, in which order, and who was passed (a hint: python -m autograder lab05 --hint)")
