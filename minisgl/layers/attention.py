import torch
from torch import nn

from minisgl.attention.context import get_ctx


class AttentionLayer(nn.Module):
    """Hands q/k/v of one layer to the attention backend of the current forward pass, which
    stores k/v in the KV pool and attends over the cached sequence of each request."""

    def __init__(self, layer_id: int, num_heads: int, num_kv_heads: int, head_dim: int):
        super().__init__()
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim**-0.5

    def kv_destination(self):
        """Where this pass's k and v may be written by the kernel that makes them (the q/k norm + rope
        kernel), ``(k_slots, v_slots, loc)``; None when the backend stores them itself."""
        ctx = get_ctx()
        return ctx.attn_backend.kv_destination(self.layer_id, ctx.batch)

    def forward(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None) -> torch.Tensor:
        """``k`` and ``v`` None: already in the pool at ``kv_destination()``."""
        ctx = get_ctx()
        return ctx.attn_backend.forward(q, k, v, self.layer_id, ctx.batch)
