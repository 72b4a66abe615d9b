"""CPU paged decode attention: a C++ kernel compiled on first use through TVM FFI
(``csrc/paged_decode.cc``), with the pure-torch version it must agree with, and the seam that picks
which of them the engine runs.

Why a kernel: in PyTorch, attention over paged KV first gathers every request's K and V into a
dense tensor, in every layer, at every step; on a CPU that copy costs more than the attention.
The kernel reads K/V rows in place through the slot list instead.

The seam: ``DECODE_KERNELS`` maps names to functions of the ``DecodeKernel`` shape, and
``use_decode_kernel(name)`` makes ``paged_decode_attention`` (the torch backend's decode step on the
CPU) run that one inside a ``with`` block; lab 13's grader and lesson 13 plug a kernel in that way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from minisgl.kernels.jit import available as available  # its public name here (lessons 04 and 13 call it)
from minisgl.kernels.jit import kernels
from minisgl.registry import Registry

# (q [B, H, D], k_pool [S, Hkv, D], v_pool [S, Hkv, D], slots [B, Lmax] int64, lens [B] int32, scale)
# -> [B, H, D] in q's dtype: softmax(q k^T * scale) v over each request's first lens[b] slots. A kernel
# may rely on 1 <= lens[b] <= Lmax and on every slot it reads being a row of the pool; the slots past
# lens[b] are padding (any valid slot) and must not count.
DecodeKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]


def paged_decode_attention_cpp(q, k_pool, v_pool, slots, lens, scale: float) -> torch.Tensor:
    """The engine's C++ kernel (``DecodeKernel``; see the C++ source for the contract)."""
    out = torch.empty_like(q)
    kernels().lib.paged_decode_attention(
        q.contiguous(), k_pool, v_pool, slots, lens, out, scale, torch.get_num_threads()
    )
    return out


def paged_decode_attention_torch(q, k_pool, v_pool, slots, lens, scale: float) -> torch.Tensor:
    """The reference: gather each request's K/V, mask the padding, softmax in float32."""
    bsz, heads, dim = q.shape
    kv_heads = k_pool.shape[1]
    # [B, Hkv, L, D], in q's dtype (a pool may store them narrower)
    keys, values = k_pool[slots].to(q.dtype).transpose(1, 2), v_pool[slots].to(q.dtype).transpose(1, 2)
    qg = q.view(bsz, kv_heads, heads // kv_heads, dim)
    scores = (qg @ keys.transpose(-1, -2)).float() * scale
    mask = torch.arange(slots.shape[1], device=q.device)[None, :] < lens[:, None]
    scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    return (F.softmax(scores, dim=-1).to(q.dtype) @ values).reshape(bsz, heads, dim)


# by "module:attr" name, looked up at each call: a wrapper put on the module's function (the grader's
# tripwires) is the one that runs
DECODE_KERNELS: Registry[DecodeKernel] = Registry(
    "CPU decode attention kernel",
    {"cpp": f"{__name__}:paged_decode_attention_cpp", "torch": f"{__name__}:paged_decode_attention_torch"},
)
_CHOSEN: list[str] = ["cpp"]  # a stack: the innermost use_decode_kernel() wins


@contextmanager
def use_decode_kernel(name: str) -> Iterator[DecodeKernel]:
    """Inside the block, ``paged_decode_attention`` runs ``DECODE_KERNELS.get(name)`` (process-wide:
    the offline engine steps in the caller's thread). Yields that kernel."""
    kernel = DECODE_KERNELS.get(name)
    _CHOSEN.append(name)
    try:
        yield kernel
    finally:
        _CHOSEN.pop()


def engine_kernel_chosen() -> bool:
    """Whether the decode attention is the engine's own C++ kernel: the fused C++ decode layer
    (``minisgl/models/cpu_decode.py``) has that kernel inside, so it may run only then."""
    return _CHOSEN[-1] == "cpp"


def paged_decode_attention(q, k_pool, v_pool, slots, lens, scale: float) -> torch.Tensor:
    """The CPU decode attention the engine runs (the torch backend calls it where the C++ kernels are
    built): the ``DecodeKernel`` chosen by ``use_decode_kernel``, the engine's C++ one by default."""
    return DECODE_KERNELS.get(_CHOSEN[-1])(q, k_pool, v_pool, slots, lens, scale)
