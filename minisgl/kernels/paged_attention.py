"""CPU paged decode attention: a C++ kernel compiled on first use through TVM FFI
(``csrc/paged_decode.cc``), with the pure-torch version it must agree with.

Why a kernel: in PyTorch, attention over paged KV first gathers every request's K and V into a
dense tensor, in every layer, at every step; on a CPU that copy costs more than the attention.
The kernel reads K/V rows in place through the slot list instead.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minisgl.kernels.jit import available as available  # its public name here (lessons 04 and 13 call it)
from minisgl.kernels.jit import cpu_module


def paged_decode_attention(q, k_pool, v_pool, slots, lens, scale: float) -> torch.Tensor:
    """``q`` ``[B, H, D]``; ``k_pool``/``v_pool`` ``[S, Hkv, D]``; ``slots`` ``[B, Lmax]`` int64;
    ``lens`` ``[B]`` int32. Returns ``[B, H, D]`` (see the C++ source for the contract)."""
    out = torch.empty_like(q)
    cpu_module().paged_decode_attention(
        q.contiguous(), k_pool, v_pool, slots, lens, out, scale, torch.get_num_threads()
    )
    return out


def paged_decode_attention_torch(q, k_pool, v_pool, slots, lens, scale: float) -> torch.Tensor:
    """The reference: gather each request's K/V, mask the padding, softmax in float32."""
    bsz, heads, dim = q.shape
    kv_heads = k_pool.shape[1]
    # [B, Hkv, L, D], in q's dtype (a pool may store them narrower: FP8)
    keys, values = k_pool[slots].to(q.dtype).transpose(1, 2), v_pool[slots].to(q.dtype).transpose(1, 2)
    qg = q.view(bsz, kv_heads, heads // kv_heads, dim)
    scores = (qg @ keys.transpose(-1, -2)).float() * scale
    mask = torch.arange(slots.shape[1], device=q.device)[None, :] < lens[:, None]
    scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    return (F.softmax(scores, dim=-1).to(q.dtype) @ values).reshape(bsz, heads, dim)
