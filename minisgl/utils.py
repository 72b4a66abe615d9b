"""Small shared helpers."""

from __future__ import annotations

import contextlib
import os

import torch

_NULL = contextlib.nullcontext()
_NVTX = torch.cuda.is_available() and os.environ.get("MINISGL_NVTX", "1") != "0"


def nvtx_range(name: str):
    """An NVTX range (visible in Nsight Systems) on CUDA machines; a shared no-op elsewhere."""
    return torch.cuda.nvtx.range(name) if _NVTX else _NULL
