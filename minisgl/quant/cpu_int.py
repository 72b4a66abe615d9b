"""Weight-only integer formats on the CPU (``--quantization int8|int4``): GGUF's Q8_0 and Q4_1 blocks.

A weight row is cut into blocks of 32; each block keeps its own fp16 scale (and, Q4_1, minimum):

========  ===============================  =========================================================
format    stored (per weight row)          value
========  ===============================  =========================================================
``int8``  Q8_0: ``qs`` int8 ``[K]``,       ``w = d * q``; ``d = fp16(max|w| / 127)``,
          ``d`` fp16 ``[K/32]``            ``q = round(w / d)`` clamped to [-127, 127]
``int4``  Q4_1: ``qs`` uint8 ``[K/2]``,    ``w = d * q + m``; ``d = fp16((max - min) / 15)``,
          ``(d, m)`` fp16 ``[K/32, 2]``    ``m = fp16(min)``, ``q = round((w - m) / d)`` clamped to [0, 15]
========  ===============================  =========================================================

``round`` is round-half-to-even (``torch.round``), computed in float32 with the fp16-rounded ``d`` and
``m``; a block whose ``d`` is 0 stores ``q = 0``. Q4_1's 16 bytes per block hold element ``j`` in the
low nibble of byte ``j`` and element ``j + 16`` in its high nibble, as GGUF packs them, so a GGUF
tensor's blocks are these bytes and scales as they are (split into ``qs`` and scales).

:class:`QuantLinear` replaces the engine's column- and row-parallel layers (the embedding and the LM
head stay in the model's dtype). Up to ``ROW_LIMIT`` rows (decode steps) its weight is de-quantized
inside the C++ kernel (``kernels/csrc/quant_linear.h``; the C++ decode layer calls the same kernel
through :meth:`QuantLinear.cpu_weights`); past them (prefill), ``dequantize`` writes the weight in the
input's dtype, ``CHUNK`` elements at a time, and the dense product runs on that transient copy (the
product's arithmetic dwarfs one pass over the weight), so nothing but the quantized bytes stays resident.
Without the C++ library (``MINISGL_DISABLE_JIT=1``) the same steps run in torch.
"""

from __future__ import annotations

import ctypes
import gc

import torch
from torch import nn

from minisgl.distributed import all_reduce, get_tp_info
from minisgl.kernels.jit import kernels
from minisgl.kernels.small_linear import DTYPES, ROW_LIMIT, linear
from minisgl.layers.linear import ColumnParallelLinear, RowParallelLinear

BLOCK = 32
CHUNK = 1 << 22  # weight elements de-quantized at a time for a many-row product


