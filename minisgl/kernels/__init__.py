"""Fused kernels. Each has a pure-torch fallback that computes the same thing; the fused version
is used only where it exists: FlashInfer's CUDA kernels and our Triton kernels (``triton_kernels``) for
tensors on a GPU. ``MINISGL_FUSED_KERNELS=0`` turns them all off."""

from __future__ import annotations

import functools
import importlib.util

import torch

from minisgl.env import ENV


def _enabled(module: str) -> bool:
    return ENV.fused_kernels and importlib.util.find_spec(module) is not None


@functools.cache
def _flashinfer():
    if not _enabled("flashinfer"):
        return None
    import flashinfer

    return flashinfer


@functools.cache
def _triton():
    if not _enabled("triton"):
        return None
    from minisgl.kernels import triton_kernels

    return triton_kernels


def triton_ops(x: torch.Tensor):
    """``minisgl.kernels.triton_kernels`` when ``x`` is on a GPU and Triton is installed, else None."""
    return _triton() if x.is_cuda else None


def fused_ops(x: torch.Tensor):
    """FlashInfer's module when ``x`` can use its fused norm/rope/activation kernels, else None.
    Decode on a GPU is hundreds of tiny element-wise kernels; fusing them saves most of that time."""
    if not x.is_cuda or x.dtype not in (torch.float16, torch.bfloat16):
        return None
    return _flashinfer()
