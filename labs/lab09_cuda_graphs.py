"""Lab 09: the CUDA-graph plan: which sizes to capture and how, which batches run in a graph, and the replay.

You implement ``PaddedPlan``, a ``GraphPlan`` (the interface, ``minisgl.engine.graph.GraphPlan``: six
abstract methods; ``GraphInputs``, the four buffers a graph reads; ``GraphState``, what the runner keeps
between capture and replays). A CUDA graph replays the kernels it recorded for one batch size, reading its
inputs from static buffers (fixed addresses) and writing its logits into one output tensor. So the engine
captures a few sizes; a decode batch of ``n`` requests runs in the graph of the smallest captured size
``bs >= n``, its inputs copied into the static buffers, and its ``bs - n`` extra rows are padding that must
never touch a request's KV::

    sizes (max_bs = 40):  1  2  4  8  16  32  40
    a batch of 5       -> bucket 8: rows 0-4 are the batch's, rows 5-7 padding

    static row   0    1    2    3    4  | 5        6        7       | 8 ... 39
    out_loc      s0   s1   s2   s3   s4 | scratch  scratch  scratch | (the graph of 8 never reads them)
    table_idx    r0   r1   r2   r3   r4 | dummy    dummy    dummy   |
    output       the batch's logits     | padding's (not returned)  |

The pool's last page is scratch (no request ever owns it) and the request table's ``dummy_row`` maps
every position to it: a padding row writes its K/V there and attends only to it.

Contract (the grader compares every answer with the engine's ``BucketPlan``, captures and replays
simulated graphs on CPU, and runs the engine on your plan; derive from ``GraphPlan`` and write the seven
methods here: a class that derives from, calls or aliases the engine's plan or runner scores 0):

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
* ``capture(state, capture_one)``: one graph per size of ``state.sizes``, stored as
  ``state.graphs[bs], state.outputs[bs] = capture_one(bs, pool)``. Largest first, all in one memory
  pool: the first call passes ``pool=None`` (a new pool), every later one the first graph's
  ``.pool()``. A graph's intermediates live in its pool; captured after the largest, a smaller graph
  reuses its blocks, so all of them cost what the largest does (smallest first, the pool grows with
  every graph larger than what it holds; a pool each, their costs add up).
* ``use_graph(phase, n, sizes)``: ``True`` only for a ``"decode"`` batch (a prefill or mixed batch,
  phase ``"prefill"``, feeds many tokens a row: no graph recorded that) that a captured size holds,
  ``1 <= n <= sizes[-1]``; ``False`` when ``sizes`` is empty (no graphs). Everything else runs eagerly.
* ``bucket(n, sizes)``: the smallest of ``sizes`` (ascending) that is ``>= n``: a batch that is itself a
  captured size runs in its own graph. ``ValueError`` when ``n > sizes[-1]`` (no graph holds it).
* ``pad(static, batch, bs, scratch_slot, dummy_row)``: ``n = len(batch.input_ids) <= bs``. Write rows
  ``[0, bs)`` of the four ``static`` buffers *in place* (``copy_`` / ``fill_`` into them: the graph
  reads their addresses, and a new tensor bound to a name is never seen): rows ``[0, n)`` are the
  batch's own; in the padding rows ``[n, bs)`` ``out_loc`` is ``scratch_slot`` and ``table_idx`` is
  ``dummy_row``. A padding row's ``input_ids`` and ``positions`` may keep whatever an earlier batch
  left (any valid token and position is harmless). Rows from ``bs`` on are not read.
* ``replay(state, batch, prepare)``: a decode batch of ``n = len(batch.input_ids)`` rows: its bucket
  ``bs``, the batch padded into ``state.static`` (with ``state.scratch_slot`` and ``state.dummy_row``),
  ``prepare(bs)`` (the attention metadata for ``bs`` rows), the graph of ``bs`` replayed, and the first
  ``n`` rows of ``state.outputs[bs]`` returned (the padding rows' logits are no request's).

Pitfalls the grader recognises (its messages name them):

* a bucket too small (the batch's last rows would not be computed), or one too large: when ``n`` is a
  captured size, ``bisect_right`` skips it (padding waste); the largest graph instead of the smallest;
  ``ValueError`` for a batch of exactly ``sizes[-1]`` (``>=`` for ``>``), or none past it;
* sizes over the budget, or a total exactly equal to it refused (``<`` for ``<=``), ``max_bs`` missing
  or taken last (batches larger than the largest graph lose the graph), sizes unsorted or repeated
  (``bucket`` bisects them), the large sizes preferred to the small ones;
* graphs captured smallest first (the pool grows at every capture), or each in a pool of its own;
* a prefill or mixed batch sent to a graph, or a batch of exactly ``sizes[-1]`` sent to eager mode;
* the whole output returned (``bs`` rows: the sampler would sample the padding's logits too);
* padding ``out_loc`` left at what an earlier, larger batch wrote there (those are real requests'
  slots: the padding rows overwrite their KV), padding into slot 0 (a real slot) instead of the
  scratch slot, padding rows given a real request's table row, padding one row short or one row into
  the batch, one of the four buffers left with an earlier batch's rows, and new tensors assigned instead
  of writing into the static buffers.

Grading: ``python -m autograder lab09`` checks each method against the engine's plan on fixed and random
inputs; captures simulated graphs (``autograder/graph_sim.py``: a graph keeps the tensors it was captured
with and replays the model's decode forward over them) and replays padded batches on CPU (the KV outside
the scratch page and the real rows' logits must equal the unpadded batch's); then the whole engine on CPU
with your plan capturing and replaying every decode batch (tokens equal to the reference engine's). The
GPU-marked tests (``pytest autograder/test_gpu_lab09.py``, skipped without CUDA) capture real CUDA graphs
with your plan and compare the logits with eager mode.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

import torch

from minisgl.engine.graph import CaptureFn, GraphInputs, GraphPlan, GraphState


class PaddedPlan(GraphPlan):
    """Sizes under a memory budget, capture in one pool, the eager fallback, smallest bucket, padding onto
    the scratch page, the replay (the contract is the module docstring)."""

    SMALL = (1, 2, 4, 8)  # the sizes below STEP worth a graph
    STEP = 16  # then every multiple of STEP

    def candidates(self, max_bs: int) -> list[int]:
        """Every size worth a graph up to ``max_bs`` (``max_bs`` included), ascending."""
        raise NotImplementedError("Lab 09: SMALL sizes below max_bs, then multiples of STEP below max_bs, then max_bs")

    def sizes(self, max_bs: int, budget: float, cost: Callable[[int], float]) -> list[int]:
        """The sizes to capture within ``budget`` bytes: ``max_bs``, then candidates smallest first."""
        raise NotImplementedError("Lab 09: [] if max_bs alone is over budget; max_bs first; then candidates while they fit; sorted")

    def capture(self, state: GraphState, capture_one: CaptureFn) -> None:
        """A graph per size into ``state.graphs`` / ``state.outputs``: largest first, one pool for all."""
        raise NotImplementedError("Lab 09: for bs from the largest down: capture_one(bs, None first, then the first graph's pool())")

    def use_graph(self, phase: str, n: int, sizes: list[int]) -> bool:
        """Whether a batch runs in a graph: a decode batch that the largest captured size holds."""
        raise NotImplementedError("Lab 09: decode only, some graph captured, and 1 <= n <= sizes[-1]")

    def bucket(self, n: int, sizes: list[int]) -> int:
        """The smallest captured size that holds a batch of ``n``."""
        raise NotImplementedError("Lab 09: ValueError past sizes[-1]; else the first size >= n (bisect_left)")

    def pad(self, static: GraphInputs, batch: GraphInputs, bs: int, scratch_slot: int, dummy_row: int) -> None:
        """Rows ``[0, bs)`` of ``static``, in place: the batch's rows, then padding onto the scratch page."""
        raise NotImplementedError("Lab 09: copy_ each of the batch's tensors into rows [0, n); fill_ out_loc / table_idx of [n, bs)")

    def replay(self, state: GraphState, batch: GraphInputs, prepare: Callable[[int], None]) -> torch.Tensor:
        """A decode batch's logits ``[n, vocab]``: bucket, pad into ``state.static``, prepare, replay, slice."""
        raise NotImplementedError("Lab 09: bucket; pad into state.static; prepare(bs); replay the graph of bs; its first n rows")
