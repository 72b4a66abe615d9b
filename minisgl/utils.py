"""Small shared helpers."""

from __future__ import annotations

import contextlib

import torch

from minisgl.env import ENV

_NULL = contextlib.nullcontext()
_NVTX = torch.cuda.is_available() and ENV.nvtx


def nvtx_range(name: str):
    """An NVTX range (visible in Nsight Systems) on CUDA machines; a shared no-op elsewhere."""
    return torch.cuda.nvtx.range(name) if _NVTX else _NULL


def keep_freed_memory() -> None:
    """glibc: keep freed blocks of up to 32 MiB in the heap instead of returning them to the kernel. A CPU
    step allocates and frees the same large tensors every time (activations, [batch, vocab] logits); by
    default glibc hands blocks that large back with munmap, and the next step faults every page in again,
    zeroed (`benchmark.profile --dtype float32 --batch-size 44`: 1.93M page faults -> 1.13M, 43.4 -> 40.9 s
    of CPU time).
    Elsewhere (musl, macOS) a no-op."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
    mallopt(m_mmap_threshold, 32 << 20)  # glibc's largest allowed value (64-bit)
    mallopt(m_trim_threshold, 1 << 30)
