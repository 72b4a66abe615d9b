"""Lab 01 adapter: the five functions of ``lab01_decoder.py``."""

from __future__ import annotations

import torch

from autograder.impl import require

STEM = "lab01_decoder"


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return require(STEM, "rms_norm")(x, weight, eps)


def rope_inv_freq(head_dim: int, base: float, scaling=None) -> torch.Tensor:
    return require(STEM, "rope_inv_freq")(head_dim, base, scaling)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return require(STEM, "apply_rotary")(x, cos, sin)


def gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    return require(STEM, "gqa_attention")(q, k, v, scale)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    return require(STEM, "silu_and_mul")(x)
