"""Per-token FP8 quantization of a linear layer's input in one Triton kernel (``--quantization fp8``
on Hopper).

``minisgl.layers.linear.fp8_rows`` in torch is six kernels a layer (abs, amax, divide, clamp, cast,
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

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)


@triton.jit
def _quant_rows_kernel(x_ptr, x_stride, q_ptr, s_ptr, K, FMAX: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    src = x_ptr + row * x_stride
    amax = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, K, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(src + cols, mask=cols < K, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    scale = tl.maximum(tl.max(amax, axis=0) / FMAX, 1e-12)  # fp8_rows: (amax / 448).clamp(min=1e-12)
    tl.store(s_ptr + row, scale)
    dst = q_ptr + row * K
    for start in range(0, K, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(src + cols, mask=cols < K, other=0.0).to(tl.float32)
        q = tl.minimum(tl.maximum(tl.div_rn(x, scale), -FMAX), FMAX)
        tl.store(dst + cols, q.to(tl.float8e4nv), mask=cols < K)


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
    y = tl.load(y_ptr + row * N + cols, mask=keep, other=0.0)
    w = tl.load(ws_ptr + cols, mask=keep, other=0.0)
    out = y * tl.load(xs_ptr + row) * w
    tl.store(out_ptr + row * N + cols, out.to(out_ptr.dtype.element_ty), mask=keep)


def scaled_linear(
    xq: torch.Tensor, xs: torch.Tensor, wq_t: torch.Tensor, ws: torch.Tensor, one: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """``(xq * xs) @ (wq_t * ws)`` in ``dtype``: ``xq`` [M, K] FP8 with ``xs`` [M, 1]; ``wq_t`` [K, N] FP8
    (a transposed row-major weight) with ``ws`` [1, N]; ``one`` a float32 scalar 1 on the GPU (made
    once, outside any graph capture). cuBLASLt's FP8 GEMM, then one rescaling pass."""
    y = torch._scaled_mm(xq, wq_t, one, one, out_dtype=torch.float32)
    m, n = y.shape
    out = torch.empty((m, n), dtype=dtype, device=y.device)
    if m:
        block = 1024
        _rescale_kernel[(m, triton.cdiv(n, block))](y, xs, ws, out, n, BLOCK=block, num_warps=4)
    return out
