"""Lab 09: the CUDA-graph plan: which batch sizes to capture, a batch's bucket, and its padding.

You implement ``PaddedPlan``, a ``GraphPlan`` (the interface, ``minisgl.engine.graph.GraphPlan``: three
abstract methods; ``GraphInputs``, the four buffers ``pad`` fills; ``GraphRunner.replay`` calls ``bucket`` and
``pad`` for every decode batch). A CUDA graph replays the kernels it recorded for one batch size, reading
its inputs from static buffers (fixed addresses). So the engine captures a few sizes; a decode batch of
``n`` requests runs in the graph of the smallest captured size ``bs >= n``, and its ``bs - n`` extra rows
are padding that must never touch a request's KV::

    sizes (max_bs = 40):  1  2  4  8  16  32  40
    a batch of 5       -> bucket 8: rows 0-4 are the batch's, rows 5-7 padding

    static row   0    1    2    3    4  | 5        6        7       | 8 ... 39
    out_loc      s0   s1   s2   s3   s4 | scratch  scratch  scratch | (the graph of 8 never reads them)
    table_idx    r0   r1   r2   r3   r4 | dummy    dummy    dummy   |

The pool's last page is scratch (no request ever owns it) and the request table's ``dummy_row`` maps
every position to it: a padding row writes its K/V there and attends only to it.

Contract (the grader compares every answer with the engine's ``BucketPlan``, and runs your padded
batches through the model's decode forward on CPU, next to the unpadded batch; derive from ``GraphPlan``
and write the four methods here: a class that derives from, calls or aliases the engine's plan scores 0):

* ``candidates(max_bs)``: the sizes worth a graph when memory is no object: those of ``SMALL`` below
  ``max_bs`` (1, 2, 4, 8), then every multiple of ``STEP`` (16) below ``max_bs``, then ``max_bs``;
  ascending, no size twice.
* ``sizes(max_bs, budget, cost)``: ``cost(bs)`` is the bytes a graph of ``bs`` rows keeps. ``max_bs``
  comes first: every decode batch the engine sends (at most ``max_bs`` requests) must fit some graph;
  if ``cost(max_bs) > budget`` there is no graph at all: return ``[]``. Then the other candidates, from
  the smallest up, each one taken if the cost of everything taken so far plus its own is still
  ``<= budget``, else skipped (a later one may still fit). Return the sizes taken, ascending. Small
  sizes first: a small batch is where launch overhead is the largest share of a step, and its graph
  costs the least.
* ``bucket(n, sizes)``: the smallest of ``sizes`` (ascending) that is ``>= n``: a batch that is itself a
  captured size runs in its own graph. ``ValueError`` when ``n > sizes[-1]`` (no graph holds it).
* ``pad(static, batch, bs, scratch_slot, dummy_row)``: ``n = len(batch.input_ids) <= bs``. Write rows
  ``[0, bs)`` of the four ``static`` buffers *in place* (``copy_`` / ``fill_`` into them: the graph
  reads their addresses, and a new tensor bound to a name is never seen): rows ``[0, n)`` are the
  batch's own; in the padding rows ``[n, bs)`` ``out_loc`` is ``scratch_slot`` and ``table_idx`` is
  ``dummy_row``. A padding row's ``input_ids`` and ``positions`` may keep whatever an earlier batch
  left (any valid token and position is harmless). Rows from ``bs`` on are not read.

Pitfalls the grader recognises (its messages name them):

* a bucket too small (the batch's last rows would not be computed), or one too large: when ``n`` is a
  captured size, ``bisect_right`` skips it (padding waste); the largest graph instead of the smallest;
  ``ValueError`` for a batch of exactly ``sizes[-1]`` (``>=`` for ``>``), or none past it;
* sizes over the budget, or a total exactly equal to it refused (``<`` for ``<=``), ``max_bs`` missing
  or taken last (batches larger than the largest graph lose the graph), sizes unsorted or repeated
  (``bucket`` bisects them), the large sizes preferred to the small ones;
* padding ``out_loc`` left at what an earlier, larger batch wrote there (those are real requests'
  slots: the padding rows overwrite their KV), padding into slot 0 (a real slot) instead of the
  scratch slot, padding rows given a real request's table row, padding one row short or one row into
  the batch, one of the four buffers left with an earlier batch's rows, and new tensors assigned instead
  of writing into the static buffers.

Grading: ``python -m autograder lab09`` checks each method against the engine's plan on fixed and random
inputs, then runs padded batches through the decode forward on CPU (the KV outside the scratch page
and the real rows' logits must equal the unpadded batch's), then the whole engine on CPU with your plan
replaying every decode batch through your bucket and padding (tokens equal to the reference engine's).
The GPU-marked tests (``pytest autograder/test_gpu_lab09.py``, skipped without CUDA) capture real CUDA
graphs with your plan and compare the logits with eager mode.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

from minisgl.engine.graph import GraphInputs, GraphPlan


class PaddedPlan(GraphPlan):
    """Sizes under a memory budget, smallest bucket, padding onto the scratch page (the contract is the
    module docstring)."""

    SMALL = (1, 2, 4, 8)  # the sizes below STEP worth a graph
    STEP = 16  # then every multiple of STEP

    def candidates(self, max_bs: int) -> list[int]:
        """Every size worth a graph up to ``max_bs`` (``max_bs`` included), ascending."""
        raise NotImplementedError("Lab 09: SMALL sizes below max_bs, then multiples of STEP below max_bs, then max_bs")

    def sizes(self, max_bs: int, budget: float, cost: Callable[[int], float]) -> list[int]:
        """The sizes to capture within ``budget`` bytes: ``max_bs``, then candidates smallest first."""
        raise NotImplementedError("Lab 09: [] if max_bs alone is over budget; max_bs first; then candidates while they fit; sorted")

    def bucket(self, n: int, sizes: list[int]) -> int:
        """The smallest captured size that holds a batch of ``n``."""
        raise NotImplementedError("Lab 09: ValueError past sizes[-1]; else the first size >= n (bisect_left)")

    def pad(self, static: GraphInputs, batch: GraphInputs, bs: int, scratch_slot: int, dummy_row: int) -> None:
        """Rows ``[0, bs)`` of ``static``, in place: the batch's rows, then padding onto the scratch page."""
        raise NotImplementedError("Lab 09: copy_ each of the batch's tensors into rows [0, n); fill_ out_loc / table_idx of [n, bs)")
