"""CPU linear layers at decode-step sizes: a C++ kernel compiled on first use through TVM FFI
(``csrc/small_linear.cc``), and ``F.linear`` everywhere else.

Why a kernel: a decode step at batch 1 multiplies every weight by one vector, so it takes as long as
streaming the weights from memory. torch's CPU matmul is built for matrices: on the embedded model its
matrix-vector products read the weights at 10-14 GB/s, where this machine streams 30+ GB/s. Up to 8
rows the kernel reads each weight row once, front to back, for all of the step's rows; from 9 to
``max_rows`` it multiplies tiles of rows of x by rows of the weight in registers (4 x 3 with AVX-512,
3 x 2 with AVX2's 16 registers). Over all the
embedded model's products that beats MKL's float32 matmul by 10-40% and oneDNN's bf16 one by 5-25%
(tying at 32 rows; by shape, oneDNN is 13-16% faster on gate/up and the LM head from 44 rows). Both
paths sum every output in the same order (float32, rounded once, as torch does), so a row's result does
not depend on how many rows came with it: one kernel for all of 1-64 rows keeps that, on each level. Prefill-sized
inputs go to torch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minisgl.kernels.jit import available as available  # public here too (the tests ask it)
from minisgl.kernels.jit import kernels

# Rows of x up to which linear() runs the kernel, by level (jit.ISAS) and dtype: past them torch's matmul
# wins, or is not measured to lose (measured in docs/cpu.md, "The CPU decode step").
MAX_ROWS = {
    "avx512": {torch.float32: 64, torch.bfloat16: 64},
    "avx2": {torch.float32: 32, torch.bfloat16: 64},
    "portable": {torch.float32: 8, torch.bfloat16: 8},
}
ROW_LIMIT = 64  # the most any level takes (the kernel's contract: batch invariance up to here)
STREAM_ROWS = 8  # the one-row-at-a-time path (the kernel's kSmallRows)
DTYPES = (torch.float32, torch.bfloat16)  # what the CPU kernels take


def max_rows(dtype: torch.dtype) -> int:
    """Rows of x up to which :func:`linear` runs the kernel on the level in use (``jit.kernels()``), for
    ``dtype`` (float32 or bfloat16; 0 for others; 0 where the kernels are not built). The C++ decode layer
    takes steps of up to as many requests (``models/cpu_decode.py``)."""
    k = kernels()
    return 0 if k.lib is None else MAX_ROWS[k.level].get(dtype, 0)


def uses_kernel(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether :func:`linear` runs the kernel for this input and weight."""
    return (
        x.is_cpu
        and x.dtype in DTYPES
        and weight.dtype == x.dtype
        and weight.dim() == 2
        and weight.is_contiguous()
        and x.numel() <= ROW_LIMIT * x.shape[-1]
        and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
        and x.numel() <= max_rows(x.dtype) * x.shape[-1]
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``; on the CPU at most ``max_rows(dtype)`` rows of ``x`` go through the
    kernel."""
    if not uses_kernel(x, weight):
        return F.linear(x, weight, bias)
    flat = x.dim() == 2 and x.is_contiguous()  # the decoder's case: no reshaping (~5 us a call)
    rows = x if flat else x.reshape(-1, x.shape[-1]).contiguous()
    out = torch.empty(rows.shape[0], weight.shape[0], dtype=x.dtype)
    kernels().lib.small_linear(rows, weight, out, torch.get_num_threads())
    if bias is not None:
        out += bias
    return out if flat else out.view(*x.shape[:-1], weight.shape[0])
