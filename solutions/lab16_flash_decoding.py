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
    # BEGIN SOLUTION what="one program's share of the split pass: the attention of a group of query heads over one part of a request's keys, written to out or to the partial buffers" hint="program ids: request, KV head, part. The part's key range from the length cut into SPLITS pieces (ceil division, the last one short, some empty); the group's query heads as the rows of one tile (padded to BLOCK_H, masked); loop over the range in blocks of BLOCK_N: slots through the page table, scores by dot, masked to the range; keep a running max m, sum l and accumulator, rescaling both by exp(m_old - m_new); then out (one split) or part = acc / l and lse = m + log(l), -inf when l is 0"
    req = tl.program_id(0)
    kv = tl.program_id(1)
    piece = tl.program_id(2)
    n_keys = tl.load(lens_ptr + req)
    table_row = table_ptr + tl.load(rows_ptr + req).to(tl.int64) * table_stride
    share = tl.cdiv(n_keys, SPLITS)
    first = piece * share
    stop = tl.minimum(first + share, n_keys)

    g_off = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, HEAD_DIM)
    heads = kv * GROUP + g_off
    real = g_off < GROUP
    q_tile = tl.load(
        q_ptr + req * q_stride_b + heads[:, None] * q_stride_h + dims[None, :], mask=real[:, None], other=0.0
    )

    run_max = tl.full((BLOCK_H,), float("-inf"), tl.float32)
    run_sum = tl.zeros((BLOCK_H,), tl.float32)
    acc = tl.zeros((BLOCK_H, HEAD_DIM), tl.float32)
    for base in range(first, stop, BLOCK_N):
        j = base + tl.arange(0, BLOCK_N)
        inside = j < stop
        slots = tl.load(table_row + j, mask=inside, other=0).to(tl.int64)
        where = slots[:, None] * slot_stride + kv * HEAD_DIM + dims[None, :]
        keys = tl.load(k_ptr + where, mask=inside[:, None], other=0.0)
        scores = dot(q_tile, tl.trans(keys), EXACT) * scale
        scores = tl.where(inside[None, :], scores, float("-inf"))
        new_max = tl.maximum(run_max, tl.max(scores, axis=1))
        factor = tl.exp(run_max - new_max)
        weights = tl.exp(scores - new_max[:, None])
        run_sum = run_sum * factor + tl.sum(weights, axis=1)
        vals = tl.load(v_ptr + where, mask=inside[:, None], other=0.0)
        acc = acc * factor[:, None] + dot(weights.to(vals.dtype), vals, EXACT)
        run_max = new_max

    some = run_sum > 0
    result = acc / tl.where(some, run_sum, 1.0)[:, None]
    if SPLITS == 1:
        dst = out_ptr + req * out_stride_b + heads[:, None] * out_stride_h + dims[None, :]
        tl.store(dst, result.to(out_ptr.dtype.element_ty), mask=real[:, None])
    else:
        entry = (req * HEADS + heads) * SPLITS + piece
        tl.store(part_ptr + entry[:, None] * HEAD_DIM + dims[None, :], result, mask=real[:, None])
        tl.store(lse_ptr + entry, tl.where(some, run_max + tl.log(run_sum), float("-inf")), mask=real)
    # END SOLUTION


# ---- the merge pass -------------------------------------------------------------------------------------
@triton.jit
def merge_kernel(
    part_ptr, lse_ptr,  # the partial buffers: entry (b * H + h) * SPLITS + i
    out_ptr, out_stride_b, out_stride_h,  # out [B, H, D]
    HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
):  # fmt: skip
    # BEGIN SOLUTION what="one program's share of the merge: out for one request and query head from its parts" hint="program ids: request, head. Load the SPLITS log-sum-exps (padded to BLOCK_S with -inf); weights exp(lse - max lse), 0 where lse is -inf; load the part rows where the weight is not 0 (other=0: an empty part's row may be NaN); out = weighted sum / sum of weights"
    req = tl.program_id(0)
    head = tl.program_id(1)
    first = (req * HEADS + head) * SPLITS
    i = tl.arange(0, BLOCK_S)
    dims = tl.arange(0, HEAD_DIM)
    sums = tl.load(lse_ptr + first + i, mask=i < SPLITS, other=float("-inf"))
    used = sums > float("-inf")
    weight = tl.where(used, tl.exp(sums - tl.max(sums, axis=0)), 0.0)
    rows = tl.load(part_ptr + (first + i)[:, None] * HEAD_DIM + dims[None, :], mask=used[:, None], other=0.0)
    merged = tl.sum(rows * weight[:, None], axis=0) / tl.sum(weight, axis=0)
    tl.store(out_ptr + req * out_stride_b + head * out_stride_h + dims, merged.to(out_ptr.dtype.element_ty))
    # END SOLUTION


