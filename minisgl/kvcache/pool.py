"""The KV pool: K and V of every layer for a fixed number of token slots.

Layout (FlashInfer's paged "NHD")::

    buffer[layer, 0 (K) | 1 (V), page, offset_in_page, kv_head, head_dim]
    slot index = page * page_size + offset_in_page

Pages ``[0, num_pages)`` are handed out by the allocator; one extra page at the end is scratch that
padded (dummy) requests of a CUDA-graph batch write into, so they never touch real data.

The pool may store K/V in a narrower dtype than the model computes in (``--kv-cache-dtype fp8_e4m3``):
``dtype`` is the storage, ``compute_dtype`` what the new K/V arrive in and attention reads them back
as. FP8 values are stored divided by a scale per layer and KV head (``k_scale``, ``v_scale``:
``[num_layers, kv_heads]``), then clamped to the format's range (+-448: a cast of a larger value gives
NaN, not the largest value). With a scale of 1, values below 2^-6 (FP8's smallest normal) lose bits
and values past 448 saturate; ``minisgl/quant/kv_calibrate.py`` sets the scales at load from the
largest |K| and |V| each head produced on a real text.

Every scale is a power of two, so dividing by it and multiplying back are exact in any float format:
attention never dequantizes the pool. Scores are linear in each key and the output in each value,
so a backend multiplies the queries of a KV head's group by its K scale before attending
(``scale_queries``) and the output by its V scale after (``scale_output``): two element-wise
kernels a layer, the same numbers as attending over dequantized K/V.
"""

from __future__ import annotations

import torch

from minisgl.kernels import kv_store_fn
from minisgl.process import zeros_not_forked


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
        # a fork of the scheduler (a constraint's trial compile) copies no page table of it
        self.buffer = zeros_not_forked(
            (num_layers, 2, num_pages + 1, page_size, num_kv_heads, head_dim), dtype=dtype, device=device
        )
        self.scratch_slot = num_pages * page_size
        # float32 for the store kernels, compute_dtype copies for attention (equal: powers of two)
        self.k_scale = torch.ones(num_layers, num_kv_heads, dtype=torch.float32, device=device)
        self.v_scale = torch.ones_like(self.k_scale)
        self._k_mul, self._v_mul = self.k_scale.to(self.compute_dtype), self.v_scale.to(self.compute_dtype)
        self.calibrating = False  # store() first sets each layer's scales from the K/V it is given

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
        if self.calibrating and self.quantized:
            self.set_scales(layer, head_scales(k, self.dtype), head_scales(v, self.dtype))
        fused = kv_store_fn(k, v, self.head_dim, self.dtype)
        if fused is not None:  # one kernel, not two (and an FP8 pool's quantization inside it)
            scales = (self.k_scale[layer], self.v_scale[layer]) if self.quantized else ()
            fused(self.k_slots(layer), self.v_slots(layer), loc, k, v, *scales)
            return
        if self.quantized:
            k, v = self.quantize(k, self.k_scale[layer]), self.quantize(v, self.v_scale[layer])
        self.k_slots(layer)[loc] = k
        self.v_slots(layer)[loc] = v

    def quantize(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """``x`` (``[n, kv_heads, head_dim]``) in the storage dtype: divided by each head's ``scale``
        (float32 ``[kv_heads]``; exact, a power of two) and clamped to the format's range first."""
        limit = torch.finfo(self.dtype).max
        return (x.float() / scale[:, None]).clamp(-limit, limit).to(self.dtype)

    def set_scales(self, layer: int, k_scale: torch.Tensor, v_scale: torch.Tensor) -> None:
        """This layer's per-head scales (float32 ``[kv_heads]``, powers of two); only while nothing is
        stored in the layer yet (the calibration pass), since stored values keep the old ones."""
        self.k_scale[layer], self.v_scale[layer] = k_scale, v_scale
        self._k_mul[layer], self._v_mul[layer] = k_scale, v_scale

    def scale_queries(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """``q`` (``[n, heads, head_dim]``) with each KV head's group of query heads times that head's
        K scale: their scores over the stored keys are then those over the real ones."""
        if not self.quantized:
            return q
        n, heads, dim = q.shape
        return (q.view(n, self.num_kv_heads, heads // self.num_kv_heads, dim) * self._k_mul[layer][:, None, None]).view(
            n, heads, dim
        )

    def scale_output(self, layer: int, out: torch.Tensor) -> torch.Tensor:
        """Attention's output (``[n, heads * head_dim]``, heads grouped by KV head) times each group's V
        scale."""
        if not self.quantized:
            return out
        n = out.shape[0]
        return (out.view(n, self.num_kv_heads, -1) * self._v_mul[layer][:, None]).view(n, -1)


def head_scales(x: torch.Tensor, dtype: torch.dtype, headroom: float = 1.0) -> torch.Tensor:
    """Per-head scales for storing ``x`` (``[n, kv_heads, head_dim]``) in ``dtype``: the smallest power
    of two ``s`` with ``headroom * max|x| / s <= dtype's max`` (1 for a head that is all zeros)."""
    amax = x.detach().abs().amax(dim=(0, 2)).float() * headroom
    s = torch.exp2(torch.ceil(torch.log2(amax / torch.finfo(dtype).max)))
    return torch.where(amax > 0, s, torch.ones_like(s))
