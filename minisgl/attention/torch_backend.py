"""The reference backend: plain PyTorch, any device. Each request's K/V is gathered from the
pool into a padded ``[batch, max_len, kv_heads, head_dim]`` tensor and attended with SDPA under
a mask that is causal and hides the padding::

    q rows (this pass)        k columns (whole sequence)
    req0: p=5,6,7      ->     0 1 2 3 4 5 6 7 | pad
    req1: p=3 (decode) ->     0 1 2 3 | pad ...

Correct and simple, but it copies K/V every layer; the FlashInfer backends read pages in place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minisgl.attention.base import AttentionBackend
from minisgl.core import Batch


@dataclass
class TorchMetadata:
    kv_slots: torch.Tensor  # [B, max_len] slot of each key position (padding: any valid slot)
    mask: torch.Tensor  # [B, 1, max_q, max_len] True = attend
    q_index: torch.Tensor | None  # [num_tokens] -> row of the padded [B * max_q] queries; None if max_q == 1
    max_q: int


class TorchBackend(AttentionBackend):
    name = "torch"

    def prepare_metadata(self, batch: Batch) -> None:
        device = self.page_table.device
        starts = torch.tensor(batch.starts, dtype=torch.int64)
        ends = torch.tensor(batch.ends, dtype=torch.int64)
        q_lens = ends - starts
        max_q, max_len = int(q_lens.max()), int(ends.max())
        rows = torch.tensor([r.table_idx for r in batch.reqs], dtype=torch.int64)
        starts, ends, rows = (t.to(device, non_blocking=True) for t in (starts, ends, rows))
        kv_slots = self.page_table[rows, :max_len].to(torch.int64)
        kpos = torch.arange(max_len, device=device)
        qpos = starts[:, None] + torch.arange(max_q, device=device)[None, :]  # [B, max_q]
        # padded query rows still see key 0, so no row of the softmax is empty (no NaN)
        mask = (kpos[None, None, :] <= qpos[:, :, None]) & (kpos[None, None, :] < ends[:, None, None])
        q_index = None
        if max_q > 1:
            b = torch.repeat_interleave(torch.arange(len(batch.reqs)), q_lens)
            offs = torch.arange(len(b)) - torch.repeat_interleave(torch.cumsum(q_lens, 0) - q_lens, q_lens)
            q_index = (b * max_q + offs).to(device, non_blocking=True)
        batch.attn_metadata = TorchMetadata(kv_slots, mask.unsqueeze(1), q_index, max_q)

    def forward(self, q, k, v, layer_id: int, batch: Batch) -> torch.Tensor:
        md: TorchMetadata = batch.attn_metadata
        self.pool.store(layer_id, batch.out_loc, k, v)
        kv = self.pool.buffer[layer_id].flatten(1, 2)[:, md.kv_slots]  # [2, B, L, kv_heads, D]: K and V at once
        keys, values = kv[0].transpose(1, 2), kv[1].transpose(1, 2)  # [B, kv_heads, L, D]
        bsz, heads, dim = md.kv_slots.shape[0], q.shape[1], q.shape[2]
        if md.q_index is None:
            return self._decode(q.view(bsz, heads, dim), keys, values, md.mask)
        qp = q.new_zeros(bsz * md.max_q, heads, dim)
        qp[md.q_index] = q
        qp = qp.view(bsz, md.max_q, heads, dim)
        out = F.scaled_dot_product_attention(
            qp.transpose(1, 2),
            keys,
            values,
            attn_mask=md.mask,
            scale=self.scale,
            enable_gqa=heads != keys.shape[1],
        )
        return out.transpose(1, 2).reshape(bsz * md.max_q, heads * dim)[md.q_index]

    def _decode(self, q, keys, values, mask) -> torch.Tensor:
        """One query per request: two small batched matmuls, the query heads of a KV group side by
        side (no K/V copy per query head). On CPU this beats SDPA's flash kernel, most in bf16."""
        bsz, heads, dim = q.shape
        kv_heads = keys.shape[1]
        qg = q.view(bsz, kv_heads, heads // kv_heads, dim)
        scores = (qg @ keys.transpose(-1, -2)).float() * self.scale  # [B, kv_heads, group, L]
        scores = scores.masked_fill(~mask, float("-inf"))
        out = scores.softmax(dim=-1).to(q.dtype) @ values  # [B, kv_heads, group, D]
        return out.reshape(bsz, heads * dim)
