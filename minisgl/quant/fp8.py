"""FP8 weights (``--quantization fp8``): W8A8 linear layers, and the activations that flow between them.

:func:`apply` replaces each column- and row-parallel layer of a loaded model by an :class:`FP8Linear`:
its weight in float8_e4m3fn with one scale per output row (its largest magnitude / 448); each input
row is quantized the same way when it arrives (one scale per token). On a Hopper GPU the product runs
on FP8 tensor cores (``torch._scaled_mm``, float32 accumulation); elsewhere the same quantized values
are multiplied in the model's dtype (the weight's rounded copy kept beside the FP8 one), so the CPU
measures the rounding the GPU does.

On a GPU a layer's input and output need not be materialised in the model's dtype. Two types stand
for the half-done forms, and :func:`apply` replaces the modules on either side of each FP8 layer by
forms that hand over or take them (``FP8RMSNorm``, ``FP8DecoderMLP``, ``FP8DecoderAttention``):

``QuantRows``  an input already quantized by the kernel that produced it (the RMSNorm before
               ``qkv`` and ``gate_up``, the SwiGLU before ``down``): no quantization pass of its own.
``Unscaled``   an output the GEMM left without its two scales (cuBLASLt's FP8 GEMM with unit scales,
               see ``fp8_kernels.py``): the next kernel (the q/k norm and rotary after ``qkv``, the
               add-and-RMSNorm after ``o_proj`` and ``down``, the SwiGLU after ``gate_up``) applies
               them as it reads.

Every consumer also takes a plain tensor, and ``Unscaled.materialize`` is the pass it saves, so a path
without the fused kernels (CPU, a swapped-in norm or activation, tensor parallelism's all-reduce) is
the unfused computation. The fused kernels round where the unfused path rounds (to the model's dtype
after the scales, after the norm and after SwiGLU), so both see the same values up to float32
summation order. ``MINISGL_FP8_FUSED=0`` leaves the neighbours as they are (the A/B of docs/fp8.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.distributed import all_reduce, get_tp_info
from minisgl.env import ENV
from minisgl.kernels import triton_ops
from minisgl.layers import RMSNorm
from minisgl.layers.activation import ACTIVATIONS
from minisgl.layers.linear import ColumnParallelLinear, RowParallelLinear
from minisgl.models.decoder import DecoderAttention, DecoderForCausalLM, DecoderMLP

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max


def kernels(x: torch.Tensor):
    """The Triton kernels of ``fp8_kernels.py`` for ``x`` on a GPU with Triton, else None (the torch
    path: ``fp8_rows``, ``_scaled_mm``)."""
    if triton_ops(x) is None:
        return None
    from minisgl.quant import fp8_kernels

    return fp8_kernels


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
        fused = kernels(self.acc)
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


# The FP8 GEMM on Hopper up to this many rows: cuBLASLt with unit scales, the scales applied after;
# above it, _scaled_mm with the per-row and per-column scales (CUTLASS). docs/fp8.md
# has the measurements behind the threshold.
CUBLASLT_UP_TO = 256


class FP8Linear(nn.Module):
    """A column- or row-parallel layer with its weight in FP8 (made from the loaded layer it replaces).
    ``reduce``: a row-parallel layer over several ranks, whose products are all-reduced. ``defer``: the
    layer's consumer takes an ``Unscaled`` output (set by :func:`apply`; such a layer has no bias and
    no all-reduce)."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        w = layer.weight.data
        q, scale = fp8_rows(w)
        self.dtype = w.dtype
        self.weight = nn.Parameter(q, requires_grad=False)
        self.weight_scale = scale.view(1, -1)  # [1, out]
        self.bias = layer.bias
        self.reduce = isinstance(layer, RowParallelLinear) and get_tp_info().size > 1
        # FP8 tensor cores: Hopper and later, with the sizes cuBLASLt takes
        self.scaled_mm = w.is_cuda and torch.cuda.get_device_capability(w.device)[0] >= 9
        self.scaled_mm = self.scaled_mm and w.shape[0] % 16 == 0 and w.shape[1] % 16 == 0
        self.emulated: torch.Tensor | None = None  # the rounded weight in the model's dtype, built once
        self.one = torch.ones((), dtype=torch.float32, device=w.device)  # cuBLASLt's unit scales
        self.acc_dtype = torch.bfloat16 if w.dtype == torch.bfloat16 else torch.float32
        self.defer = False

    def forward(self, x: torch.Tensor | QuantRows) -> torch.Tensor | Unscaled:
        y = self.product(x)
        if self.reduce:
            y = all_reduce(y)
        return y if self.bias is None else y + self.bias

    def product(self, x: torch.Tensor | QuantRows) -> torch.Tensor | Unscaled:
        if isinstance(x, QuantRows):
            shape, (xq, xs) = x.q.shape, (x.q, x.scale)
            fused = kernels(xq)
        else:
            shape = x.shape
            x = x.reshape(-1, shape[-1])
            # on a GPU with Triton (fp8_kernels.py): the quantization in one kernel, bit-equal to fp8_rows
            fused = kernels(x) if self.scaled_mm and x.stride(-1) == 1 else None
            xq, xs = fused.quant_rows(x) if fused is not None else fp8_rows(x)
        if self.scaled_mm and fused is not None and xq.shape[0] <= CUBLASLT_UP_TO:
            # cuBLASLt's FP8 GEMM with unit scales; the scales after, by the consumer or a pass. A bf16 model's
            # product is rounded to bf16 first (2^-9, against FP8's 2^-4 on each factor): half the bytes for
            # the GEMM to write and the next kernel to read. float16 cannot hold it (448^2 * K > 65,504).
            acc = torch._scaled_mm(xq, self.weight.t(), self.one, self.one, out_dtype=self.acc_dtype)
            y = Unscaled(acc, xs, self.weight_scale, self.dtype)
            return y if self.defer else y.materialize().view(*shape[:-1], -1)
        if self.scaled_mm:  # the rowwise-scaled GEMM (CUTLASS), which applies both scales itself
            y = torch._scaled_mm(xq, self.weight.t(), xs, self.weight_scale, out_dtype=self.dtype)
        else:
            if self.emulated is None:
                self.emulated = (self.weight.float() * self.weight_scale.t()).to(self.dtype)
            y = F.linear((xq.float() * xs).to(self.dtype), self.emulated)
        return y.view(*shape[:-1], -1)


