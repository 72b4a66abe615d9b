import torch
import torch.nn.functional as F

from minisgl.kernels import fused_ops


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU on a fused ``[gate | up]`` projection: ``silu(gate) * up``."""
    fi = fused_ops(x)
    if fi is not None:
        return fi.silu_and_mul(x)
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
