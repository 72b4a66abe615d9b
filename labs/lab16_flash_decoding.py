"""Lab 16: flash-decoding in Triton, the decode attention of the engine's ``triton`` backend.

At a decode step every request brings one query per head and attends over all its cached keys. On a GPU
one program per request and KV head leaves most of the chip idle when a few requests hold long contexts
(lesson 16 measures it): flash-decoding cuts each request's keys into ``splits`` parts, lets one program
attend over each part, and then merges the parts' results exactly, from each part's output and
log-sum-exp alone. You write both passes in Triton, and the two functions that launch them. The grader
plugs your ``decode`` into the engine's ``triton`` attention backend (``DECODE_KERNELS`` /
``use_decode_kernel`` of ``minisgl/attention/triton_backend.py``), which calls it at every decode step
of every layer. The engine's own kernels (``minisgl/kernels/triton_attention.py``) are off limits: a lab
that calls, launches or aliases them scores 0.

On a CPU the kernels run under Triton's interpreter (``TRITON_INTERPRET=1`` in the environment before
``triton`` is imported: the grader sets it; to try your kernels yourself, ``TRITON_INTERPRET=1 python
...``). It runs each program in turn, in numpy: correct, and slow, so try small sizes. On a GPU the same
code is compiled.

Where the keys are: request ``b`` attends to its first ``lens[b]`` positions, and the K/V of position
``j`` lie in the pool at slot ``page_table[rows[b], j]``, wherever its page put them::

    page_table[rows[b]] = [ 40 41 42 43 | 12 13 14 15 | 96 97  .  . ]   lens[b] = 10 (pages of 4)
    key j of request b, KV head g:   k_slots[page_table[rows[b], j], g, :]    (and v_slots alike)
    out[b, h] = the softmax over j < lens[b] of scale * (q[b, h] . key j), applied to the values j,
                with g the KV head of query head h

``decode(q, k_slots, v_slots, page_table, rows, lens, scale, splits, out=None, partial=None)``:

* ``q`` ``[B, H, D]``, float32, bfloat16 or float16, ``q.stride(2) == 1`` and the other strides any (the
  engine's q is a view into each token's row of the fused qkv projection: ``q.stride(0)`` is more than
  ``H * D``). ``k_slots`` and ``v_slots`` ``[S, KV, D]``, contiguous, in q's dtype. ``H`` is a multiple
  of ``KV``: query heads ``g * H/KV`` to ``(g + 1) * H/KV - 1`` share KV head ``g`` (grouped-query
  attention, in order). ``D`` is a power of two, at least 16.
* ``page_table`` ``[R, W]`` int32 with ``page_table.stride(1) == 1``; ``rows`` ``[B]`` (int32 or int64)
  and ``lens`` ``[B]`` int32, with ``1 <= lens[b] <= W`` (the caller's promise: its values are not
  checked, since reading them back from a GPU at every step would stall it). Entries of a row past
  ``lens[b]`` may hold any slot of the pool, another request's keys among them: they are not keys of
  request ``b``.
* Returns ``[B, H, D]`` in q's dtype: ``out`` itself when it is given (q's shape and dtype,
  ``out.stride(2) == 1``; written in place), else a new tensor. Scores, softmax and sums in float32.
* ``splits >= 1``: each request's keys are cut into ``splits`` parts, every key in exactly one part
  (how long each part is is yours; a part may be empty, e.g. when there are fewer keys than parts). With
  ``splits == 1`` nothing but ``out`` is written. With ``splits > 1`` each part's result goes to the
  partial buffers and the merge computes ``out`` from them: ``partial`` is ``(part, lse)``, float32,
  contiguous, ``part`` ``[N, D]`` and ``lse`` ``[N]`` with ``N >= B * H * splits`` (the engine's CUDA
  graphs pass buffers sized for their largest batch), or None (decode allocates them). Entry
  ``(b * H + h) * splits + i`` holds part ``i`` of request ``b``, query head ``h``:

  - ``part``: the attention of ``q[b, h]`` over the keys of part ``i`` alone (its own softmax);
  - ``lse``: the natural logarithm of the sum, over the keys of part ``i``, of ``exp(score)``
    (``score = scale * q . k``), or ``-inf`` for a part with no key (then its ``part`` row is anything).

  Rows ``N >= B * H * splits`` of the buffers are not written.
* ``merge`` computes ``out`` ``[B, H, D]`` (written in place) from the ``splits`` entries of ``part`` and
  ``lse`` per ``(b, h)``, laid out as above: the attention over all the keys of the parts, which their
  outputs and log-sum-exps determine. A part whose ``lse`` is ``-inf`` has no keys and contributes
  nothing, whatever its row holds (NaN included). ``lse`` values may be large (scores of hundreds).
* Checks, all before anything is launched (a refused call leaves ``out`` and ``partial`` as they were):
  ``TypeError`` when q's dtype is not one of the three, when ``k_slots`` or ``v_slots`` (each on its own)
  or a given ``out`` has another dtype than q, when ``page_table`` or ``lens`` is not int32, ``rows`` not
  int32 or int64, or a partial buffer not float32; ``ValueError`` for a q that is not 3-D or whose
  ``stride(2) != 1``, a ``k_slots``/``v_slots`` (each) that is not ``[S, KV, D]`` with q's ``D`` or not
  contiguous or not of the other's shape, ``H`` not a multiple of ``KV``, ``D`` not a power of two ``>=
  16``, a ``page_table`` that is not 2-D with ``stride(1) == 1``, ``rows`` or ``lens`` not ``[B]``,
  ``splits < 1``, an ``out`` whose shape is not q's (each dimension) or whose ``stride(2) != 1``, and
  partial buffers that are not contiguous, have fewer than ``B * H * splits`` rows, or a ``part`` row
  that is not ``D`` wide. ``merge`` checks its own arguments alike (``out`` 3-D, float32 buffers of at
  least ``B * H * splits`` rows of ``D``, ``splits >= 1``).

Examples (``H = KV = 1``, ``D = 16``, ``scale = 1``; a vector written ``(x, y)`` is ``(x, y, 0, ..., 0)``):

* ``q = (ln 3)``, keys ``k0 = (1)``, ``k1 = (0)``, values ``v0 = (1)``, ``v1 = (0, 1)``, ``lens = [2]``:
  the scores are ``ln 3`` and ``0``, so ``out = 3/4 v0 + 1/4 v1 = (0.75, 0.25)`` for every ``splits``.
  With ``splits = 2``: if each part holds one key, their rows are ``v0`` and ``v1`` and their ``lse``
  ``ln 3`` and ``0``; a part holding both has row ``(0.75, 0.25)`` and ``lse = ln 4``, and the other
  ``lse = -inf``. With ``splits = 3`` at least one part is empty: its ``lse`` is ``-inf``.
* ``merge`` of one ``(b, h)`` with ``splits = 3``, ``lse = [ln 3, -inf, 0]``, ``part`` rows ``[v0,
  NaN..., v1]``: ``out = (0.75, 0.25)``. With ``lse = [1000 + ln 3, -inf, 1000]`` the same.

Pitfalls the grader recognises (its messages name them):

* past the length: keys at positions ``lens[b]`` and beyond attended (the table's row is wider);
* one page-table row for all: request ``b``'s row is ``rows[b]``, not ``b``;
* grouped-query heads: query head ``h`` uses KV head ``h // (H / KV)``; ``h % KV`` is another layout;
* the softmax without its running maximum: ``exp`` of scores in the hundreds overflows float32;
* a maximum that grows while the sum and the accumulated values keep the old scale (not rescaled): wrong
  as soon as a later block of keys scores higher than the earlier ones;
* the parts: one that drops keys (the remainder when ``splits`` does not divide the length) or reads
  past its own end (keys counted twice);
* an empty part (more parts than keys) that writes nothing or NaN into ``lse``; a merge that lets an
  empty part's row into the sum;
* the log-sum-exp in another base (``log2``: your merge of your own parts looks right, but ``lse`` is
  part of the contract, so the merge of another ``decode`` would not be);
* q's strides: q read as if it were contiguous (a view into wider rows, or head-major);
* the order of the checks: a refused call that already wrote into ``out``.

Triton under the interpreter: ``tl.dot`` of bfloat16 operands is wrong there (Triton 3.9), so use
``dot(a, b, EXACT)`` below with ``EXACT=exact(q.dtype)``: on the CPU it multiplies in float32 (the same
products), on a GPU it is ``tl.dot``. Block sizes must be powers of two (``tl.arange``), and ``tl.dot``
on a GPU needs both sides of its tiles at least 16.

Grading: ``python -m autograder lab16`` runs the docstring's examples, the merge on its own, the partial
buffers, grouped-query heads (1, 2, 4, 8 query heads per KV head), pages of 1 and 16 scattered over the
pool, ragged lengths and split counts (1, a count that does not divide the length, more parts than keys),
large and rising scores, bfloat16, q as a view, ``out`` and ``partial`` given, the checks one argument at
a time, random batches, and the engine's tiny Llama and Qwen3 decoding with your ``decode`` (the torch
backend's greedy tokens). ``pytest autograder/test_gpu_lab16.py`` runs it on a CUDA GPU.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # read by triton when it is imported


def exact(dtype: torch.dtype) -> bool:
    """Whether ``dot`` multiplies in float32 (IEEE): for float32 inputs (no TF32 rounding on a GPU), and
    always under the interpreter (whose ``tl.dot`` of bfloat16 is wrong)."""
    return dtype == torch.float32 or INTERPRETED


@triton.jit
def dot(a, b, EXACT: tl.constexpr):
    """``a @ b`` of two 2-D tiles, accumulated in float32."""
    if EXACT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b)


# ---- the split pass -------------------------------------------------------------------------------------
# The kernels' parameters below are a starting point (the grader calls only decode and merge): change them,
# or the grid, as your design needs.
@triton.jit
def split_kernel(
    q_ptr, q_stride_b, q_stride_h,  # q [B, H, D]: element (b, h, d) at b * q_stride_b + h * q_stride_h + d
    k_ptr, v_ptr, slot_stride,  # k_slots, v_slots [S, KV, D]: slot s, KV head g at s * slot_stride + g * D
    table_ptr, table_stride, rows_ptr, lens_ptr,  # page_table [R, W] (row r at r * table_stride), rows, lens
    out_ptr, out_stride_b, out_stride_h,  # out [B, H, D]
    part_ptr, lse_ptr,  # the partial buffers
    scale,
    HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, EXACT: tl.constexpr,
):  # fmt: skip
    raise NotImplementedError("Lab 16: one program's share of the split pass: the attention of a group of query heads over one part of a request's keys, written to out or to the partial buffers (a hint: python -m autograder lab16 --hint)")


# ---- the merge pass -------------------------------------------------------------------------------------
@triton.jit
def merge_kernel(
    part_ptr, lse_ptr,  # the partial buffers: entry (b * H + h) * SPLITS + i
    out_ptr, out_stride_b, out_stride_h,  # out [B, H, D]
    HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
):  # fmt: skip
    raise NotImplementedError("Lab 16: one program's share of the merge: out for one request and query head from its parts (a hint: python -m autograder lab16 --hint)")


# ---- the functions the engine calls ---------------------------------------------------------------------
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_decode(q, k_slots, v_slots, page_table, rows, lens, splits, out, partial) -> None:
    """Every check of ``decode``'s contract (``TypeError`` / ``ValueError``), before anything is launched."""
    raise NotImplementedError("Lab 16: the input checks of decode, each argument on its own (a hint: python -m autograder lab16 --hint)")