def quantize_linears(model: nn.Module) -> int:
    """Replace every column- and row-parallel layer by its :class:`FP8Linear` (the embedding and the LM
    head stay in the model's dtype); returns how many layers."""
    found = [(name, m) for name, m in model.named_modules() if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]
    for name, m in found:
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr, FP8Linear(m))
    return len(found)


# ---- the layers around an FP8 layer ---------------------------------------------------------------
class FP8RMSNorm(RMSNorm):
    """An RMSNorm next to FP8 layers: it takes an ``Unscaled`` input (the product of the layer before),
    and with ``quantize`` hands the next FP8 layer its input quantized (``QuantRows``). One Triton
    kernel where it can run, else the engine's RMSNorm on the materialized input."""

    quantize = False

    def forward(self, x, residual: torch.Tensor | None = None):
        if not self.quantize and not isinstance(x, Unscaled):  # nothing FP8 to take or hand over
            return super().forward(x, residual)
        src, *scales = kernel_args(x)
        fused = kernels(src) if self.fusable else None
        if fused is not None and src.dim() == 2 and src.stride(-1) == 1 and fused.can_norm(src.shape[-1]):
            out = fused.rms_norm(src, self.weight, self.eps, residual, *scales, quantize=self.quantize)
            y = QuantRows(*out) if self.quantize else out
            return y if residual is None else (y, residual)
        return super().forward(materialize(x), residual)


