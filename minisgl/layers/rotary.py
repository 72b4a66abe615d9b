from __future__ import annotations

import math

import torch
from torch import nn

from minisgl.kernels import fused_ops
from minisgl.models.config import RopeScaling


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


class RotaryEmbedding(nn.Module):
    """Rotary position embedding in the "rotate half" layout (Llama, Qwen3): the first and second
    halves of each head are the two coordinates of ``head_dim / 2`` rotating pairs.

    ``cos_sin`` is a float32 table ``[max_position, head_dim]`` = ``[cos | sin]``, indexed by position
    once per layer call; values are cast to the activation dtype before use, as HF does."""

    def __init__(self, head_dim: int, max_position: int, base: float, scaling: RopeScaling | None = None):
        super().__init__()
        inv_freq = rope_inv_freq(head_dim, base, scaling)
        freqs = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]
        self.register_buffer("cos_sin", torch.cat([freqs.cos(), freqs.sin()], dim=-1), persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """``q``: ``[tokens, heads, head_dim]``, ``k``: ``[tokens, kv_heads, head_dim]``."""
        fi = fused_ops(q)
        if fi is not None:  # rotates q and k in place, reading the same float32 table
            q, k = q.contiguous(), k.contiguous()
            fi.apply_rope_with_cos_sin_cache_inplace(
                positions, q.view(len(q), -1), k.view(len(k), -1), q.shape[-1], self.cos_sin, is_neox=True
            )
            return q, k
        cos, sin = self.cos_sin[positions].to(q.dtype).unsqueeze(1).chunk(2, dim=-1)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