def check_partial(partial, need: int, dim: int) -> None:
    """``partial`` is ``(part, lse)``: float32, contiguous, ``part`` ``[>= need, dim]``, ``lse`` ``[>= need]``."""
    raise NotImplementedError("Lab 16: the checks of the two partial buffers, each on its own (a hint: python -m autograder lab16 --hint)")


def decode(
    q: torch.Tensor,
    k_slots: torch.Tensor,
    v_slots: torch.Tensor,
    page_table: torch.Tensor,
    rows: torch.Tensor,
    lens: torch.Tensor,
    scale: float,
    splits: int,
    out: torch.Tensor | None = None,
    partial: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Decode attention of ``q`` over each request's keys in the pool, in ``splits`` parts (the module
    docstring states the contract); returns ``out``."""
    check_decode(q, k_slots, v_slots, page_table, rows, lens, splits, out, partial)
    raise NotImplementedError("Lab 16: the split pass launched over every request, KV head and part, then the merge when there is more than one part (a hint: python -m autograder lab16 --hint)")


def merge(part: torch.Tensor, lse: torch.Tensor, out: torch.Tensor, splits: int) -> None:
    """``out`` ``[B, H, D]`` from the ``splits`` partial results of each request and head (the module
    docstring states the layout)."""
    raise NotImplementedError("Lab 16: the merge's checks, then its launch over every request and query head (a hint: python -m autograder lab16 --hint)")
