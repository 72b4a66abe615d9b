"""Column- and row-parallel linear layers (Megatron-style).

A column-parallel layer splits its *output* features across ranks and needs no communication; a
row-parallel layer splits its *input* features and sums partial results with an all-reduce. A
decoder block pairs them: ``qkv`` (column) -> attention -> ``o_proj`` (row), and ``gate_up``
(column) -> SwiGLU -> ``down`` (row): one all-reduce per pair.

Each parameter carries a ``weight_loader(param, loaded, shard_id)`` that copies this rank's slice of
a checkpoint tensor; ``loaded`` is a tensor or a lazy safetensors slice, sliced before reading.

A quantized model has these layers replaced after loading (``minisgl/quant/``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from minisgl.distributed import all_reduce, get_tp_info
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = all_reduce(linear(x, self.weight))
        return y if self.bias is None else y + self.bias