def quantize_q8_0(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` [N, K] (K % 32 == 0) as Q8_0: ``(qs int8 [N, K], d float16 [N, K/32])``."""
    b = w.float().reshape(w.shape[0], -1, BLOCK)
    d = (b.abs().amax(-1) / 127).half()
    df = d.float().unsqueeze(-1)
    q = torch.where(df > 0, torch.round(b / torch.where(df > 0, df, 1)), 0).clamp(-127, 127)
    return q.to(torch.int8).reshape(w.shape), d


def quantize_q4_1(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` [N, K] (K % 32 == 0) as Q4_1: ``(qs uint8 [N, K/2], dm float16 [N, K/32, 2])``."""
    b = w.float().reshape(w.shape[0], -1, BLOCK)
    lo, hi = b.amin(-1), b.amax(-1)
    d, m = ((hi - lo) / 15).half(), lo.half()
    df, mf = d.float().unsqueeze(-1), m.float().unsqueeze(-1)
    q = torch.where(df > 0, torch.round((b - mf) / torch.where(df > 0, df, 1)), 0).clamp(0, 15).to(torch.uint8)
    packed = q[..., :16] | (q[..., 16:] << 4)  # byte j: element j low, element j + 16 high
    return packed.reshape(w.shape[0], -1), torch.stack([d, m], -1)


def dequantize(qs: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The reference de-quantizer: the float32 weight [N, K] of Q8_0 (``qs`` int8) or Q4_1 (uint8)."""
    n = qs.shape[0]
    if qs.dtype == torch.int8:
        return (scales.float().unsqueeze(-1) * qs.reshape(n, -1, BLOCK).float()).reshape(n, -1)
    b = qs.reshape(n, -1, BLOCK // 2)
    q = torch.cat([b & 15, b >> 4], -1).float()
    d, m = scales.float().reshape(n, -1, 2).unbind(-1)
    return (d.unsqueeze(-1) * q + m.unsqueeze(-1)).reshape(n, -1)


QUANTIZERS = {"int8": quantize_q8_0, "int4": quantize_q4_1}


class QuantLinear(nn.Module):
    """A column- or row-parallel layer with its weight in Q8_0 or Q4_1 (made from the loaded layer it
    replaces); ``reduce``: a row-parallel layer over several ranks."""

    def __init__(self, layer: nn.Module, fmt: str, blocks: tuple[torch.Tensor, torch.Tensor] | None = None):
        super().__init__()
        w = layer.weight.data  # blocks: (qs, scales) already made (a GGUF's), else quantized from w
        self.out_features, self.in_features = w.shape
        qs, scales = QUANTIZERS[fmt](w) if blocks is None else blocks
        self.qs = nn.Parameter(qs, requires_grad=False)
        self.scales = nn.Parameter(scales, requires_grad=False)
        self.bias = layer.bias
        self.reduce = isinstance(layer, RowParallelLinear) and get_tp_info().size > 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        lib = kernels().lib
        if lib is not None and rows.shape[0] <= ROW_LIMIT and x.dtype in DTYPES and x.is_cpu:
            y = torch.empty(rows.shape[0], self.out_features, dtype=x.dtype)
            lib.quant_linear(rows.contiguous(), self.qs, self.scales, y, torch.get_num_threads())
        else:
            step = max(1, CHUNK // self.in_features)
            parts = [linear(rows, self.weight_rows(n, n + step, x.dtype)) for n in range(0, self.out_features, step)]
            y = parts[0] if len(parts) == 1 else torch.cat(parts, -1)
        if self.reduce:
            y = all_reduce(y)
        y = y if self.bias is None else y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def cpu_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """What the C++ decode layer multiplies by (``models/cpu_decode.py``): the blocks and their scales."""
        return self.qs, self.scales

    def weight_rows(self, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
        """Rows ``start:stop`` of the de-quantized weight, in ``dtype`` (a transient copy)."""
        qs, scales = self.qs[start:stop], self.scales[start:stop]
        lib = kernels().lib
        if lib is None or dtype not in DTYPES or not qs.is_cpu:
            return dequantize(qs, scales).to(dtype)
        w = torch.empty(qs.shape[0], self.in_features, dtype=dtype)
        lib.dequantize(qs, scales, w, torch.get_num_threads())
        return w


def quantize_linears(model: nn.Module, fmt: str) -> tuple[int, int]:
    """Replace every column- and row-parallel layer whose input width is a multiple of 32 by its
    :class:`QuantLinear`; returns (layers replaced, layers left in the model's dtype)."""
    found = [(n, m) for n, m in model.named_modules() if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]
    done = [(n, m) for n, m in found if m.weight.shape[1] % BLOCK == 0]
    for name, m in done:
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr, QuantLinear(m, fmt))
    return len(done), len(found) - len(done)


def _apply(model: nn.Module, fmt: str) -> str:
    return _report(model, fmt, quantize_linears(model, fmt)[1])


def _report(model: nn.Module, fmt: str, left: int) -> str:
    gc.collect()  # a replaced layer is a cycle (weight -> weight_loader -> layer): free its weight now
    try:  # and hand the freed pages back (glibc keeps freed blocks in the heap: minisgl.utils)
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    n = len(layers)
    size = sum(p.numel() * p.element_size() for m in layers for p in (m.qs, m.scales)) / 2**20
    return f"{n} linear layers in {fmt} ({size:.1f} MiB), {left} left as they were (width not a multiple of 32)"


def gguf_q4_1(raw: torch.Tensor, heads: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A GGUF Q4_1 tensor's bytes ``[N, K/32 * 20]`` (per block: fp16 d, fp16 m, 16 bytes) as ``(qs, dm)``;
    ``heads``: undo llama.cpp's reordering of q/k rows for its rotary (rows in pairs, per head)."""
    n = raw.shape[0]
    b = raw.reshape(n, -1, 20)
    qs, dm = b[..., 4:].reshape(n, -1), b[..., :4].contiguous().view(torch.float16).reshape(n, -1, 2)
    if heads:
        qs, dm = (t.reshape(heads, -1, 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape) for t in (qs, dm))
    return qs.contiguous(), dm.contiguous()


def apply_auto(model: nn.Module) -> str:
    """``--quantization auto``: the embedded model's linear layers keep its GGUF's own Q4_1 blocks (no
    de-quantize / re-quantize round trip); refused for other weights (checked: the blocks must
    de-quantize to the weights loaded)."""
    from gguf import GGUFReader

    from minisgl.models.embedded import gguf_path

    tensors = {t.name: torch.from_numpy(t.data.copy()) for t in GGUFReader(str(gguf_path())).tensors}
    for i, block in enumerate(model.model.layers):
        attn, mlp = block.self_attn, block.mlp
        raw = lambda name, heads=0, i=i: gguf_q4_1(tensors[f"blk.{i}.{name}.weight"], heads)  # noqa: E731
        parts = {
            "qkv_proj": (attn, [raw("attn_q", attn.num_heads), raw("attn_k", attn.num_kv_heads), raw("attn_v")]),
            "o_proj": (attn, [raw("attn_output")]),
            "gate_up_proj": (mlp, [raw("ffn_gate"), raw("ffn_up")]),
            "down_proj": (mlp, [raw("ffn_down")]),
        }
        for attr, (owner, blocks) in parts.items():
            layer = getattr(owner, attr)
            qs, dm = torch.cat([q for q, _ in blocks]), torch.cat([d for _, d in blocks])
            if not torch.equal(dequantize(qs, dm).to(layer.weight.dtype), layer.weight.data):
                raise ValueError(f"quantization auto: layer {i} {attr} is not the embedded model's GGUF weight")
            setattr(owner, attr, QuantLinear(layer, "int4", (qs, dm)))
    return _report(model, "the GGUF's own Q4_1", 0)


def apply_int8(model: nn.Module) -> str:
    """``--quantization int8``: the linear layers in Q8_0."""
    return _apply(model, "int8")


def apply_int4(model: nn.Module) -> str:
    """``--quantization int4``: the linear layers in Q4_1."""
    return _apply(model, "int4")