# ---- the functions the engine calls ---------------------------------------------------------------------
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_decode(q, k_slots, v_slots, page_table, rows, lens, splits, out, partial) -> None:
    """Every check of ``decode``'s contract (``TypeError`` / ``ValueError``), before anything is launched."""
    # BEGIN SOLUTION what="the input checks of decode, each argument on its own" hint="shapes, strides and dtypes only (never the values of lens or rows: that would read them back from a GPU); TypeError for a dtype, ValueError for the rest; out compared with q's shape dimension by dimension; each partial buffer on its own"
    if q.dim() != 3 or q.stride(2) != 1:
        raise ValueError(f"q must be [B, H, D] with stride(2) == 1, got shape {tuple(q.shape)} strides {q.stride()}")
    if q.dtype not in DTYPES:
        raise TypeError(f"q must be float32, bfloat16 or float16, not {q.dtype}")
    bsz, heads, dim = q.shape
    for name, t in (("k_slots", k_slots), ("v_slots", v_slots)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, not {t.dtype}")
        if t.dim() != 3 or t.shape[2] != dim or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous [S, KV, {dim}] tensor, got {tuple(t.shape)}")
    if k_slots.shape != v_slots.shape:
        raise ValueError(f"k_slots {tuple(k_slots.shape)} and v_slots {tuple(v_slots.shape)} differ")
    if heads % k_slots.shape[1]:
        raise ValueError(f"{heads} query heads are not a multiple of {k_slots.shape[1]} KV heads")
    if dim < 16 or dim & (dim - 1):
        raise ValueError(f"head_dim must be a power of two >= 16, not {dim}")
    if page_table.dtype != torch.int32 or lens.dtype != torch.int32:
        raise TypeError(f"page_table and lens must be int32, not {page_table.dtype} and {lens.dtype}")
    if rows.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"rows must be int32 or int64, not {rows.dtype}")
    if page_table.dim() != 2 or page_table.stride(1) != 1:
        raise ValueError(f"page_table must be 2-D with stride(1) == 1, got {tuple(page_table.shape)}")
    if tuple(rows.shape) != (bsz,) or tuple(lens.shape) != (bsz,):
        raise ValueError(f"rows {tuple(rows.shape)} and lens {tuple(lens.shape)} must be [{bsz}]")
    if splits < 1:
        raise ValueError(f"splits must be at least 1, not {splits}")
    if out is not None:
        if out.dtype != q.dtype:
            raise TypeError(f"out must have q's dtype {q.dtype}, not {out.dtype}")
        if out.shape != q.shape or out.stride(2) != 1:
            raise ValueError(f"out must be q's shape {tuple(q.shape)} with stride(2) == 1, got {tuple(out.shape)}")
    if partial is not None and splits > 1:
        check_partial(partial, bsz * heads * splits, dim)
    # END SOLUTION


def check_partial(partial, need: int, dim: int) -> None:
    """``partial`` is ``(part, lse)``: float32, contiguous, ``part`` ``[>= need, dim]``, ``lse`` ``[>= need]``."""
    # BEGIN SOLUTION what="the checks of the two partial buffers, each on its own" hint="TypeError unless both are float32; ValueError unless each is contiguous, part 2-D of width dim, lse 1-D, and each has at least need rows"
    part, lse = partial
    if part.dtype != torch.float32 or lse.dtype != torch.float32:
        raise TypeError(f"the partial buffers must be float32, not {part.dtype} and {lse.dtype}")
    if part.dim() != 2 or part.shape[1] != dim or lse.dim() != 1:
        raise ValueError(f"part must be [N, {dim}] and lse [N], got {tuple(part.shape)} and {tuple(lse.shape)}")
    if not (part.is_contiguous() and lse.is_contiguous()):
        raise ValueError("the partial buffers must be contiguous")
    if part.shape[0] < need or lse.shape[0] < need:
        raise ValueError(f"the partial buffers need {need} rows each, got {part.shape[0]} and {lse.shape[0]}")
    # END SOLUTION


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
    # BEGIN SOLUTION what="the split pass launched over every request, KV head and part, then the merge when there is more than one part" hint="out allocated when None; with splits > 1 the partial buffers allocated when None; grid (B, KV, splits); BLOCK_H the group size rounded up to a power of two, at least 16; the q and out strides of dims 0 and 1; then merge(part, lse, out, splits)"
    bsz, heads, dim = q.shape
    kv_heads = k_slots.shape[1]
    group = heads // kv_heads
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if splits > 1 and partial is None:
        partial = (
            torch.empty(bsz * heads * splits, dim, dtype=torch.float32, device=q.device),
            torch.empty(bsz * heads * splits, dtype=torch.float32, device=q.device),
        )
    part, lse = partial if splits > 1 else (out, out)
    split_kernel[(bsz, kv_heads, splits)](
        q, q.stride(0), q.stride(1),
        k_slots, v_slots, k_slots.stride(0),
        page_table, page_table.stride(0), rows, lens,
        out, out.stride(0), out.stride(1),
        part, lse,
        scale,
        HEADS=heads, GROUP=group, HEAD_DIM=dim, SPLITS=splits,
        BLOCK_H=max(16, triton.next_power_of_2(group)), BLOCK_N=32, EXACT=exact(q.dtype),
    )  # fmt: skip
    if splits > 1:
        merge(part, lse, out, splits)
    return out
    # END SOLUTION


def merge(part: torch.Tensor, lse: torch.Tensor, out: torch.Tensor, splits: int) -> None:
    """``out`` ``[B, H, D]`` from the ``splits`` partial results of each request and head (the module
    docstring states the layout)."""
    # BEGIN SOLUTION what="the merge's checks, then its launch over every request and query head" hint="ValueError for an out that is not 3-D (or stride(2) != 1) and for splits < 1, then check_partial with B * H * splits rows; grid (B, H); BLOCK_S the split count rounded up to a power of two"
    if out.dim() != 3 or out.stride(2) != 1:
        raise ValueError(f"out must be [B, H, D] with stride(2) == 1, got {tuple(out.shape)}")
    if splits < 1:
        raise ValueError(f"splits must be at least 1, not {splits}")
    bsz, heads, dim = out.shape
    check_partial((part, lse), bsz * heads * splits, dim)
    merge_kernel[(bsz, heads)](
        part, lse, out, out.stride(0), out.stride(1),
        HEADS=heads, HEAD_DIM=dim, SPLITS=splits, BLOCK_S=max(2, triton.next_power_of_2(splits)),
    )  # fmt: skip
    # END SOLUTION
