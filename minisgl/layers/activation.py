"""The MLP's activation on a fused ``[gate | up]`` projection. Registered by name (``ACTIVATIONS``,
lab 01's seam); the engine's own function takes FlashInfer's fused kernel on a GPU."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from minisgl.kernels import fused_ops
from minisgl.registry import Registry

ActivationFn = Callable[[torch.Tensor], torch.Tensor]
"""``act(x [..., 2 * I]) -> [..., I]`` in ``x.dtype``."""


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU: ``silu(gate) * up``."""
    fi = fused_ops(x)
    if fi is not None:
        return fi.silu_and_mul(x)
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


ACTIVATIONS: Registry[ActivationFn] = Registry("activation", {"default": silu_and_mul})
