"""Per-token FP8 quantization of a linear layer's input in one Triton kernel (``--quantization fp8``
on Hopper).

``minisgl.quant.fp8.fp8_rows`` in torch is six kernels a layer (abs, amax, divide, clamp, cast,
and the scale's own arithmetic); a decode step of Qwen3-0.6B runs 112 quantized layers, so those
kernels alone cost more than the FP8 GEMMs save. Here one program quantizes one row: a pass over the
row for its largest magnitude, a second pass that writes ``clamp(x / scale)`` as float8_e4m3fn. The
result is bit-equal to ``fp8_rows`` (same float32 scale, the IEEE division ``div_rn``, and the
round-to-nearest-even, saturating cast that torch's ``.to(float8_e4m3fn)`` of a clamped value does):
tests/test_gpu.py compares them. A row's result never depends on other rows (batch invariant).

``scaled_linear`` is the product. ``torch._scaled_mm`` with a scale per token and per output row runs
a CUTLASS kernel that is slow at decode sizes (measured on an H200, Qwen3-14B's down projection at
1 token: 64 us against 51 us in bf16), while with scalar scales it runs cuBLASLt's FP8 GEMM (27 us).
So the GEMM takes unit scales and returns float32 (exact enough: |q| <= 448, and a sum of 17,408
such products stays far inside float32's range), and ``_rescale_kernel`` applies both scales in one
pass, rounding once to the model's dtype, as the fused epilogue would.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minisgl.kernels.triton_kernels import TL_DTYPES

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)


@triton.jit
def _fp8_scale(amax, FMAX: tl.constexpr):
    """A row's scale from its largest magnitude, as ``fp8_rows``: ``(amax / 448).clamp(min=1e-12)``."""
    return tl.maximum(amax / FMAX, 1e-12)


@triton.jit
def _to_fp8(x, scale, FMAX: tl.constexpr):
    """``x / scale`` (the IEEE division) saturated to FP8's range and rounded to it, as ``fp8_rows``."""
    return tl.minimum(tl.maximum(tl.div_rn(x, scale), -FMAX), FMAX).to(tl.float8e4nv)


