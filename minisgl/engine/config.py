"""``EngineConfig``: every knob of the engine, shared by the offline API, the server and the CLI."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, fields
from typing import Any

import torch

# Nano-vLLM workload on an H200, one call, medians of 3, pages of 1 / 16 / 64 / 256 tokens: Qwen3-0.6B
# 5.66 / 5.69 / 5.44 / 5.56 s, Qwen3-14B 22.36 / 22.14 / 22.10 / 22.03 s (another call had 256 ahead of
# 64 by 1%: they tie). Prefix-cache hits come in whole pages, so a larger page loses up to a page of
# each hit; 64 tokens is little next to a chat's history, and a 256-token page would never share a
# shorter system prompt.
FLASHINFER_PAGE_SIZE = 64
PAGE_SIZE_HELP = f"tokens per KV page (default {FLASHINFER_PAGE_SIZE} where FlashInfer decodes, else 1)"


@dataclass
class EngineConfig:
    model: str | None = None  # HF folder (or hub id in the local cache); None = the embedded model
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    device: str = "auto"  # auto | cpu | cuda
    tp_size: int = 1
    page_size: int | None = None  # tokens per KV page; None = FLASHINFER_PAGE_SIZE where FlashInfer decodes, else 1
    num_pages: int | None = None  # KV pool size; None = from memory_ratio (GPU) or a CPU default
    memory_ratio: float = 0.9  # GPU: fraction of the memory free after loading weights given to KV
    max_running_requests: int = 256
    max_prefill_length: int | None = 8192  # tokens per prefill batch (chunked prefill); None = unlimited
    cache_type: str = "radix"  # radix | naive
    attention_backend: str = "auto"  # auto | torch | fi | fa3 | "prefill,decode"
    cuda_graph_max_bs: int | None = None  # None = chosen from free memory; 0 disables
    dummy_weight: bool = False
    max_seq_len: int | None = None  # cap on prompt + output tokens; None = the model's context
    overlap_scheduling: bool | None = None  # None = on for CUDA unless MINISGL_DISABLE_OVERLAP_SCHEDULING
    seed: int = 0  # seeds the seeds drawn for unseeded sampled requests
    debug_checks: bool = False  # check memory invariants after every step (slow)
    # internal: set by the TP launcher
    tp_rank: int = 0
    dist_init_method: str = ""

    def __post_init__(self) -> None:
        if self.page_size is None:
            self.page_size = self._default_page_size()
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        if self.tp_size < 1:
            raise ValueError(f"tp_size must be >= 1, got {self.tp_size}")
        if self.max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {self.max_running_requests}")
        if self.max_prefill_length is not None and self.max_prefill_length < 1:
            raise ValueError(f"max_prefill_length must be >= 1 (or None), got {self.max_prefill_length}")
        if self.num_pages is not None and self.num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {self.num_pages}")
        if not (0.0 < self.memory_ratio <= 1.0):
            raise ValueError(f"memory_ratio must be in (0, 1], got {self.memory_ratio}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda, got {self.device!r}")

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(kwargs) - known
        if unknown:
            raise TypeError(f"unknown engine argument(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**kwargs)

    @property
    def torch_device(self) -> torch.device:
        if self.device == "auto":
            kind = "cuda" if torch.cuda.is_available() else "cpu"
        else:
            kind = self.device
        if kind == "cuda":
            return torch.device("cuda", self.tp_rank % max(1, torch.cuda.device_count()))
        return torch.device(kind)

    def _default_page_size(self) -> int:
        """``FLASHINFER_PAGE_SIZE`` when FlashInfer runs decode: its kernels read a ragged batch's KV
        faster in larger pages. 1 for the torch backend, the course's CPU path, where a page is a token
        and the radix cache shares prefixes token by token."""
        from minisgl.attention import flashinfer_available

        decode = self.attention_backend.split(",")[-1]
        if decode == "auto":
            return FLASHINFER_PAGE_SIZE if self.torch_device.type == "cuda" and flashinfer_available() else 1
        return 1 if decode == "torch" else FLASHINFER_PAGE_SIZE

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype != "auto":
            return _DTYPES[self.dtype]
        return torch.bfloat16 if self.torch_device.type == "cuda" else default_cpu_dtype()

    @property
    def use_overlap(self) -> bool:
        if self.overlap_scheduling is not None:
            return self.overlap_scheduling
        if os.environ.get("MINISGL_DISABLE_OVERLAP_SCHEDULING", "0") not in ("", "0"):
            return False
        return self.torch_device.type == "cuda"


_DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@functools.cache
def default_cpu_dtype() -> torch.dtype:
    """bfloat16 on CPUs with native bfloat16 arithmetic (AVX512-BF16, AMX), where its matmuls
    are several times faster than float32's (measured: 2.4x on an AVX512-BF16 EPYC, and half the
    bytes of weights and KV to read per decode step); float32 elsewhere, where bfloat16 is emulated
    and slow. Parity tests against HF pin ``dtype="float32"``."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        flags = []
    return torch.bfloat16 if {"avx512_bf16", "amx_bf16"} & set(flags) else torch.float32
