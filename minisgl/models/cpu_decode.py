"""A CPU decode step's decoder layers, each in one C++ call (``kernels/csrc/decode_layer.cc``): the
CPU's counterpart of the CUDA graphs of ``engine/graph.py``. At batch 1 the Python layer spends more
time launching its ~25 ops than the CPU spends in them; the C++ layer runs the same kernels back to back.

It takes a step only when the step is what the C++ layer computes: on the CPU, float32 or bfloat16,
every request decoding one token (at most ``MAX_ROWS``), the torch attention backend over an unquantized
pool, tensor parallelism off, and every part of every layer the engine's own (a norm, rotary,
activation or linear layer swapped in through a seam runs itself, so the Python path runs). Otherwise
``run_layers`` returns None and the model runs its layers one module at a time.
"""

from __future__ import annotations

import torch

from minisgl.attention.context import get_ctx
from minisgl.attention.torch_backend import TorchBackend, TorchMetadata
from minisgl.distributed import get_tp_info
from minisgl.env import ENV
from minisgl.kernels.jit import cpu_module
from minisgl.kernels.small_linear import MAX_ROWS
from minisgl.layers import ACTIVATIONS, MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear

DTYPES = (torch.float32, torch.bfloat16)


def build_cpu_kernels() -> None:
    """Compile the C++ CPU kernels (on a machine's first run ~6 s; later runs load them from tvm_ffi's
    disk cache). The engine calls it in a background thread while it loads the weights, so the
    compiler's time overlaps the loading instead of landing in the first request."""
    cpu_module()


def takes(layer) -> bool:
    """Whether the C++ layer computes this ``DecoderLayer``: every part of it the engine's own."""
    attn, mlp = layer.self_attn, layer.mlp
    norms = [layer.input_layernorm, layer.post_attention_layernorm]
    norms += [attn.q_norm, attn.k_norm] if attn.qk_norm else []
    linears = {
        QKVParallelLinear: attn.qkv_proj,
        RowParallelLinear: attn.o_proj,
        MergedColumnParallelLinear: mlp.gate_up_proj,
    }
    own = all(type(m) is kind for kind, m in linears.items()) and type(mlp.down_proj) is RowParallelLinear
    plain = all(m.bias is None and m.fp8 is None for m in (*linears.values(), mlp.down_proj))
    return (
        own and plain and all(n.fusable for n in norms) and attn.rotary[0].fusable and ACTIVATIONS.is_default(mlp.act)
    )


def layer_args(layer) -> tuple:
    """The weights and sizes of one C++ call for this layer. Read at every step, not kept: whoever
    replaces a weight after the first step (tests, lessons) is not left with a stale copy."""
    attn, mlp = layer.self_attn, layer.mlp
    qn, kn = (attn.q_norm.weight, attn.k_norm.weight) if attn.qk_norm else (None, None)
    weights = (
        layer.input_layernorm.weight,
        attn.qkv_proj.weight,
        qn,
        kn,
        attn.o_proj.weight,
        layer.post_attention_layernorm.weight,
        mlp.gate_up_proj.weight,
        mlp.down_proj.weight,
    )
    return weights, attn.attn.layer_id, attn.num_heads, attn.num_kv_heads, layer.input_layernorm.eps, attn.attn.scale


def run_layers(model, positions: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """All of ``model.layers`` (a ``DecoderModel``) on this step's hidden states ``x`` in C++, returning
    ``(x, residual)`` as the layer loop would; None when this step is not one the C++ layer takes."""
    if not (ENV.fused_kernels and x.is_cpu and x.dtype in DTYPES and x.shape[0] <= MAX_ROWS):
        return None
    ctx = get_ctx()
    backend, batch = ctx.attn_backend, ctx.batch
    if type(backend) is not TorchBackend or backend.pool.quantized or get_tp_info().size != 1:
        return None
    md = batch.attn_metadata
    if not isinstance(md, TorchMetadata) or md.q_index is not None or md.kv_slots.shape[0] != x.shape[0]:
        return None  # not a decode step: one query per request
    taken = getattr(model, "_cpu_decode_takes", None)
    if taken is None:  # decided once per model: which implementation each part is does not change
        taken = model._cpu_decode_takes = all(takes(layer) for layer in model.layers)
    if not taken or cpu_module() is None:
        return None
    args = [layer_args(layer) for layer in model.layers]
    weights = [w for a in args for w in a[0] if w is not None]
    if any(w.dtype != x.dtype or not w.is_contiguous() for w in weights):
        return None
    x = x.contiguous()
    residual, no_norm = torch.empty_like(x), x.new_empty(0)  # no q/k norm: empty tensors
    cos_sin, pool, threads = model.rotary.cos_sin, backend.pool, torch.get_num_threads()
    for i, ((ln1, w_qkv, qn, kn, *rest), layer_id, heads, kv_heads, eps, scale) in enumerate(args):
        qn, kn = (no_norm, no_norm) if qn is None else (qn, kn)
        cpu_module().decode_layer(
            x, residual, i == 0, positions, cos_sin, ln1, w_qkv, qn, kn,
            pool.k_slots(layer_id), pool.v_slots(layer_id), batch.out_loc, md.kv_slots, md.seq_lens,
            *rest, heads, kv_heads, eps, scale, threads,
        )  # fmt: skip
    return x, residual
