"""FP8 weights (``--quantization fp8``): W8A8 linear layers, and the activations that flow between them.

After loading, :func:`quantize_fp8` turns each column- and row-parallel layer's weight into
float8_e4m3fn with one scale per output row (its largest magnitude / 448); each input row is quantized
the same way when it arrives (one scale per token). On a Hopper GPU the product runs on FP8 tensor
cores (``torch._scaled_mm``, float32 accumulation); elsewhere the same quantized values are multiplied
in the model's dtype (the weight's rounded copy kept beside the FP8 one), so the CPU measures the
rounding the GPU does.

On a GPU a layer's input and output need not be materialised in the model's dtype. Two types stand
for the half-done forms, and :meth:`DecoderForCausalLM.fuse_fp8` tells the kernels on either side of
each FP8 layer which one they may hand over or take:

``QuantRows``  an input already quantized by the kernel that produced it (the RMSNorm before
               ``qkv`` and ``gate_up``, the SwiGLU before ``down``): no quantization pass of its own.
``Unscaled``   an output the GEMM left without its two scales (cuBLASLt's FP8 GEMM with unit scales,
               see ``kernels/fp8_quant.py``): the next kernel (the q/k norm and rotary after ``qkv``,
               the add-and-RMSNorm after ``o_proj`` and ``down``, the SwiGLU after ``gate_up``) applies
               them as it reads.

Every consumer also takes a plain tensor, and ``Unscaled.materialize`` is the pass it saves, so a path
without the fused kernels (CPU, a swapped-in norm or activation, tensor parallelism's all-reduce) is
the unfused computation. The fused kernels round where the unfused path rounds (to the model's dtype
after the scales, after the norm and after SwiGLU), so both see the same values up to float32
summation order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.kernels import fp8_quant_fn
from minisgl.layers.linear import ColumnParallelLinear, RowParallelLinear

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max


def fp8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (2-D) as FP8 with one float32 scale per row: ``x ~= q * scale``."""
    scale = (x.abs().amax(dim=-1, keepdim=True).float() / FP8_MAX).clamp(min=1e-12)
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


@dataclass
class QuantRows:
    """A linear layer's input, already FP8: ``x ~= q * scale``."""

    q: torch.Tensor  # [M, K] float8_e4m3fn
    scale: torch.Tensor  # [M, 1] float32


@dataclass
class Unscaled:
    """An FP8 layer's output before its scales: ``acc * row_scale * col_scale``, rounded to ``dtype``."""

    acc: torch.Tensor  # [M, N] the product of the FP8 values, bf16 for a bf16 model (else float32)
    row_scale: torch.Tensor  # [M, 1] float32: the input's per-token scales
    col_scale: torch.Tensor  # [1, N] float32: the weight's per-output-row scales
    dtype: torch.dtype

    def materialize(self) -> torch.Tensor:
        fused = fp8_quant_fn(self.acc)
        if fused is None:
            return (self.acc.float() * self.row_scale * self.col_scale).to(self.dtype)
        return fused.rescale(self.acc, self.row_scale, self.col_scale, self.dtype)


def materialize(x):
    """``x`` as a tensor in the model's dtype, whichever form it came in."""
    return x.materialize() if isinstance(x, Unscaled) else x


def kernel_args(x) -> tuple:
    """``(tensor, row_scale, col_scale, dtype)``, what the fused kernels take: an ``Unscaled``'s fields,
    or a plain tensor with no scales (the kernels then read it as the model's values)."""
    return (x.acc, x.row_scale, x.col_scale, x.dtype) if isinstance(x, Unscaled) else (x, None, None, None)


# FP8 GEMM on Hopper, by the number of rows (benchmark/fp8_linear.py, one H200, Qwen3-14B's layers): up to
# this many, cuBLASLt with unit scales and the scales applied after (1.07-1.72x bf16 at 1-64 rows, where the
# rowwise-scaled kernel is 0.70-1.28x; at 128-256 the two are close); above it, _scaled_mm with the per-row
# and per-column scales (CUTLASS: 1.08-1.67x at 1,024-8,192 rows against 1.01-1.41x: the float32 product's
# extra pass costs more there)
CUBLASLT_UP_TO = 256


class FP8Linear:
    """The product of a layer whose weight was quantized by :func:`quantize_fp8`. ``defer``: the layer's
    consumer takes an ``Unscaled`` output (set by ``fuse_fp8``; such a layer has no bias)."""

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
        self.one = torch.ones((), dtype=torch.float32, device=w.device)  # cuBLASLt's unit scales
        self.acc_dtype = torch.bfloat16 if w.dtype == torch.bfloat16 else torch.float32
        self.defer = False

    def __call__(self, layer: nn.Module, x: torch.Tensor | QuantRows) -> torch.Tensor | Unscaled:
        if isinstance(x, QuantRows):
            shape, (xq, xs) = x.q.shape, (x.q, x.scale)
            fused = fp8_quant_fn(xq)
        else:
            shape = x.shape
            x = x.reshape(-1, shape[-1])
            # on a GPU with Triton (kernels/fp8_quant.py): the quantization in one kernel, bit-equal to fp8_rows
            fused = fp8_quant_fn(x) if self.scaled_mm and x.stride(-1) == 1 else None
            xq, xs = fused.quant_rows(x) if fused is not None else fp8_rows(x)
        if self.scaled_mm and fused is not None and xq.shape[0] <= CUBLASLT_UP_TO:
            # cuBLASLt's FP8 GEMM with unit scales; the scales after, by the consumer or a pass. A bf16 model's
            # product is rounded to bf16 first (2^-9, against FP8's 2^-4 on each factor): half the bytes for
            # the GEMM to write and the next kernel to read. float16 cannot hold it (448^2 * K > 65,504).
            acc = torch._scaled_mm(xq, layer.weight.t(), self.one, self.one, out_dtype=self.acc_dtype)
            y = Unscaled(acc, xs, layer.weight_scale, self.dtype)
            return y if self.defer else y.materialize().view(*shape[:-1], -1)
        if self.scaled_mm:  # the rowwise-scaled GEMM (CUTLASS), which applies both scales itself
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


# ---- the kernels around an FP8 layer ---------------------------------------------------------------


def rms_norm(norm: nn.Module, x, residual: torch.Tensor | None, quantize: bool):
    """``norm`` (an RMSNorm, the engine's own math) of ``x`` (a tensor or ``Unscaled``), after adding
    ``residual`` in place as RMSNorm does; the output quantized for the next FP8 layer when ``quantize``.
    One Triton kernel; None where it cannot run (the caller then runs the unfused path)."""
    src, *scales = kernel_args(x)
    fused = fp8_quant_fn(src)
    if fused is None or src.dim() != 2 or src.stride(-1) != 1 or not fused.can_norm(src.shape[-1]):
        return None
    out = fused.rms_norm(src, norm.weight, norm.eps, residual, *scales, quantize=quantize)
    y = QuantRows(*out) if quantize else out
    return y if residual is None else (y, residual)


def silu_and_mul_quant(x) -> QuantRows | None:
    """SwiGLU of a fused ``[gate | up]`` projection (a tensor or ``Unscaled``), quantized for ``down``:
    one Triton kernel, or None where it cannot run."""
    src, *scales = kernel_args(x)
    fused = fp8_quant_fn(src)
    if fused is None or src.dim() != 2 or src.stride(-1) != 1:
        return None
    return QuantRows(*fused.silu_and_mul_quant(src, *scales))