class FP8DecoderMLP(DecoderMLP):
    """The MLP with SwiGLU and the quantization of ``down``'s input in one Triton kernel, taking
    ``gate_up``'s ``Unscaled`` output; where that kernel cannot run (the CPU, a swapped-in activation),
    the activation gets the materialized product."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.gate_up_proj(x)
        src, *scales = kernel_args(h)
        fused = kernels(src) if ACTIVATIONS.is_default(self.act) else None
        if fused is not None and src.dim() == 2 and src.stride(-1) == 1:
            return self.down_proj(QuantRows(*fused.silu_and_mul_quant(src, *scales)))
        return self.down_proj(self.act(materialize(h)))


class FP8DecoderAttention(DecoderAttention):
    """Attention whose ``qkv`` projection hands over an ``Unscaled`` output: the q/k norm and rotary
    kernel applies its scales as it reads (the materialized product where that kernel cannot run)."""

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        norms = (self.q_norm, self.k_norm) if self.qk_norm else ()
        rope, (heads, kv_heads) = self.rotary[0], (self.num_heads, self.num_kv_heads)
        src, *scales = kernel_args(qkv)
        q_k_v = rope.fused_qk_norm_rope(positions, src, heads, kv_heads, *norms, scales=tuple(scales))
        if q_k_v is None:
            q_k_v = rope.rotate_qkv(positions, materialize(qkv), heads, kv_heads, *norms)
        o = self.attn(*q_k_v)
        return self.o_proj(o.reshape(-1, self.num_heads * self.head_dim))


def _become(module: nn.Module, cls: type) -> None:
    """``module`` takes the FP8-aware subclass ``cls`` of its class (its parameters and state stay)."""
    assert issubclass(cls, type(module)), (cls, type(module))
    module.__class__ = cls


def fuse_neighbours(model: DecoderForCausalLM) -> int:
    """After :func:`quantize_linears`: let the layers around each FP8 layer quantize its input and apply
    its output's scales, so neither takes a pass of its own. Only the engine's own norm, rotary and
    SwiGLU fuse (a swapped-in one gets a plain tensor); a row-parallel layer over several ranks hands
    its all-reduce a real tensor. Returns how many passes were fused away."""
    fused, tp = 0, get_tp_info().size
    blocks = model.model.layers
    is_fp8 = lambda m: isinstance(m, FP8Linear)  # noqa: E731
    for block in blocks:
        for norm in (block.input_layernorm, block.post_attention_layernorm):
            _become(norm, FP8RMSNorm)
    _become(model.model.norm, FP8RMSNorm)
    for i, block in enumerate(blocks):
        attn, mlp = block.self_attn, block.mlp
        after_down = blocks[i + 1].input_layernorm if i + 1 < len(blocks) else model.model.norm
        produced = [(block.input_layernorm, attn.qkv_proj), (block.post_attention_layernorm, mlp.gate_up_proj)]
        for norm, linear in produced:  # the norm quantizes the layer's input
            norm.quantize = norm.fusable and is_fp8(linear)
            fused += norm.quantize
        act = ACTIVATIONS.is_default(mlp.act) and is_fp8(mlp.down_proj)
        if act:
            _become(mlp, FP8DecoderMLP)
            fused += 1
        rope = attn.rotary[0].fusable and (not attn.qk_norm or (attn.q_norm.fusable and attn.k_norm.fusable))
        if rope and is_fp8(attn.qkv_proj):
            _become(attn, FP8DecoderAttention)
        consumed = [(attn.qkv_proj, rope, True), (attn.o_proj, block.post_attention_layernorm.fusable, tp == 1)]
        consumed += [(mlp.gate_up_proj, act, True), (mlp.down_proj, after_down.fusable, tp == 1)]
        for linear, takes, alone in consumed:  # the next layer applies the output's scales
            if is_fp8(linear) and linear.bias is None and alone and takes:
                linear.defer = True
                fused += 1
    return fused


def apply(model: DecoderForCausalLM) -> str:
    """``--quantization fp8``: the linear layers in FP8, and (unless ``MINISGL_FP8_FUSED=0``) their
    neighbours fused with them."""
    n = quantize_linears(model)
    fused = fuse_neighbours(model) if ENV.fp8_fused else 0
    return f"{n} linear layers quantized, {fused} quantization or scaling passes fused"
