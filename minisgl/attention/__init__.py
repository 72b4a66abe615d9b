"""Attention backends, picked by name: ``torch`` (reference, any device), ``fi`` (FlashInfer),
``fa3`` (FlashAttention-3 prefill through FlashInfer, Hopper), ``"prefill,decode"`` pairs, and
``auto``. GPU backends are imported only when chosen."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable

import torch

from minisgl.attention.base import AttentionBackend
from minisgl.attention.hybrid import HybridBackend
from minisgl.attention.torch_backend import TorchBackend

logger = logging.getLogger(__name__)

# name -> "module:factory" (imported lazily) or a factory(pool, page_table, num_heads, head_dim)
BACKENDS: dict[str, str | Callable[..., AttentionBackend]] = {
    "torch": TorchBackend,
    "fi": "minisgl.attention.flashinfer_backend:FlashInferBackend",
    "fa3": "minisgl.attention.flashinfer_backend:FA3Backend",
}


def flashinfer_available() -> bool:
    return importlib.util.find_spec("flashinfer") is not None


def resolve_backend_name(name: str, device: torch.device) -> str:
    """``auto`` -> ``fa3,fi`` on Hopper with FlashInfer, ``fi`` on other GPUs with it, else ``torch``."""
    if name != "auto":
        return name
    if device.type == "cuda" and flashinfer_available():
        return "fa3,fi" if torch.cuda.get_device_capability(device)[0] == 9 else "fi"
    return "torch"


def _make(name: str, *args) -> AttentionBackend:
    if name not in BACKENDS:
        raise ValueError(
            f"unknown attention backend {name!r}; choose from {sorted(BACKENDS)}, a "
            "'prefill,decode' pair such as 'fa3,fi', or 'auto'"
        )
    factory = BACKENDS[name]
    if isinstance(factory, str):
        module, attr = factory.split(":")
        try:
            factory = getattr(importlib.import_module(module), attr)
        except ImportError as e:
            raise ValueError(f"attention backend {name!r} needs flashinfer-python and a CUDA GPU ({e})") from e
    return factory(*args)


def create_backend(name: str, pool, page_table: torch.Tensor, num_heads: int, head_dim: int) -> AttentionBackend:
    resolved = resolve_backend_name(name, page_table.device)
    args = (pool, page_table, num_heads, head_dim)
    parts = resolved.split(",")
    if len(parts) == 1:
        backend = _make(parts[0], *args)
    elif len(parts) == 2:
        backend = HybridBackend(_make(parts[0], *args), _make(parts[1], *args))
    else:
        raise ValueError(f"attention backend {name!r}: give one name or a 'prefill,decode' pair")
    logger.info("attention backend: %s%s", backend.name, " (auto)" if name == "auto" else "")
    return backend


__all__ = ["AttentionBackend", "BACKENDS", "HybridBackend", "TorchBackend", "create_backend"]
