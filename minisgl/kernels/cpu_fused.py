"""The element-wise steps of a decoder layer on the CPU as C++ (``csrc/cpu_fused.cc``, compiled on
first use through TVM FFI), with the call signatures of FlashInfer's fused kernels, so the layers take
them through ``minisgl.kernels.fused_ops`` as they take FlashInfer's on a GPU.

At a decode step's few tokens a layer is ~25 tiny torch ops whose dispatch costs more than their
arithmetic; at a prefill's thousands each torch op is a pass over memory of its own (RMSNorm alone is
six). Each function here is one pass, over all cores from 64 tokens on, and rounds where the torch
version rounds (in bfloat16 the same values up to the order of a sum or exp's last bit). On 8,064 tokens
of the embedded model, bf16: RMSNorm 2.8 ms against torch's 8-15, SwiGLU 5.3 against 9.5, rotary 1.7
against 4-6 (float32: 2.6 / 4.4, 16.9 / 40.6, 0.5 / 12.5).
"""

from __future__ import annotations

import torch

from minisgl.kernels.jit import available as available  # public here too (the tests ask it)
from minisgl.kernels.jit import kernels
from minisgl.kernels.small_linear import DTYPES, STREAM_ROWS

WIDE = ("avx512", "avx2")  # levels whose kernels beat torch's ops at every size (measured)


def applies(x: torch.Tensor) -> bool:
    """Whether these kernels take ``x`` (``[tokens, ...]``): on the CPU, float32 or bf16; past a few
    tokens only on the levels of ``WIDE`` (on the portable level torch's vectorised ops are faster)."""
    if not (x.is_cpu and x.dtype in DTYPES and x.dim() >= 2):
        return False
    k = kernels()
    return k.lib is not None and (x.shape[0] <= STREAM_ROWS or k.level in WIDE)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)
    kernels().lib.rmsnorm(x, weight, out, eps)
    return out


def fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """In place: ``residual += x``, then ``x = rmsnorm(residual)``."""
    kernels().lib.fused_add_rmsnorm(x, residual, weight, eps)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty(*x.shape[:-1], x.shape[-1] // 2, dtype=x.dtype)
    kernels().lib.silu_and_mul(x.reshape(-1, x.shape[-1]).contiguous(), out.view(-1, out.shape[-1]))
    return out


def apply_rope_with_cos_sin_cache_inplace(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, head_dim: int, cos_sin: torch.Tensor, is_neox: bool
) -> None:
    """``q``/``k`` ``[tokens, heads * head_dim]``, rotated in place ("rotate half": ``is_neox``)."""
    if not is_neox:
        raise NotImplementedError("only the rotate-half (neox) layout")
    kernels().lib.rope(positions, q, k, cos_sin, head_dim)
