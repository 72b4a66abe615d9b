"""The element-wise steps of a decoder layer on the CPU as C++ (``csrc/cpu_fused.cc``, compiled on
first use through TVM FFI), with the call signatures of FlashInfer's fused kernels, so the layers take
them through ``minisgl.kernels.fused_ops`` as they take FlashInfer's on a GPU.

Only for a few tokens a step (``MAX_TOKENS``): there a decode step is ~1,000 tiny torch ops whose
dispatch costs more than their arithmetic. Each function rounds where the torch version rounds (in
bfloat16 the same values up to the order of a sum); torch's multi-threaded ops run longer batches.
"""

from __future__ import annotations

import torch

from minisgl.kernels.jit import available, cpu_module
from minisgl.kernels.small_linear import DTYPES

# These run on one core. Past a few tokens torch's threaded, vectorised ops win (with OpenMP over rows
# and no limit they made the CPU batch benchmark 6% slower); the C++ decode layer (decode_layer.cc)
# spreads the same steps over the cores itself from 8 rows on.
MAX_TOKENS = 8


def applies(x: torch.Tensor) -> bool:
    """Whether these kernels take ``x`` (``[tokens, ...]``): a few tokens, on the CPU, float32 or bf16."""
    return x.is_cpu and x.dtype in DTYPES and x.dim() >= 2 and x.shape[0] <= MAX_TOKENS and available()


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)
    cpu_module().rmsnorm(x, weight, out, eps)
    return out


def fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """In place: ``residual += x``, then ``x = rmsnorm(residual)``."""
    cpu_module().fused_add_rmsnorm(x, residual, weight, eps)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty(*x.shape[:-1], x.shape[-1] // 2, dtype=x.dtype)
    cpu_module().silu_and_mul(x.reshape(-1, x.shape[-1]).contiguous(), out.view(-1, out.shape[-1]))
    return out


def apply_rope_with_cos_sin_cache_inplace(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, head_dim: int, cos_sin: torch.Tensor, is_neox: bool
) -> None:
    """``q``/``k`` ``[tokens, heads * head_dim]``, rotated in place ("rotate half": ``is_neox``)."""
    if not is_neox:
        raise NotImplementedError("only the rotate-half (neox) layout")
    cpu_module().rope(positions, q, k, cos_sin, head_dim)
