"""Lab 07: the chunking policy.

You implement ``BudgetChunking``, a ``ChunkingPolicy`` (the interface, ``minisgl.scheduler.ChunkingPolicy``:
three abstract methods; the scheduler asks ``budget`` in ``PrefillManager.schedule``, ``extend_end`` in
``AdmissionContext.add_extend`` and ``decode_first`` in ``Scheduler.schedule``). A prefill batch computes at
most a budget of new tokens; a prompt that does not fit in what is left of it is *cut*: its first chunk runs
now, the rest in later batches. The KV of a chunk stays in the pool, so the next chunk starts at
``req.cached_len`` and attends to the earlier ones as a cached prefix. Between two chunks the running
requests decode once, so a long prompt pauses their streams for one chunk at a time, not for the whole
prompt::

    budget 8, a 20-token prompt arrives while requests A and B decode:
    batch 1: prefill  [prompt 0 ...... 8 ✂]      extend_end(req, 8)  -> 8   (cached_len 0)
    batch 2: decode   A, B                       decode_first(True, 2) -> True
    batch 3: prefill  [prompt 8 ..... 16 ✂]      extend_end(req, 8)  -> 16  (cached_len 8)
    batch 4: decode   A, B
    batch 5: prefill  [prompt 16 .. 20] + ...    extend_end(req, 8)  -> 20 = device_len: done, it samples

The scheduler owns every counter: the policy only answers three questions, each from its arguments and
the request's own lengths (never from state it keeps itself: a retracted request starts over, and
tensor-parallel ranks must all decide alike).

Contract (the grader compares every answer with the engine's own policy, ``GreedyChunking``; derive from
``ChunkingPolicy`` and write all three methods here: a class that derives from, calls or aliases the
engine's policy scores 0):

* ``budget(busy, idle, num_decoding)``: the new tokens the next prefill batch may compute. ``busy``
  (``max_prefill_length``) while any request decodes (``num_decoding > 0``: each of them waits for this
  batch, whose time is a gap in its stream), ``idle`` (``idle_prefill_length``) while none does (nobody
  waits: a bigger batch is pure throughput). Either may be ``inf`` (no limit); never assume
  ``idle >= busy``.
* ``extend_end(req, tokens_left)``: where ``req``'s extend in this batch ends; it starts at
  ``req.cached_len`` (KV already written: a cached prefix, or the chunks before). The end is the largest
  position that is at most ``req.device_len`` (the end of what must be prefilled: the prompt, plus the
  outputs of a retracted request) and at most ``req.cached_len + tokens_left`` (``tokens_left > 0``,
  may be ``inf`` or a float): all of the request when it fits, else a cut exactly at the budget. Return
  an ``int`` (a position).
* ``decode_first(after_chunk, num_decodable)``: whether the next batch decodes the running requests
  instead of prefilling: True exactly when the last batch cut a prompt (``after_chunk``) and some request
  can decode (``num_decodable > 0``). Otherwise prefill first: a waiting request starts as soon as it can.

Pitfalls the grader recognises (its messages name them):

* the ``idle`` budget while requests decode (a whole long prompt in one batch stalls every stream), or the
  ``busy`` budget when nothing decodes (needless chunks: slower first tokens); ``min``/``max`` of the two
  instead of choosing by ``num_decoding``;
* an extend past the budget (ignoring ``tokens_left``, or one token past it), or past ``device_len``;
* returning the chunk's length instead of its end position, or a float;
* never reaching ``device_len`` (the request never samples its first token);
* ``prompt_len`` instead of ``device_len`` (a retracted request must prefill its outputs too);
* no decode step between two chunks (the running streams stall for the whole prompt), a decode step
  before every prefill (waiting requests starve while others decode), or one when nothing can decode;
* progress kept in the policy (where it cut each request): a retracted request starts over from its
  ``req.cached_len``, which a policy's own record no longer matches.

Grading: ``python -m autograder lab07`` checks each method on fixed cases, random workloads on the real
scheduler (a model-free engine) batch by batch against ``GreedyChunking``, then the real engine with
``components={"chunking": "lab07"}`` on a tiny model: the unchunked engine's tokens, the budget in every
batch, no stream or request starved, memory given back, and retracted requests carried on.
"""

from __future__ import annotations

from minisgl.core import Req
from minisgl.scheduler.chunking import ChunkingPolicy


class BudgetChunking(ChunkingPolicy):
    """Chunked prefill under a token budget (the contract is the module docstring)."""

    def budget(self, busy: float, idle: float, num_decoding: int) -> float:
        """New tokens the next prefill batch may compute."""
        raise NotImplementedError("Lab 07: busy while any request decodes (num_decoding > 0), else idle")

    def extend_end(self, req: Req, tokens_left: float) -> int:
        """Where ``req``'s extend in this batch ends (it starts at ``req.cached_len``)."""
        raise NotImplementedError("Lab 07: the smaller of req.device_len and req.cached_len + tokens_left, as an int")

    def decode_first(self, after_chunk: bool, num_decodable: int) -> bool:
        """Whether the next batch decodes the running requests rather than prefilling."""
        raise NotImplementedError("Lab 07: True only right after a cut prompt, and only if some request can decode")
