"""Lab 09: the CUDA-graph plan: which sizes to capture and how, which batches run in a graph, and the replay.

You implement ``PaddedPlan``, a ``GraphPlan`` (the interface, ``minisgl.engine.graph.GraphPlan``: six
abstract methods; ``GraphInputs``, the four buffers a graph reads; ``GraphState``, what the runner keeps
between capture and replays). A CUDA graph replays the kernels it recorded for one batch size, reading its
inputs from static buffers (fixed addresses) and writing its logits into one output tensor. So the engine
captures a few sizes; a decode batch runs in the graph of the smallest captured size that holds it, its
inputs copied into the static buffers, and the graph's extra rows are padding that must never touch a
request's KV::

    sizes (max_bs = 40):  1  2  4  8  16  32  40
    a batch of 5       -> the graph of 8: rows 0-4 are the batch's, rows 5-7 padding

    static row   0    1    2    3    4  | 5        6        7       | 8 ... 39
    out_loc      s0   s1   s2   s3   s4 | scratch  scratch  scratch | (the graph of 8 never reads them)
    table_idx    r0   r1   r2   r3   r4 | dummy    dummy    dummy   |
    output       the batch's logits     | padding's (not returned)  |

The pool's last page is scratch (no request ever owns it) and the request table's ``dummy_row`` maps
every position to it: a padding row writes its K/V there and attends only to it.

Write the seven methods here (derive from ``GraphPlan``): a class that derives from, calls or aliases the
engine's plan or runner scores 0. What each must do:

* ``candidates(max_bs)``: the sizes worth a graph when memory is no object, ascending, none twice: each
  size of ``SMALL`` below ``max_bs``, each multiple of ``STEP`` below ``max_bs``, and ``max_bs`` itself.
  Examples: 40 -> ``[1, 2, 4, 8, 16, 32, 40]``; 16 -> ``[1, 2, 4, 8, 16]``; 3 -> ``[1, 2, 3]``; 1 -> ``[1]``.
* ``sizes(max_bs, budget, cost)``: the candidates to capture when ``cost(bs)`` is the bytes a graph of
  ``bs`` rows keeps and all of them together may keep at most ``budget`` (``inf``: every candidate). The
  result is ascending and its total cost is within the budget (a total exactly equal to it fits).
  ``max_bs`` is always in it (every decode batch the engine sends must fit some graph), except when its
  graph alone is over the budget: then there are no graphs, ``[]``. Among the other candidates the small
  ones have priority (a small batch is where launch overhead is the largest share of a step): a candidate
  is in the result exactly when it fits beside ``max_bs`` and every smaller candidate the result holds.
  Costs need not grow with the batch, so a candidate that does not fit says nothing about a larger one.
  Examples, ``max_bs = 40``: ``cost(bs) = bs`` and budget 55 -> ``[1, 2, 4, 8, 40]`` (exactly 55); budget
  54 -> ``[1, 2, 4, 40]``; budget 39 -> ``[]``. Costs 1, 2, 4, 8 -> 10 each, 16 -> 60, 32 -> 12, 40 -> 40
  and budget 92 -> ``[1, 2, 4, 8, 32, 40]`` (16 does not fit, 32 still does).
* ``capture(state, capture_one)``: one graph for each size of ``state.sizes``, captured by calling
  ``capture_one`` with the size and a memory pool; it returns the graph and the tensor its replays write
  the logits into, which go into ``state.graphs`` and ``state.outputs`` under that size. Each size is
  captured once, the largest first and then in descending order, and all graphs share one pool: the
  first capture gets ``None`` (make a new pool), every later one the first graph's ``pool()``. A graph's
  intermediates live in its pool; captured after the largest, a smaller graph reuses its blocks, so all
  of them together cost what the largest does.
* ``use_graph(phase, n, sizes)``: whether a batch of ``n`` requests runs in a graph: ``True`` exactly for
  a ``"decode"`` batch of at least one request that the largest captured size holds. A prefill or mixed
  batch (phase ``"prefill"``) feeds many tokens a row, which no graph recorded; an empty batch has nothing
  to replay; with ``sizes == []`` nothing was captured. Examples with sizes ``[1, 2, 4, 8]``: decode 8
  -> True, decode 9 -> False, decode 0 -> False, prefill 1 -> False; decode 1 with ``[]`` -> False.
* ``bucket(n, sizes)``: for a batch of ``n >= 1`` requests, the smallest of ``sizes`` (ascending) that
  holds it; a batch that is itself a captured size runs in its own graph. ``ValueError`` when no captured
  size holds it. Examples with ``[1, 2, 4, 8]``: 3 -> 4, 4 -> 4, 8 -> 8, 9 -> ``ValueError``.
* ``pad(static, batch, bs, scratch_slot, dummy_row)``: ``batch`` has ``n <= bs`` rows (each of its four
  tensors holds ``n`` entries). Afterwards rows ``[0, n)`` of each of the four ``static`` buffers hold
  the batch's rows, in order; in the padding rows ``[n, bs)``, ``out_loc`` is ``scratch_slot`` and
  ``table_idx`` is ``dummy_row`` (their token ids and positions may stay whatever an earlier batch left:
  any valid ones are harmless); rows from ``bs`` on are not read. The buffers stay the same tensors:
  the graph reads their addresses, so a new tensor is never seen; write into them. Example: ``out_loc``
  holding ``[11, 12, 13, 14, 15, 16, 17, 18]`` from a batch of 8, a batch of 3 with slots ``[3, 5, 7]``
  into ``bs = 4`` with scratch slot 99 -> ``[3, 5, 7, 99, 15, 16, 17, 18]``.
* ``replay(state, batch, prepare)``: the logits of a decode batch of ``n`` rows, ``[n, vocab]``. The
  graph of the batch's bucket replays once (no other graph), after the batch was padded into
  ``state.static`` (with ``state.scratch_slot`` and ``state.dummy_row``) and ``prepare`` was called with
  the bucket's size (it plans the attention for that many rows). The result is the first ``n`` rows of
  that graph's output tensor, a view (the next replay overwrites it); the padding rows' logits are no
  request's.

Pitfalls the grader recognises (its messages name them):

* a bucket too small (the batch's last rows would not be computed), or one too large: a batch that is a
  captured size sent to the next one (padding waste), or the largest graph for every batch; a
  ``ValueError`` for a batch that exactly fills the largest graph, or none for one past it;
* sizes over the budget, or a total exactly equal to it refused; ``max_bs`` missing or chosen after the
  small ones (the largest batches lose their graph); sizes unsorted or repeated; the large sizes
  preferred to the small ones; stopping at the first candidate that does not fit;
* graphs captured smallest first (the pool grows at every capture), or each in a pool of its own;
* a prefill or mixed batch sent to a graph, an empty batch sent to one, or a batch that exactly fills the
  largest graph sent to eager mode;
* the whole output returned (the sampler would sample the padding's logits too);
* padding ``out_loc`` left at what an earlier, larger batch wrote there (those are real requests' slots:
  the padding rows overwrite their KV), padding into slot 0 (a real slot) instead of the scratch slot,
  padding rows given a real request's table row, padding one row short or one row into the batch, one of
  the four buffers left with an earlier batch's rows, and new tensors assigned instead of writing into the
  static buffers.

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
        raise NotImplementedError("Lab 09: the candidate sizes up to max_bs (a hint: python -m autograder lab09 --hint)")

    def sizes(self, max_bs: int, budget: float, cost: Callable[[int], float]) -> list[int]:
        """The sizes to capture within ``budget`` bytes, ascending (the contract is the module docstring)."""
        raise NotImplementedError("Lab 09: the sizes that fit the memory budget (a hint: python -m autograder lab09 --hint)")

    def capture(self, state: GraphState, capture_one: CaptureFn) -> None:
        """A graph per size of ``state.sizes`` into ``state.graphs`` / ``state.outputs``, in one pool."""
        raise NotImplementedError("Lab 09: every size captured and its graph and output stored (a hint: python -m autograder lab09 --hint)")

    def use_graph(self, phase: str, n: int, sizes: list[int]) -> bool:
        """Whether a batch runs in a graph: a decode batch that the largest captured size holds."""
        raise NotImplementedError("Lab 09: whether the batch runs in a graph or eagerly (a hint: python -m autograder lab09 --hint)")

    def bucket(self, n: int, sizes: list[int]) -> int:
        """The smallest captured size that holds a batch of ``n``."""
        raise NotImplementedError("Lab 09: the bucket of a batch (a hint: python -m autograder lab09 --hint)")

    def pad(self, static: GraphInputs, batch: GraphInputs, bs: int, scratch_slot: int, dummy_row: int) -> None:
        """Rows ``[0, bs)`` of ``static``, in place: the batch's rows, then padding onto the scratch page."""
        raise NotImplementedError("Lab 09: the batch and its padding written into the static buffers (a hint: python -m autograder lab09 --hint)")

    def replay(self, state: GraphState, batch: GraphInputs, prepare: Callable[[int], None]) -> torch.Tensor:
        """A decode batch's logits ``[n, vocab]`` from the graph of its bucket."""
        raise NotImplementedError("Lab 09: the replay of a decode batch and its logits (a hint: python -m autograder lab09 --hint)")
