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
