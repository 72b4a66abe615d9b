"""Paged attention in Triton: the kernels of the ``triton`` attention backend (lesson 16).

Both read K/V where they lie in the pool, a key at a time through the page table
(``page_table[row, position] -> slot``; a slot's K is ``k_slots[slot, kv_head, :]``), so every page size
works and nothing is gathered into a copy first. Both keep softmax online: a running maximum ``m``, a
running sum ``l`` of ``exp(score - m)`` and an accumulator of ``exp(score - m) @ V``, rescaled whenever ``m``
grows, so no ``[queries, keys]`` matrix is ever held.

``decode``   one query per request. A program takes one request, one KV head and one *split* of the
             request's keys (flash-decoding): the query heads of that KV head's group are the rows of
             one tile (GQA: each K/V block is loaded once for the whole group). Each split writes its
             normalised output and its log-sum-exp; :func:`merge` then combines a request's splits,
             weighting each by ``exp(lse_i - max lse)``. With one split the first kernel writes the
             output itself.
``extend``   the queries of a prefill (a whole prompt, or a chunk after a cached prefix): a program
             takes a block of one request's queries for one query head, and walks the keys up to the
             block's last position, causal from the request's first new token.

Everything accumulates in float32; the probabilities are cast to the KV dtype for the ``@ V`` product
(FlashAttention's rounding point). Under ``TRITON_INTERPRET=1`` the same code runs on the CPU.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from minisgl.kernels.triton_kernels import TL_DTYPES

__all__ = ["TL_DTYPES", "decode", "extend", "merge", "num_splits"]
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def _exact(dtype: torch.dtype) -> bool:
    """Products in float32 as IEEE (not TF32) for float32 inputs; and always under the interpreter, whose
    ``tl.dot`` of bfloat16 operands is wrong (Triton 3.9): there the operands become float32 first, which
    gives the same products (a bf16 x bf16 product is exact in float32)."""
    return dtype == torch.float32 or INTERPRETED


@triton.jit
def _dot(a, b, EXACT: tl.constexpr):
    if EXACT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _decode_kernel(
    q_ptr, q_stride_b, q_stride_h,
    k_ptr, v_ptr, slot_stride,
    table_ptr, table_stride, rows_ptr, lens_ptr,
    out_ptr, out_stride_b, out_stride_h,
    part_ptr, lse_ptr,
    scale,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, EXACT: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    length = tl.load(lens_ptr + b)
    row = tl.load(rows_ptr + b).to(tl.int64)
    # a split covers whole key blocks: its range is the request's keys cut into SPLITS parts
    chunk = tl.cdiv(tl.cdiv(length, SPLITS), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, length)

    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + h
    h_ok = h < GROUP
    q = tl.load(q_ptr + b * q_stride_b + heads[:, None] * q_stride_h + d[None, :], mask=h_ok[:, None], other=0.0)

    m = tl.full((BLOCK_H,), float("-inf"), tl.float32)
    l = tl.zeros((BLOCK_H,), tl.float32)
    acc = tl.zeros((BLOCK_H, HEAD_DIM), tl.float32)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        ok = pos < end
        slot = tl.load(table_ptr + row * table_stride + pos, mask=ok, other=0).to(tl.int64)
        kv_off = slot[:, None] * slot_stride + kv_head * HEAD_DIM + d[None, :]
        k = tl.load(k_ptr + kv_off, mask=ok[:, None], other=0.0).to(q.dtype)  # a narrower pool: widened
        s = _dot(q, tl.trans(k), EXACT) * scale
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + kv_off, mask=ok[:, None], other=0.0).to(q.dtype)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, EXACT)
        m = m_new

    seen = l > 0
    o = acc / tl.where(seen, l, 1.0)[:, None]
    if SPLITS == 1:
        dst = out_ptr + b * out_stride_b + heads[:, None] * out_stride_h + d[None, :]
        tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=h_ok[:, None])
    else:
        num_heads = tl.num_programs(1) * GROUP
        at = (b * num_heads + heads) * SPLITS + split  # [B, H, SPLITS]
        tl.store(part_ptr + at[:, None] * HEAD_DIM + d[None, :], o, mask=h_ok[:, None])
        tl.store(lse_ptr + at, tl.where(seen, m + tl.log(l), float("-inf")), mask=h_ok)


@triton.jit
def _merge_kernel(
    part_ptr, lse_ptr, out_ptr, out_stride_b, out_stride_h,
    HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    h = tl.program_id(1)
    at = (b * tl.num_programs(1) + h) * SPLITS
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, HEAD_DIM)
    lse = tl.load(lse_ptr + at + s, mask=s < SPLITS, other=float("-inf"))
    top = tl.max(lse, 0)
    w = tl.where(lse > float("-inf"), tl.exp(lse - top), 0.0)
    parts = tl.load(part_ptr + (at + s)[:, None] * HEAD_DIM + d[None, :], mask=(s < SPLITS)[:, None], other=0.0)
    o = tl.sum(parts * w[:, None], 0) / tl.sum(w, 0)
    tl.store(out_ptr + b * out_stride_b + h * out_stride_h + d, o.to(out_ptr.dtype.element_ty))


MAX_SPLITS = 32


def num_splits(batch_size: int, kv_heads: int, max_len: int, programs: int, block_n: int = 64) -> int:
    """How many parts to cut each request's keys into: enough programs (``batch * kv_heads * splits``) to
    give every streaming multiprocessor ``programs // SMs`` of them, but no part shorter than 2 key blocks
    of ``max_len``, and at most ``MAX_SPLITS`` (the merge reads that many partial rows a head). A batch of
    many requests needs no split; one long request needs many."""
    want = triton.cdiv(programs, batch_size * kv_heads)
    longest = triton.cdiv(max_len, 2 * block_n)
    return max(1, min(MAX_SPLITS, want, longest))


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
    """Attention of ``q`` ``[B, H, D]`` (one query per request) over keys ``0 .. lens[b] - 1`` of request
    ``b``, whose slots are ``page_table[rows[b], :]``; ``k_slots``/``v_slots`` ``[slots, KV, D]``. Returns
    ``out`` ``[B, H, D]`` in q's dtype. ``splits`` parts per request (:func:`num_splits`); ``partial``:
    the split outputs' buffers ``([>= B*H*splits, D], [>= B*H*splits])`` float32, made here if None (a
    CUDA graph passes its own)."""
    bsz, heads, dim = q.shape
    kv_heads = k_slots.shape[1]
    group = heads // kv_heads
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else out
    if splits > 1 and partial is None:
        partial = (
            torch.empty(bsz * heads * splits, dim, dtype=torch.float32, device=q.device),
            torch.empty(bsz * heads * splits, dtype=torch.float32, device=q.device),
        )
    part, lse = partial if splits > 1 else (out, out)
    block_h = max(16, triton.next_power_of_2(group))
    _decode_kernel[(bsz, kv_heads, splits)](
        q, q.stride(0), q.stride(1),
        k_slots, v_slots, k_slots.stride(0),
        page_table, page_table.stride(0), rows, lens,
        out, out.stride(0), out.stride(1),
        part, lse,
        scale,
        GROUP=group, HEAD_DIM=dim, SPLITS=splits, BLOCK_H=block_h, BLOCK_N=64, EXACT=_exact(q.dtype),
        num_warps=4, num_stages=2,
    )  # fmt: skip
    if splits > 1:
        merge(part, lse, out, splits)
    return out


def merge(part: torch.Tensor, lse: torch.Tensor, out: torch.Tensor, splits: int) -> None:
    """``out[b, h]`` from the ``splits`` partial outputs of request ``b``, head ``h`` (``part`` and ``lse``
    laid out ``[B, H, splits]``): each weighted by ``exp(lse_i - max lse)``, the weights normalised."""
    bsz, heads, dim = out.shape
    _merge_kernel[(bsz, heads)](
        part, lse, out, out.stride(0), out.stride(1),
        HEAD_DIM=dim, SPLITS=splits, BLOCK_S=max(2, triton.next_power_of_2(splits)), num_warps=4,
    )  # fmt: skip


@triton.jit
def _extend_kernel(
    q_ptr, q_stride_t, q_stride_h,
    k_ptr, v_ptr, slot_stride,
    table_ptr, table_stride,
    block_req_ptr, block_first_ptr, req_row_ptr, req_first_ptr, req_start_ptr, req_count_ptr,
    out_ptr, out_stride_t, out_stride_h,
    scale,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EXACT: tl.constexpr,
):  # fmt: skip
    blk = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // GROUP
    r = tl.load(block_req_ptr + blk)
    first = tl.load(block_first_ptr + blk)  # the block's first query, as a row of this request's queries
    row = tl.load(req_row_ptr + r).to(tl.int64)
    q0 = tl.load(req_first_ptr + r)  # the request's first row in q
    start = tl.load(req_start_ptr + r)  # the position of its first new token (its cached prefix's length)
    count = tl.load(req_count_ptr + r)  # its new tokens

    i = first + tl.arange(0, BLOCK_M)
    i_ok = i < count
    q_pos = start + i
    d = tl.arange(0, HEAD_DIM)
    t = (q0 + i).to(tl.int64)
    q = tl.load(q_ptr + t[:, None] * q_stride_t + head * q_stride_h + d[None, :], mask=i_ok[:, None], other=0.0)

    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    last = start + tl.minimum(first + BLOCK_M, count)  # keys 0 .. last - 1 serve this block
    for n0 in range(0, last, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        ok = pos < last
        slot = tl.load(table_ptr + row * table_stride + pos, mask=ok, other=0).to(tl.int64)
        kv_off = slot[:, None] * slot_stride + kv_head * HEAD_DIM + d[None, :]
        k = tl.load(k_ptr + kv_off, mask=ok[:, None], other=0.0).to(q.dtype)  # a narrower pool: widened
        s = _dot(q, tl.trans(k), EXACT) * scale
        s = tl.where(ok[None, :] & (pos[None, :] <= q_pos[:, None]), s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + kv_off, mask=ok[:, None], other=0.0).to(q.dtype)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, EXACT)
        m = m_new
    o = acc / tl.where(l > 0, l, 1.0)[:, None]
    dst = out_ptr + t[:, None] * out_stride_t + head * out_stride_h + d[None, :]
    tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=i_ok[:, None])


EXTEND_BLOCK_M = 64


def extend(
    q: torch.Tensor,
    k_slots: torch.Tensor,
    v_slots: torch.Tensor,
    page_table: torch.Tensor,
    blocks: tuple[torch.Tensor, torch.Tensor],
    reqs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    scale: float,
) -> torch.Tensor:
    """Causal attention of the new tokens ``q`` ``[T, H, D]`` (each request's back to back) over their
    requests' keys in the pool, the cached prefix included. ``reqs``: per request its page-table row,
    its first row in ``q``, the position of its first new token and how many there are (int32, on the
    device); ``blocks``: per block of ``EXTEND_BLOCK_M`` queries, its request and its first query within
    the request (:func:`extend_blocks`). Returns ``[T, H, D]`` in q's dtype."""
    tokens, heads, dim = q.shape
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    block_req, block_first = blocks
    group = heads // k_slots.shape[1]
    _extend_kernel[(len(block_req), heads)](
        q, q.stride(0), q.stride(1),
        k_slots, v_slots, k_slots.stride(0),
        page_table, page_table.stride(0),
        block_req, block_first, *reqs,
        out, out.stride(0), out.stride(1),
        scale,
        GROUP=group, HEAD_DIM=dim, BLOCK_M=EXTEND_BLOCK_M, BLOCK_N=64, EXACT=_exact(q.dtype),
        num_warps=4, num_stages=2,
    )  # fmt: skip
    return out


def extend_blocks(counts: list[int]) -> tuple[list[int], list[int]]:
    """Per block of ``EXTEND_BLOCK_M`` queries: its request and its first query within the request."""
    block_req, block_first = [], []
    for r, n in enumerate(counts):
        for first in range(0, n, EXTEND_BLOCK_M):
            block_req.append(r)
            block_first.append(first)
    return block_req, block_first
