"""Fused kernels. Each has a pure-torch fallback that computes the same thing; the fused version
is used only where it exists (here: FlashInfer's CUDA kernels for half-precision tensors)."""

from __future__ import annotations

import functools
import importlib.util
import os

import torch


@functools.cache
def _flashinfer():
    if os.environ.get("MINISGL_FUSED_KERNELS", "1") == "0" or importlib.util.find_spec("flashinfer") is None:
        return None
    import flashinfer

    return flashinfer


def fused_ops(x: torch.Tensor):
    """FlashInfer's module when ``x`` can use its fused norm/rope/activation kernels, else None.
    Decode on a GPU is hundreds of tiny element-wise kernels; fusing them saves most of that time."""
    if not x.is_cuda or x.dtype not in (torch.float16, torch.bfloat16):
        return None
    return _flashinfer()
