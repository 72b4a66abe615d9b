"""Rotary position embedding. The math (inverse frequencies and the rotation) is registered by name
(``ROTARIES``, lab 01's seam); the module holds the cos/sin table and takes the fused kernels
(FlashInfer's rope, our Triton q/k norm + rope) only when it runs the engine's own math."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from minisgl.kernels import fused_ops, triton_ops
from minisgl.registry import Registry


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 frequency-dependent scaling (``rope_type == "llama3"``)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position: int


def rope_inv_freq(head_dim: int, base: float, scaling: RopeScaling | None = None) -> torch.Tensor:
    """Inverse frequencies ``base^(-2i/d)``; with Llama-3 scaling, long wavelengths are divided by
    ``factor``, short ones kept, and the band between interpolated smoothly."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None:
        return inv_freq
    wavelen = 2 * math.pi / inv_freq
    low_wavelen = scaling.original_max_position / scaling.low_freq_factor
    high_wavelen = scaling.original_max_position / scaling.high_freq_factor
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (scaling.original_max_position / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[tokens, heads, head_dim]`` in the "rotate half" layout (Llama, Qwen3): the
    pairs are ``(x[..., i], x[..., i + head_dim/2])``; ``cos``/``sin`` are ``[tokens, 1, head_dim/2]``."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


@dataclass(frozen=True)
class RotaryImpl:
    """The two functions of rotary embedding: ``inv_freq(head_dim, base, scaling)`` -> float32
    ``[head_dim/2]``, and ``rotate(x, cos, sin)`` as :func:`apply_rotary`."""

    inv_freq: Callable[[int, float, RopeScaling | None], torch.Tensor]
    rotate: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


ROTARIES: Registry[RotaryImpl] = Registry("rotary", {"default": RotaryImpl(rope_inv_freq, apply_rotary)})


class RotaryEmbedding(nn.Module):
    """``cos_sin`` is a float32 table ``[max_position, head_dim]`` = ``[cos | sin]``, indexed by position
    once per layer call; values are cast to the activation dtype before use, as HF does."""

    def __init__(self, head_dim: int, max_position: int, base: float, scaling: RopeScaling | None = None, impl=None):
        super().__init__()
        self.head_dim = head_dim
        self.impl: RotaryImpl = impl if impl is not None else ROTARIES.get("default")
        self.fusable = ROTARIES.is_default(self.impl)
        inv_freq = self.impl.inv_freq(head_dim, base, scaling)
        freqs = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]
        self.register_buffer("cos_sin", torch.cat([freqs.cos(), freqs.sin()], dim=-1), persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """``q``: ``[tokens, heads, head_dim]``, ``k``: ``[tokens, kv_heads, head_dim]``."""
        fi = fused_ops(q) if self.fusable else None
        if fi is not None:  # rotates q and k in place, reading the same float32 table
            # on the CPU (a few decode tokens) on copies: the caller's q and k stay as they were, even
            # when they are one tensor (a GPU step gets fresh ones from the qkv split: no copy there)
            copy = torch.clone if q.is_cpu else torch.Tensor.contiguous
            q, k = copy(q, memory_format=torch.contiguous_format), copy(k, memory_format=torch.contiguous_format)
            fi.apply_rope_with_cos_sin_cache_inplace(
                positions, q.view(len(q), -1), k.view(len(k), -1), q.shape[-1], self.cos_sin, is_neox=True
            )
            return q, k
        cos, sin = self.cos_sin[positions].to(q.dtype).unsqueeze(1).chunk(2, dim=-1)
        return self.impl.rotate(q, cos, sin), self.impl.rotate(k, cos, sin)

    def rotate_qkv(self, positions: torch.Tensor, qkv, heads: int, kv_heads: int, q_norm=None, k_norm=None):
        """q and k out of a fused projection ``[tokens, (heads + 2 * kv_heads) * head_dim]``, each
        normed per head first when ``q_norm``/``k_norm`` are given (Qwen3), then rotated, and v. Returns
        ``q [tokens, heads, head_dim]``, ``k`` and ``v [tokens, kv_heads, head_dim]``."""
        fused = self.fused_qk_norm_rope(positions, qkv, heads, kv_heads, q_norm, k_norm)
        if fused is not None:
            return fused
        d = self.head_dim
        q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
        q, k = q.view(-1, heads, d), k.view(-1, kv_heads, d)
        if q_norm is not None:
            q, k = q_norm(q), k_norm(k)
        return *self(positions, q, k), v.view(-1, kv_heads, d)

    def fused_qk_norm_rope(self, positions, qkv, heads: int, kv_heads: int, q_norm=None, k_norm=None, scales=()):
        """What :meth:`rotate_qkv` returns, from one Triton kernel on a GPU, or None where it cannot run
        (the CPU, a part that is not the engine's own). ``scales``: ``(row_scale, col_scale, dtype)`` when
        ``qkv`` is a product still to be scaled (a quantized layer's, ``minisgl/quant/``), applied as read."""
        own_norms = q_norm is None or (q_norm.fusable and k_norm.fusable)
        tri = triton_ops(qkv) if self.fusable and own_norms else None
        if tri is None or not tri.can_fuse(self.head_dim):
            return None
        qw, kw = (q_norm.weight, k_norm.weight) if q_norm is not None else (None, None)
        eps = q_norm.eps if q_norm is not None else 0.0
        return tri.qk_norm_rope(qkv, positions, self.cos_sin, heads, kv_heads, self.head_dim, qw, kw, eps, *scales)
