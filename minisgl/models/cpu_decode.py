"""A CPU decode step's decoder layers, each in one C++ call (``kernels/csrc/decode_layer.cc``): the
CPU's counterpart of the CUDA graphs of ``engine/graph.py``. At batch 1 the Python layer spends more
time launching its ~25 ops than the CPU spends in them; the C++ layer runs the same kernels back to back.

It takes a step only when the step is what the C++ layer computes: on the CPU, float32 or bfloat16,
every request decoding one token (at most ``small_linear.max_rows``: by instruction-set level and dtype), the
torch attention backend over an unquantized pool, tensor parallelism off, and every part of every
layer the engine's own, and the engine's decode-attention kernel (``use_decode_kernel``): a norm,
rotary, activation, linear layer or attention kernel swapped in through a seam runs itself, so the
Python path runs. Otherwise ``run_layers`` returns None and the model runs its layers
one module at a time.
"""

from __future__ import annotations

import torch

from minisgl.attention.context import get_ctx
from minisgl.attention.torch_backend import TorchBackend, TorchMetadata
from minisgl.distributed import get_tp_info
from minisgl.env import ENV
from minisgl.kernels import paged_attention
from minisgl.kernels.jit import kernels
from minisgl.kernels.small_linear import DTYPES, max_rows
from minisgl.layers import ACTIVATIONS, MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear


def takes(layer) -> bool:
    """Whether the C++ layer computes this ``DecoderLayer``: every part of it the engine's own."""
    attn, mlp = layer.self_attn, layer.mlp
    norms = [layer.input_layernorm, layer.post_attention_layernorm]
    norms += [attn.q_norm, attn.k_norm] if attn.qk_norm else []
    linears = [
        (attn.qkv_proj, QKVParallelLinear),
        (attn.o_proj, RowParallelLinear),
        (mlp.gate_up_proj, MergedColumnParallelLinear),
        (mlp.down_proj, RowParallelLinear),
    ]
    # the engine's own linear layers, or ones that hand the C++ layer blocks it reads (cpu_weights)
    plain = all((type(m) is kind or hasattr(m, "cpu_weights")) and m.bias is None for m, kind in linears)
    own_math = all(n.fusable for n in norms) and attn.rotary[0].fusable and ACTIVATIONS.is_default(mlp.act)
    return plain and own_math


def layer_args(layer) -> tuple:
    """The parameters and sizes of one C++ call for this layer. Kept from the first step on: they are the
    ``Parameter`` objects, which follow a weight loaded into them or set with ``p.data = ...`` (so reading
    them at every step would buy nothing but ~240 attribute reads a step). The C++ side checks every shape
    and dtype."""
    attn, mlp = layer.self_attn, layer.mlp
    no_norm = layer.input_layernorm.weight.new_empty(0)  # no q/k norm (Llama), no scales (dense): empty
    qn, kn = (attn.q_norm.weight, attn.k_norm.weight) if attn.qk_norm else (no_norm, no_norm)
    # each linear layer's weight and its scales: a dense weight, or the blocks a layer hands over (cpu_weights)
    linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
    (qkv, s_qkv), (o, s_o), (gate_up, s_gate_up), (down, s_down) = [
        m.cpu_weights() if hasattr(m, "cpu_weights") else (m.weight, no_norm) for m in linears
    ]
    weights = (layer.input_layernorm.weight, qkv, qn, kn, o, layer.post_attention_layernorm.weight, gate_up, down)
    weights += (s_qkv, s_o, s_gate_up, s_down)
    return weights, attn.attn.layer_id, attn.num_heads, attn.num_kv_heads, layer.input_layernorm.eps, attn.attn.scale


def run_layers(model, positions: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """All of ``model.layers`` (a ``DecoderModel``) on this step's hidden states ``x`` in C++, returning
    ``(x, residual)`` as the layer loop would; None when this step is not one the C++ layer takes."""
    if not (ENV.fused_kernels and x.is_cpu and x.dtype in DTYPES):
        return None
    ctx = get_ctx()
    backend, batch = ctx.attn_backend, ctx.batch
    if type(backend) is not TorchBackend or backend.pool.quantized or get_tp_info().size != 1:
        return None
    if not paged_attention.engine_kernel_chosen():
        return None  # the C++ layer has the engine's decode attention inside; a plugged-in kernel runs in Python
    md = batch.attn_metadata
    if not isinstance(md, TorchMetadata) or md.q_index is not None or md.kv_slots.shape[0] != x.shape[0]:
        return None  # not a decode step: one query per request
    args = getattr(model, "_cpu_decode_args", None)
    if args is None:  # decided once per model: which implementation each part is does not change
        taken = all(takes(layer) for layer in model.layers)
        args = model._cpu_decode_args = [layer_args(layer) for layer in model.layers] if taken else []
    if not args or args[0][0][0].dtype != x.dtype or x.shape[0] > max_rows(x.dtype):
        return None
    x = x.contiguous()
    residual = torch.empty_like(x)
    cos_sin, pool, threads, lib = model.rotary.cos_sin, backend.pool, torch.get_num_threads(), kernels().lib
    for i, (weights, layer_id, heads, kv_heads, eps, scale) in enumerate(args):
        ln1, w_qkv, qn, kn, *rest = weights
        lib.decode_layer(
            x, residual, i == 0, positions, cos_sin, ln1, w_qkv, qn, kn,
            pool.k_slots(layer_id), pool.v_slots(layer_id), batch.out_loc, md.kv_slots, md.seq_lens,
            *rest, heads, kv_heads, eps, scale, threads,
        )  # fmt: skip
    return x, residual
