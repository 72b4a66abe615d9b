"""Column- and row-parallel linear layers (Megatron-style).

A column-parallel layer splits its *output* features across ranks and needs no communication; a
row-parallel layer splits its *input* features and sums partial results with an all-reduce. A
decoder block pairs them: ``qkv`` (column) -> attention -> ``o_proj`` (row), and ``gate_up``
(column) -> SwiGLU -> ``down`` (row): one all-reduce per pair.

Each parameter carries a ``weight_loader(param, loaded, shard_id)`` that copies this rank's slice of
a checkpoint tensor; ``loaded`` is a tensor or a lazy safetensors slice, sliced before reading.

FP8 weights (``--quantization fp8``, :func:`quantize_fp8`): after loading, each layer's weight becomes
float8_e4m3fn with one scale per output row (its largest magnitude / 448), and each input row is
quantized the same way when it arrives (one scale per token): W8A8. On a Hopper GPU the product is
one ``torch._scaled_mm`` (FP8 tensor cores, float32 accumulation); elsewhere the same quantized values
are multiplied in the model's dtype (the weight's rounded copy kept beside the FP8 one), so the CPU
measures the same rounding the GPU does.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.distributed import all_reduce, get_tp_info
from minisgl.kernels import fp8_quant_fn
from minisgl.kernels.small_linear import linear


def shape_of(loaded: Any) -> tuple[int, ...]:
    return tuple(loaded.get_shape()) if hasattr(loaded, "get_shape") else tuple(loaded.shape)


def load_full(param: torch.Tensor, loaded: Any, shard_id: Any = None) -> None:
    """Loader of a replicated parameter: every rank reads the whole tensor."""
    t = loaded[:]
    if tuple(t.shape) != tuple(param.shape):
        raise ValueError(f"checkpoint shape {tuple(t.shape)} != parameter shape {tuple(param.shape)}")
    param.data.copy_(t)


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max


def fp8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (2-D) as FP8 with one float32 scale per row: ``x ~= q * scale``."""
    scale = (x.abs().amax(dim=-1, keepdim=True).float() / FP8_MAX).clamp(min=1e-12)
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


# FP8 GEMM on Hopper, by the number of rows (benchmark/fp8_linear.py, one H200, Qwen3-14B's layers): up to
# this many, cuBLASLt with unit scales and a rescaling pass (1.07-1.72x bf16 at 1-64 rows, where the
# rowwise-scaled kernel is 0.70-1.28x; at 128-256 the two are close); above it, _scaled_mm with the per-row
# and per-column scales (CUTLASS: 1.08-1.67x at 1,024-8,192 rows against 1.01-1.41x: the float32 product's
# extra pass costs more there)
CUBLASLT_UP_TO = 256