@triton.jit
def _quant_rows_kernel(x_ptr, x_stride, q_ptr, s_ptr, K, FMAX: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    src = x_ptr + row * x_stride
    amax = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, K, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(src + cols, mask=cols < K, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    scale = _fp8_scale(tl.max(amax, axis=0), FMAX)
    tl.store(s_ptr + row, scale)
    dst = q_ptr + row * K
    for start in range(0, K, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(src + cols, mask=cols < K, other=0.0).to(tl.float32)
        tl.store(dst + cols, _to_fp8(x, scale, FMAX), mask=cols < K)


def quant_rows(
    x: torch.Tensor, block: int | None = None, warps: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` ([M, K], rows contiguous) as float8_e4m3fn ``[M, K]`` and float32 scales ``[M, 1]``, with
    ``x ~= q * scale``: what ``fp8_rows`` returns, in one kernel (``block`` columns per loop iteration and
    ``warps``: tuning knobs for the benchmark, defaults measured on an H200)."""
    assert x.dim() == 2 and x.stride(-1) == 1, "rows must be contiguous"
    m, k = x.shape
    q = torch.empty((m, k), dtype=FP8, device=x.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m:
        # one program a row, so a decode step's few rows are latency-bound: few, wide loop iterations
        block = block or min(triton.next_power_of_2(k), 4096)
        warps = warps or (8 if block >= 4096 else 4)
        _quant_rows_kernel[(m,)](x, x.stride(0), q, scale, k, FMAX=FP8_MAX, BLOCK=block, num_warps=warps)
    return q, scale


@triton.jit
def _rescale_kernel(y_ptr, xs_ptr, ws_ptr, out_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    keep = cols < N
    y = tl.load(y_ptr + row * N + cols, mask=keep, other=0.0).to(tl.float32)
    w = tl.load(ws_ptr + cols, mask=keep, other=0.0)
    out = y * tl.load(xs_ptr + row) * w
    tl.store(out_ptr + row * N + cols, out.to(out_ptr.dtype.element_ty), mask=keep)


def rescale(acc: torch.Tensor, row_scale: torch.Tensor, col_scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``acc * row_scale * col_scale`` (in float32) rounded to ``dtype``: ``acc`` [M, N] (contiguous,
    float32 or bf16), ``row_scale`` [M, 1], ``col_scale`` [1, N] float32."""
    m, n = acc.shape
    out = torch.empty((m, n), dtype=dtype, device=acc.device)
    if m:
        block = 1024
        _rescale_kernel[(m, triton.cdiv(n, block))](acc, row_scale, col_scale, out, n, BLOCK=block, num_warps=4)
    return out


def scaled_linear(
    xq: torch.Tensor, xs: torch.Tensor, wq_t: torch.Tensor, ws: torch.Tensor, one: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """``(xq * xs) @ (wq_t * ws)`` in ``dtype``: ``xq`` [M, K] FP8 with ``xs`` [M, 1]; ``wq_t`` [K, N] FP8
    (a transposed row-major weight) with ``ws`` [1, N]; ``one`` a float32 scalar 1 on the GPU (made
    once, outside any graph capture). cuBLASLt's FP8 GEMM, then one rescaling pass."""
    return rescale(torch._scaled_mm(xq, wq_t, one, one, out_dtype=torch.float32), xs, ws, dtype)


# ---- the kernels on either side of an FP8 layer (fp8.py: QuantRows in, Unscaled out) -------------

NORM_MAX_WIDTH = 16384  # a norm row is one block in registers


def can_norm(width: int) -> bool:
    return width <= NORM_MAX_WIDTH


@triton.jit
def _norm_kernel(
    x_ptr,
    x_stride,
    rs_ptr,
    cs_ptr,
    res_ptr,
    res_stride,
    w_ptr,
    out_ptr,
    os_ptr,
    N,
    eps,
    DTYPE: tl.constexpr,
    UNSCALED: tl.constexpr,
    RESIDUAL: tl.constexpr,
    QUANT: tl.constexpr,
    FMAX: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    keep = cols < N
    x = tl.load(x_ptr + row * x_stride + cols, mask=keep, other=0.0)
    if UNSCALED:  # an FP8 GEMM's product: its two scales, rounded as the unfused pass rounds
        x = (x.to(tl.float32) * tl.load(rs_ptr + row) * tl.load(cs_ptr + cols, mask=keep, other=0.0)).to(DTYPE)
    h = x.to(tl.float32)
    if RESIDUAL:  # residual += x in the model's dtype; the norm reads the float32 sum (as FlashInfer's does)
        h += tl.load(res_ptr + row * res_stride + cols, mask=keep, other=0.0).to(tl.float32)
        tl.store(res_ptr + row * res_stride + cols, h.to(DTYPE), mask=keep)
    r = tl.rsqrt(tl.sum(h * h, axis=0) / N + eps)
    y = (h * r * tl.load(w_ptr + cols, mask=keep, other=0.0).to(tl.float32)).to(DTYPE)
    if QUANT:  # the whole row is in registers: its scale, then its FP8 values, as quant_rows would
        scale = _fp8_scale(tl.max(tl.abs(y.to(tl.float32)), axis=0), FMAX)
        tl.store(os_ptr + row, scale)
        tl.store(out_ptr + row * N + cols, _to_fp8(y.to(tl.float32), scale, FMAX), mask=keep)
    else:
        tl.store(out_ptr + row * N + cols, y, mask=keep)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
    col_scale: torch.Tensor | None = None,
    dtype: torch.dtype | None = None,
    quantize: bool = False,
):
    """RMSNorm of ``x`` [M, N] (rows contiguous) in one kernel. ``x`` is in the model's dtype, or an FP8
    GEMM's product (float32 or bf16) whose scales ``row_scale`` [M, 1] and ``col_scale`` [1, N] are applied
    first (``dtype``: the model's). With ``residual`` ([M, N], the model's dtype) the input is first
    added to it in place. Returns the normed rows in the model's dtype, or as FP8 with per-row scales
    (``(q [M, N], scale [M, 1])``, what ``quant_rows`` of them gives) when ``quantize``."""
    m, n = x.shape
    unscaled = row_scale is not None
    dtype = dtype if unscaled else x.dtype
    assert can_norm(n) and x.stride(-1) == 1 and (residual is None or residual.stride(-1) == 1)
    out = torch.empty((m, n), dtype=FP8 if quantize else dtype, device=x.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=x.device) if quantize else out
    if m:
        res = residual if residual is not None else x
        block = triton.next_power_of_2(n)
        _norm_kernel[(m,)](
            x, x.stride(0), row_scale if unscaled else x, col_scale if unscaled else x,
            res, res.stride(0), weight, out, scale, n, eps,
            DTYPE=TL_DTYPES[dtype], UNSCALED=unscaled, RESIDUAL=residual is not None, QUANT=quantize,
            FMAX=FP8_MAX, BLOCK=block, num_warps=8 if block >= 4096 else 4,
        )  # fmt: skip
    return (out, scale) if quantize else out


@triton.jit
def _swiglu_block(src, rs, cs_ptr, start, I, DTYPE: tl.constexpr, UNSCALED: tl.constexpr, BLOCK: tl.constexpr):
    """``silu(gate) * up`` for columns ``start..start+BLOCK`` of one row, float32 rounded to the model's
    dtype (the unfused kernels' output); 0 past the row's end."""
    cols = start + tl.arange(0, BLOCK)
    keep = cols < I
    g = tl.load(src + cols, mask=keep, other=0.0)
    u = tl.load(src + I + cols, mask=keep, other=0.0)
    if UNSCALED:
        g = (g.to(tl.float32) * rs * tl.load(cs_ptr + cols, mask=keep, other=0.0)).to(DTYPE)
        u = (u.to(tl.float32) * rs * tl.load(cs_ptr + I + cols, mask=keep, other=0.0)).to(DTYPE)
    g = g.to(tl.float32)
    return (g / (1.0 + tl.exp(-g)) * u.to(tl.float32)).to(DTYPE).to(tl.float32)


@triton.jit
def _swiglu_quant_kernel(
    x_ptr, x_stride, rs_ptr, cs_ptr, q_ptr, s_ptr, I,
    DTYPE: tl.constexpr, UNSCALED: tl.constexpr, FMAX: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One row whole (``BLOCK >= I``): SwiGLU once, its largest magnitude, the FP8 row and its scale."""
    row = tl.program_id(0).to(tl.int64)
    rs = 1.0
    if UNSCALED:
        rs = tl.load(rs_ptr + row)
    h = _swiglu_block(x_ptr + row * x_stride, rs, cs_ptr, 0, I, DTYPE, UNSCALED, BLOCK)
    scale = _fp8_scale(tl.max(tl.abs(h), axis=0), FMAX)
    tl.store(s_ptr + row, scale)
    cols = tl.arange(0, BLOCK)
    tl.store(q_ptr + row * I + cols, _to_fp8(h, scale, FMAX), mask=cols < I)


@triton.jit
def _swiglu_chunk_kernel(
    x_ptr, x_stride, rs_ptr, cs_ptr, h_ptr, amax_ptr, I, C,
    DTYPE: tl.constexpr, UNSCALED: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One chunk of one row: SwiGLU in the model's dtype to ``h``, its largest magnitude to ``amax``."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    rs = 1.0
    if UNSCALED:
        rs = tl.load(rs_ptr + row)
    start = chunk * BLOCK
    h = _swiglu_block(x_ptr + row * x_stride, rs, cs_ptr, start, I, DTYPE, UNSCALED, BLOCK)
    cols = start + tl.arange(0, BLOCK)
    tl.store(h_ptr + row * I + cols, h.to(DTYPE), mask=cols < I)
    tl.store(amax_ptr + row * C + chunk, tl.max(tl.abs(h), axis=0))


@triton.jit
def _quant_chunk_kernel(h_ptr, amax_ptr, q_ptr, s_ptr, I, C, CP: tl.constexpr, FMAX: tl.constexpr, BLOCK: tl.constexpr):
    """One chunk of one row of ``h`` to FP8 with the row's scale, from its chunks' largest magnitudes."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    parts = tl.load(amax_ptr + row * C + tl.arange(0, CP), mask=tl.arange(0, CP) < C, other=0.0)
    scale = _fp8_scale(tl.max(parts, axis=0), FMAX)
    if chunk == 0:
        tl.store(s_ptr + row, scale)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    h = tl.load(h_ptr + row * I + cols, mask=cols < I, other=0.0).to(tl.float32)
    tl.store(q_ptr + row * I + cols, _to_fp8(h, scale, FMAX), mask=cols < I)


# SwiGLU + quantization as one program per row, the row held whole, up to this width; wider rows in
# chunks of SPLIT_CHUNK columns, all rows and chunks at once, in two kernels through a scratch copy in the
# model's dtype (a program walking its row twice was several times slower: docs/fp8.md, "FP8").
ONE_PROGRAM_UP_TO = 4096
SPLIT_CHUNK = 1024


def silu_and_mul_quant(
    x: torch.Tensor,
    row_scale: torch.Tensor | None = None,
    col_scale: torch.Tensor | None = None,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SwiGLU of ``x`` = ``[gate | up]`` ([M, 2I], rows contiguous), quantized per row for the next FP8
    layer: ``(q [M, I], scale [M, 1])``, what ``quant_rows(silu_and_mul(x))`` gives. ``x`` is in the
    model's dtype or an FP8 GEMM's product with its scales (as in ``rms_norm``)."""
    m, n = x.shape
    unscaled = row_scale is not None
    dtype = dtype if unscaled else x.dtype
    assert n % 2 == 0 and x.stride(-1) == 1
    i = n // 2
    q = torch.empty((m, i), dtype=FP8, device=x.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if not m:
        return q, scale
    rs, cs = (row_scale, col_scale) if unscaled else (x, x)
    if i <= ONE_PROGRAM_UP_TO:
        block = triton.next_power_of_2(i)
        _swiglu_quant_kernel[(m,)](
            x, x.stride(0), rs, cs, q, scale, i, DTYPE=TL_DTYPES[dtype], UNSCALED=unscaled, FMAX=FP8_MAX,
            BLOCK=block, num_warps=16 if block >= 4096 else 4,
        )  # fmt: skip
        return q, scale
    chunks = triton.cdiv(i, SPLIT_CHUNK)
    h = torch.empty((m, i), dtype=dtype, device=x.device)
    amax = torch.empty((m, chunks), dtype=torch.float32, device=x.device)
    grid = (m, chunks)
    _swiglu_chunk_kernel[grid](
        x, x.stride(0), rs, cs, h, amax, i, chunks, DTYPE=TL_DTYPES[dtype], UNSCALED=unscaled, BLOCK=SPLIT_CHUNK
    )
    _quant_chunk_kernel[grid](
        h, amax, q, scale, i, chunks, CP=triton.next_power_of_2(chunks), FMAX=FP8_MAX, BLOCK=SPLIT_CHUNK
    )
    return q, scale
