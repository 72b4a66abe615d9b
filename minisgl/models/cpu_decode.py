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


def layer_args(layer) -> tuple | None:
    """The tensors and sizes one C++ call needs for this ``DecoderLayer``, or None if it has a part
    the C++ layer does not compute."""
    attn, mlp = layer.self_attn, layer.mlp
    norms = [layer.input_layernorm, layer.post_attention_layernorm]
    norms += [attn.q_norm, attn.k_norm] if attn.qk_norm else []
    linear_types = {
        "qkv_proj": QKVParallelLinear,
        "o_proj": RowParallelLinear,
        "gate_up_proj": MergedColumnParallelLinear,
        "down_proj": RowParallelLinear,
    }
    linears = {"qkv_proj": attn.qkv_proj, "o_proj": attn.o_proj, "gate_up_proj": mlp.gate_up_proj}
    linears["down_proj"] = mlp.down_proj
    if not all(n.fusable for n in norms) or not attn.rotary[0].fusable or not ACTIVATIONS.is_default(mlp.act):
        return None
    for name, m in linears.items():
        if type(m) is not linear_types[name] or m.bias is not None or m.fp8 is not None:
            return None
    empty = attn.qkv_proj.weight.new_empty(0)
    qn, kn = (attn.q_norm.weight, attn.k_norm.weight) if attn.qk_norm else (empty, empty)
    weights = (
        layer.input_layernorm.weight,
        attn.qkv_proj.weight,
        qn,
        kn,
    )
    rest = (attn.o_proj.weight, layer.post_attention_layernorm.weight, mlp.gate_up_proj.weight, mlp.down_proj.weight)
    if not all(w.is_contiguous() for w in (*weights, *rest)):
        return None
    return (
        attn.attn.layer_id,
        weights,
        rest,
        attn.num_heads,
        attn.num_kv_heads,
        layer.input_layernorm.eps,
        attn.attn.scale,
    )


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
    args = getattr(model, "_cpu_decode_args", None)
    if args is None:  # decided once per model: its parts do not change
        args = [layer_args(layer) for layer in model.layers]
        args = args if all(a is not None for a in args) else []
        model._cpu_decode_args = args
    if not args or x.dtype != args[0][1][1].dtype or cpu_module() is None:
        return None
    x = x.contiguous()
    residual = torch.empty_like(x)
    cos_sin, pool, threads = model.rotary.cos_sin, backend.pool, torch.get_num_threads()
    for i, (layer_id, (ln1, w_qkv, qn, kn), rest, heads, kv_heads, eps, scale) in enumerate(args):
        cpu_module().decode_layer(
            x, residual, i == 0, positions, cos_sin, ln1, w_qkv, qn, kn,
            pool.k_slots(layer_id), pool.v_slots(layer_id), batch.out_loc, md.kv_slots, md.seq_lens,
            *rest, heads, kv_heads, eps, scale, threads,
        )  # fmt: skip
    return x, residual
