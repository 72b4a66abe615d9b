import torch
from torch import nn


class RMSNorm(nn.Module):
    """``x / rms(x) * weight``, computed in float32 like the HF reference, cast back before the
    weight multiply. With ``residual`` it first adds it (``x + residual`` becomes the new residual),
    the fused form a pre-norm decoder layer uses."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x