class FP8Linear:
    """The product of a layer whose weight was quantized by :func:`quantize_fp8`."""

    def __init__(self, layer: nn.Module):
        w = layer.weight.data
        q, scale = fp8_rows(w)
        self.dtype = w.dtype
        layer.weight = nn.Parameter(q, requires_grad=False)
        layer.weight_scale = scale.view(1, -1)  # [1, out]
        # FP8 tensor cores: Hopper and later, with the sizes cuBLASLt takes
        self.scaled_mm = w.is_cuda and torch.cuda.get_device_capability(w.device)[0] >= 9
        self.scaled_mm = self.scaled_mm and w.shape[0] % 16 == 0 and w.shape[1] % 16 == 0
        self.emulated: torch.Tensor | None = None  # the rounded weight in the model's dtype, built once
        self.one = torch.ones((), dtype=torch.float32, device=w.device)  # scaled_linear's unit scales

    def __call__(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        # on a GPU with Triton (kernels/fp8_quant.py): the quantization in one kernel (bit-equal to
        # fp8_rows); up to CUBLASLT_UP_TO rows the GEMM with scalar scales (cuBLASLt) and the two scales in
        # one pass, above it the rowwise-scaled _scaled_mm
        fused = fp8_quant_fn(x2) if self.scaled_mm and x2.stride(-1) == 1 else None
        xq, xs = fused.quant_rows(x2) if fused is not None else fp8_rows(x2)
        if fused is not None and x2.shape[0] <= CUBLASLT_UP_TO:
            y = fused.scaled_linear(xq, xs, layer.weight.t(), layer.weight_scale, self.one, self.dtype)
            return y.view(*shape[:-1], -1)
        if self.scaled_mm:
            y = torch._scaled_mm(xq, layer.weight.t(), xs, layer.weight_scale, out_dtype=self.dtype)
        else:
            if self.emulated is None:
                self.emulated = (layer.weight.float() * layer.weight_scale.t()).to(self.dtype)
            y = F.linear((xq.float() * xs).to(self.dtype), self.emulated)
        return y.view(*shape[:-1], -1)


def quantize_fp8(model: nn.Module) -> int:
    """Quantize every column- and row-parallel layer's weight to FP8 in place (the embedding and the
    LM head stay in the model's dtype); returns how many layers."""
    layers = [m for m in model.modules() if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]
    for m in layers:
        m.fp8 = FP8Linear(m)
    return len(layers)


class ColumnParallelLinear(nn.Module):
    """``y = x W^T (+ b)`` with the output made of shards (e.g. ``[gate, up]``), each split over
    ranks. ``local_sizes[i]`` is this rank's rows of shard ``i``; ``_slice(i)`` says which rows of the
    checkpoint tensor those are."""

    def __init__(self, in_features: int, local_sizes: list[int], bias: bool = False):
        super().__init__()
        self.local_sizes = local_sizes
        self.offsets = [sum(local_sizes[:i]) for i in range(len(local_sizes))]
        self.weight = _param(sum(local_sizes), in_features)
        self.weight.weight_loader = self.load_shard
        self.bias = _param(sum(local_sizes)) if bias else None
        if self.bias is not None:
            self.bias.weight_loader = self.load_shard

    def _slice(self, shard: int) -> slice:
        n = self.local_sizes[shard]
        start = get_tp_info().rank * n
        return slice(start, start + n)

    def load_shard(self, param: torch.Tensor, loaded: Any, shard: int = 0) -> None:
        rows = loaded[self._slice(shard)]
        dst = param.data.narrow(0, self.offsets[shard], self.local_sizes[shard])
        if tuple(rows.shape) != tuple(dst.shape):
            raise ValueError(f"checkpoint slice {tuple(rows.shape)} != parameter slice {tuple(dst.shape)}")
        dst.copy_(rows)

    fp8: FP8Linear | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fp8 is not None:
            y = self.fp8(self, x)
            return y if self.bias is None else y + self.bias
        return linear(x, self.weight, self.bias)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of the same input fused into one matmul."""

    def __init__(self, in_features: int, out_sizes: list[int], bias: bool = False):
        tp = get_tp_info()
        for n in out_sizes:
            tp.shard(n, "output features")  # raises when a size does not divide
        super().__init__(in_features, [n // tp.size for n in out_sizes], bias)


class QKVParallelLinear(ColumnParallelLinear):
    """Fused q/k/v projection split by heads. With more ranks than KV heads, KV heads are
    replicated: rank ``r`` holds KV head ``r * num_kv_heads // tp``."""

    def __init__(self, hidden: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool = False):
        tp = get_tp_info()
        self.num_local_heads = num_heads // tp.size
        self.num_local_kv_heads = max(1, num_kv_heads // tp.size)
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        sizes = [self.num_local_heads * head_dim] + [self.num_local_kv_heads * head_dim] * 2
        super().__init__(hidden, sizes, bias)

    def _slice(self, shard: int) -> slice:
        if shard == 0:
            return super()._slice(0)
        tp = get_tp_info()
        first_head = tp.rank * self.num_kv_heads // tp.size  # == rank * local_kv_heads when it divides
        return slice(first_head * self.head_dim, (first_head + self.num_local_kv_heads) * self.head_dim)


class RowParallelLinear(nn.Module):
    """``y = all_reduce(x_local W_local^T) (+ b)``: the input features are split over ranks."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        tp = get_tp_info()
        self.in_local = in_features // tp.size
        tp.shard(in_features, "input features")
        self.weight = _param(out_features, self.in_local)
        self.weight.weight_loader = self.load_weight
        self.bias = _param(out_features) if bias else None
        if self.bias is not None:
            self.bias.weight_loader = load_full

    def load_weight(self, param: torch.Tensor, loaded: Any, shard_id: Any = None) -> None:
        start = get_tp_info().rank * self.in_local
        cols = loaded[:, start : start + self.in_local]
        if tuple(cols.shape) != tuple(param.shape):
            raise ValueError(f"checkpoint slice {tuple(cols.shape)} != parameter shape {tuple(param.shape)}")
        param.data.copy_(cols)

    fp8: FP8Linear | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = all_reduce(linear(x, self.weight) if self.fp8 is None else self.fp8(self, x))
        return y if self.bias is None else y + self.bias
