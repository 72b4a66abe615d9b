"""The reference backend: plain PyTorch, any device. A prefill attends request by request with SDPA:
a fresh prompt over its own new K/V (causal), a request after a cached prefix over its K/V gathered
from the pool under a mask that is causal from its start::

    q rows (this pass)        k columns (whole sequence)
    req0: p=5,6,7      ->     0 1 2 3 4 5 6 7 | pad
    req1: p=3 (decode) ->     0 1 2 3 | pad ...

(The metadata keeps that mask padded to the batch's longest request, ``[B, 1, max_q, max_len]``, as
one SDPA call over the padded batch would need it; lesson 04 reads it. On a CPU the padded call was
2x slower than one call per request: its masked kernel does the padding's work too.)

Decode batches (one query per request) skip the gather: on a CPU a C++ kernel
(``minisgl/kernels``) reads K/V rows in place; elsewhere the same math runs in torch (and reads an
quantized pool, which the kernel does not). The FlashInfer backends read pages in place for both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minisgl.attention.base import AttentionBackend
from minisgl.core import Batch
from minisgl.kernels.jit import kernels
from minisgl.kernels.paged_attention import paged_decode_attention, paged_decode_attention_torch


@dataclass
class TorchMetadata:
    kv_slots: torch.Tensor  # [B, max_len] int64 slot of each key position (padding: any valid slot)
    seq_lens: torch.Tensor  # [B] int32 keys each request attends to
    mask: torch.Tensor | None  # [B, 1, max_q, max_len] True = attend (prefill only)
    q_index: torch.Tensor | None  # [num_tokens] -> row of the padded [B * max_q] queries (prefill only)
    max_q: int
    spans: list[tuple[int, int, int]] | None = None  # per request (first row in q, new tokens, start): prefill


class TorchBackend(AttentionBackend):
    name = "torch"

    def prepare_metadata(self, batch: Batch) -> None:
        device = self.page_table.device
        starts = torch.tensor(batch.starts, dtype=torch.int64)
        ends = torch.tensor(batch.ends, dtype=torch.int64)
        q_lens = ends - starts
        max_q, max_len = int(q_lens.max()), int(ends.max())
        rows = torch.tensor([r.table_idx for r in batch.reqs], dtype=torch.int64)
        seq_lens = ends.to(device=device, dtype=torch.int32, non_blocking=True)
        rows = rows.to(device, non_blocking=True)
        kv_slots = self.page_table[rows, :max_len].to(torch.int64)
        mask = q_index = None
        if max_q > 1:
            starts, ends = starts.to(device, non_blocking=True), ends.to(device, non_blocking=True)
            kpos = torch.arange(max_len, device=device)
            qpos = starts[:, None] + torch.arange(max_q, device=device)[None, :]  # [B, max_q]
            # padded query rows still see key 0, so no row of the softmax is empty (no NaN)
            mask = ((kpos[None, None, :] <= qpos[:, :, None]) & (kpos[None, None, :] < ends[:, None, None])).unsqueeze(
                1
            )
            b = torch.repeat_interleave(torch.arange(len(batch.reqs)), q_lens)
            offs = torch.arange(len(b)) - torch.repeat_interleave(torch.cumsum(q_lens, 0) - q_lens, q_lens)
            q_index = (b * max_q + offs).to(device, non_blocking=True)
            rows = [0, *torch.cumsum(q_lens, 0).tolist()]
            spans = [(rows[i], rows[i + 1] - rows[i], s) for i, s in enumerate(batch.starts)]
        batch.attn_metadata = TorchMetadata(kv_slots, seq_lens, mask, q_index, max_q, spans if max_q > 1 else None)

    def forward(self, q, k, v, layer_id: int, batch: Batch) -> torch.Tensor:
        md: TorchMetadata = batch.attn_metadata
        self.pool.store(layer_id, batch.out_loc, k, v)
        q = self.pool.scale_queries(layer_id, q)  # a quantized pool's per-head scales (KVPool); else q itself
        out = self._attend(q, k, v, layer_id, md)
        return self.pool.scale_output(layer_id, out)

    def _attend(self, q, k, v, layer_id: int, md: TorchMetadata) -> torch.Tensor:
        bsz, heads, dim = md.kv_slots.shape[0], q.shape[1], q.shape[2]
        if md.q_index is None:  # decode: one query per request, K/V read where they lie
            kernel = q.is_cpu and not self.pool.quantized and kernels().lib is not None
            decode = paged_decode_attention if kernel else paged_decode_attention_torch
            out = decode(
                q.view(bsz, heads, dim),
                self.pool.k_slots(layer_id),
                self.pool.v_slots(layer_id),
                md.kv_slots,
                md.seq_lens,
                self.scale,
            )
            return out.view(bsz, heads * dim)
        outs = []
        for i, (row, n, start) in enumerate(md.spans):
            qi = q[row : row + n].transpose(0, 1).unsqueeze(0)  # [1, heads, n, D]
            if start == 0 and not self.pool.quantized:  # a fresh prompt: its keys are this pass's
                ki, vi, mask = k[row : row + n], v[row : row + n], None
            else:  # after a cached prefix (or a quantized pool: read what the pool stores)
                end = start + n
                slots = md.kv_slots[i, :end]
                ki = self.pool.k_slots(layer_id)[slots].to(q.dtype)
                vi = self.pool.v_slots(layer_id)[slots].to(q.dtype)
                # 4-D: given a 3-D mask, torch's CPU SDPA leaves its flash kernel for the math path
                # (3x slower for 512 queries over 7,000 keys, and not bit-equal to the fresh-prompt path)
                mask = md.mask[i : i + 1, :, :n, :end]
            out = F.scaled_dot_product_attention(
                qi,
                ki.transpose(0, 1).unsqueeze(0),
                vi.transpose(0, 1).unsqueeze(0),
                attn_mask=mask,
                is_causal=mask is None,
                scale=self.scale,
                enable_gqa=heads != ki.shape[1],
            )
            outs.append(out[0].transpose(0, 1).reshape(n, heads * dim))
        return torch.cat(outs) if len(outs) > 1 else outs[0]
