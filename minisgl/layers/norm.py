import torch
from torch import nn

from minisgl.kernels import fused_ops


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
        fi = fused_ops(x)
        if fi is not None:  # one kernel instead of ~8 (the weight multiply happens in float32 there)
            if residual is None:
                shape = x.shape
                return fi.rmsnorm(x.reshape(-1, shape[-1]), self.weight, self.eps).view(shape)
            fi.fused_add_rmsnorm(x, residual, self.weight, self.eps)  # in place: residual += x; x = norm
            return x, residual
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x
