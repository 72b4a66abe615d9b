"""RMSNorm. The math is a registered function (``NORMS``, lab 01's seam); the module holds the
weight and picks FlashInfer's fused kernel only when it runs the engine's own function."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from minisgl.kernels import fused_ops
from minisgl.registry import Registry

NormFn = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
"""``norm(x [..., dim], weight [dim], eps) -> [..., dim]`` in ``x.dtype``; must not modify ``x``."""


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / rms(x) * weight`` over the last dim, computed in float32 like the HF reference and
    cast back to ``x.dtype`` before the weight multiply."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


NORMS: Registry[NormFn] = Registry("norm", {"default": rms_norm})


class RMSNorm(nn.Module):
    """With ``residual`` it first adds it (``x + residual`` becomes the new residual), the fused form
    a pre-norm decoder layer uses."""

    def __init__(self, dim: int, eps: float = 1e-6, impl: NormFn | None = None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.impl = impl if impl is not None else NORMS.get("default")
        self.fusable = NORMS.is_default(self.impl)  # a swapped-in norm always runs itself

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        fi = fused_ops(x) if self.fusable else None
        if fi is not None:  # one kernel instead of ~8 (the weight multiply happens in float32 there)
            if residual is None:
                shape = x.shape
                return fi.rmsnorm(x.reshape(-1, shape[-1]), self.weight, self.eps).view(shape)
            fi.fused_add_rmsnorm(x, residual, self.weight, self.eps)  # in place: residual += x; x = norm
            return x, residual
        if residual is None:
            return self.impl(x, self.weight, self.eps)
        x = x + residual
        return self.impl(x, self.weight, self.eps), x
