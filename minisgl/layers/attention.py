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

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ctx = get_ctx()
        return ctx.attn_backend.forward(q, k, v, self.layer_id, ctx.batch)
