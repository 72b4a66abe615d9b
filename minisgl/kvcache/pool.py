"""The KV pool: K and V of every layer for a fixed number of token slots.

Layout (FlashInfer's paged "NHD")::

    buffer[layer, 0 (K) | 1 (V), page, offset_in_page, kv_head, head_dim]
    slot index = page * page_size + offset_in_page

Pages ``[0, num_pages)`` are handed out by the allocator; one extra page at the end is scratch that
padded (dummy) requests of a CUDA-graph batch write into, so they never touch real data.

The pool may store K/V in a narrower dtype than the model computes in (``--kv-cache-dtype fp8_e4m3``):
``dtype`` is the storage, ``compute_dtype`` what the new K/V arrive in and attention reads them back
as. FP8 values are stored with a per-tensor scale of 1: cast after clamping to the format's range
(+-448), since a cast of a larger value gives NaN, not the largest value.
"""

from __future__ import annotations

import torch

from minisgl.kernels import kv_store_fn


class KVPool:
    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        compute_dtype: torch.dtype | None = None,
    ):
        if num_pages <= 0 or page_size <= 0:
            raise ValueError(f"the KV pool needs num_pages > 0 and page_size > 0, got {num_pages}, {page_size}")
        self.num_layers, self.num_pages, self.page_size = num_layers, num_pages, page_size
        self.num_kv_heads, self.head_dim, self.dtype = num_kv_heads, head_dim, dtype
        self.compute_dtype = compute_dtype or dtype
        self.quantized = dtype.itemsize == 1
        self.buffer = torch.zeros(
            num_layers, 2, num_pages + 1, page_size, num_kv_heads, head_dim, dtype=dtype, device=device
        )
        self.scratch_slot = num_pages * page_size

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return num_layers * 2 * num_kv_heads * head_dim * dtype.itemsize

    def k_cache(self, layer: int) -> torch.Tensor:
        """``[num_pages + 1, page_size, kv_heads, head_dim]``"""
        return self.buffer[layer, 0]

    def v_cache(self, layer: int) -> torch.Tensor:
        return self.buffer[layer, 1]

    def k_slots(self, layer: int) -> torch.Tensor:
        """The same memory as ``[num_slots + page_size, kv_heads, head_dim]``, indexed by slot."""
        return self.buffer[layer, 0].flatten(0, 1)

    def v_slots(self, layer: int) -> torch.Tensor:
        return self.buffer[layer, 1].flatten(0, 1)

    def store(self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write the new tokens' K/V (``[n, kv_heads, head_dim]``) into slots ``loc``."""
        fused = kv_store_fn(k, v, self.head_dim, self.dtype)
        if fused is not None:  # one kernel, not two (and an FP8 pool's quantization inside it)
            fused(self.k_slots(layer), self.v_slots(layer), loc, k, v)
            return
        if self.quantized:
            k, v = self.quantize(k), self.quantize(v)
        self.k_slots(layer)[loc] = k
        self.v_slots(layer)[loc] = v

    def quantize(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` in the storage dtype (FP8: clamped to its range first)."""
        limit = torch.finfo(self.dtype).max
        return x.clamp(-limit, limit).to(self.dtype)
