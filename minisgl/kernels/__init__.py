"""Fused kernels. Each has a pure-torch fallback that computes the same thing; the fused version
is used only where it exists: FlashInfer's CUDA kernels, our Triton kernels (``triton_kernels``) and our
CUDA K/V store through TVM FFI (``jit_store``) for tensors on a GPU; on the CPU, C++ through TVM FFI
for a decode step's few tokens (``cpu_fused``: norm, rope, activation; ``small_linear``).
``MINISGL_FUSED_KERNELS=0`` turns the fused ones off (``MINISGL_DISABLE_JIT=1`` every C++ kernel)."""

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
    """The fused norm/rope/activation kernels that can take ``x``, else None: FlashInfer's module on a
    GPU, ``cpu_fused`` (C++, same signatures) for a few tokens on the CPU. Decode is hundreds of tiny
    element-wise ops a step; fusing them saves most of that time."""
    if x.is_cpu and ENV.fused_kernels:
        from minisgl.kernels import cpu_fused

        return cpu_fused if cpu_fused.applies(x) else None
    if not x.is_cuda or x.dtype not in (torch.float16, torch.bfloat16):
        return None
    return _flashinfer()


def kv_store_fn(k: torch.Tensor, v: torch.Tensor, head_dim: int, cache_dtype: torch.dtype | None = None):
    """The fused K/V store for these rows, ``fn(k_slots, v_slots, loc, k, v)``, or None (torch's
    scatters). ``MINISGL_KV_STORE`` picks it; one that cannot run here falls back to the next of
    tvm_ffi, triton, torch. Both kernels need each row's heads contiguous (rows may be strided). Into a
    narrower cache (``cache_dtype``, a quantized pool) only the TVM FFI kernel stores, converting on the way."""
    if not k.is_cuda or not ENV.fused_kernels or ENV.kv_store == "torch":
        return None
    if any(t.stride(-1) != 1 or t.stride(-2) != head_dim for t in (k, v)):
        return None
    convert = cache_dtype is not None and cache_dtype != k.dtype
    if ENV.kv_store == "tvm_ffi":
        from minisgl.kernels import jit_store

        if jit_store.available() and (not convert or jit_store.converts(k.dtype, cache_dtype)):
            return jit_store.store_kv
    tri = _triton()
    return tri.store_kv if tri is not None and tri.can_fuse(head_dim) and not convert else None
