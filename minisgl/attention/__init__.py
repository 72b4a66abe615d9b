"""Attention backends, picked by name (``BACKENDS``): ``torch`` (reference, any device), ``fi``
(FlashInfer), ``fa3`` (FlashAttention-3 prefill through FlashInfer, Hopper; ``fa`` is mini-sglang's
name for it), ``triton`` (the project's own Triton kernels, lesson 16), ``"prefill,decode"`` pairs, and
``auto``. GPU backends are imported only when chosen."""

from __future__ import annotations

import importlib.util
import logging

import torch

from minisgl.attention.base import AttentionBackend
from minisgl.attention.hybrid import HybridBackend
from minisgl.attention.torch_backend import TorchBackend
from minisgl.kvcache.pool import KVPool
from minisgl.kvcache.table import ReqTable
from minisgl.registry import Registry

logger = logging.getLogger(__name__)

# name -> factory(pool, table, num_heads, head_dim), or "module:factory" (imported when chosen)
BACKENDS: Registry[type[AttentionBackend]] = Registry(
    "attention backend",
    {
        "torch": TorchBackend,
        "fi": "minisgl.attention.flashinfer_backend:FlashInferBackend",
        "fa3": "minisgl.attention.flashinfer_backend:FA3Backend",
        "triton": "minisgl.attention.triton_backend:TritonBackend",
    },
    aliases={"fa": "fa3", "flashinfer": "fi"},
)


def flashinfer_available() -> bool:
    return importlib.util.find_spec("flashinfer") is not None


def auto_runs_flashinfer(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``auto`` gives a model a FlashInfer backend: on a GPU with FlashInfer installed, in
    float16/bfloat16 (its kernels run in no other dtype). The page size's default follows it too."""
    return device.type == "cuda" and flashinfer_available() and dtype in (torch.float16, torch.bfloat16)


def resolve_backend_name(
    name: str, device: torch.device, quantized_kv: bool = False, dtype: torch.dtype = torch.bfloat16
) -> str:
    """``auto`` -> ``fa3,fi`` on Hopper with FlashInfer (``fi`` with a quantized KV cache, which FA3 does
    not read next to bf16 queries), ``fi`` on other GPUs with it, else ``torch``, which is also what a
    float32 model gets on a GPU (FlashInfer's kernels run in float16/bfloat16 only); aliases become
    their canonical names."""
    if name == "auto":
        if auto_runs_flashinfer(device, dtype):
            hopper = torch.cuda.get_device_capability(device)[0] == 9
            return "fa3,fi" if hopper and not quantized_kv else "fi"
        return "torch"
    return ",".join(BACKENDS.canonical(part) for part in name.split(","))


def _make(name: str, *args) -> AttentionBackend:
    if name not in BACKENDS:
        raise ValueError(
            f"unknown attention backend {name!r}; choose from {BACKENDS.names()}, a "
            "'prefill,decode' pair such as 'fa3,fi', or 'auto'"
        )
    try:
        factory = BACKENDS.get(name)
    except ImportError as e:
        raise ValueError(f"attention backend {name!r} needs flashinfer-python and a CUDA GPU ({e})") from e
    return factory(*args)


def create_backend(name: str, pool: KVPool, table: ReqTable, num_heads: int, head_dim: int) -> AttentionBackend:
    resolved = resolve_backend_name(name, table.page_table.device, pool.quantized, pool.compute_dtype)
    args = (pool, table, num_heads, head_dim)
    parts = resolved.split(",")
    if len(parts) == 1:
        backend = _make(parts[0], *args)
    elif len(parts) == 2:
        backend = HybridBackend(_make(parts[0], *args), _make(parts[1], *args))
    else:
        raise ValueError(f"attention backend {name!r}: give one name or a 'prefill,decode' pair")
    logger.info("attention backend: %s%s", backend.name, " (auto)" if name == "auto" else "")
    return backend


__all__ = ["AttentionBackend", "BACKENDS", "HybridBackend", "TorchBackend", "create_backend", "flashinfer_available"]
