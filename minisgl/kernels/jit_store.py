"""GPU K/V store: a CUDA kernel compiled on first use through TVM FFI (``csrc/store_kv.cu``).

Writing the new tokens' K and V into their pool slots is a pure copy (``k_slots[loc] = k`` and the
same for V); torch does it as two scatter kernels, our Triton kernel as one. This one is also one
launch, moves 16 bytes per thread access where alignment allows, and costs about a microsecond of
host time per call (TVM FFI's calling convention against Triton's launcher). ``MINISGL_KV_STORE``
picks the implementation (see :func:`minisgl.kvcache.pool.KVPool.store`); the default is the one
measured faster on the H200 (docs/benchmarks-gpu.md).
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import torch

from minisgl.env import ENV

logger = logging.getLogger(__name__)
_SOURCE = Path(__file__).parent / "csrc" / "store_kv.cu"


@functools.cache
def _module():
    """The compiled module, or None where it cannot be built (no nvcc, no GPU, JIT disabled)."""
    if ENV.disable_jit or not torch.cuda.is_available():
        return None
    try:
        import tvm_ffi.cpp

        return tvm_ffi.cpp.load_inline("minisgl_store_kv", cuda_sources=_SOURCE.read_text(), functions="store_kv")
    except Exception as e:  # a missing nvcc or headers must not stop the engine
        logger.warning("the TVM FFI K/V store kernel is unavailable (%s); using another store", e)
        return None


def available() -> bool:
    return _module() is not None


def converts(src: torch.dtype, cache: torch.dtype) -> bool:
    """Whether :func:`store_kv` stores rows of ``src`` into slots of ``cache`` (another dtype): a
    float8_e4m3fn cache from bfloat16 or float16 rows."""
    return cache == torch.float8_e4m3fn and src in (torch.bfloat16, torch.float16)


def store_kv(
    k_slots: torch.Tensor,
    v_slots: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """``k_slots[loc] = k; v_slots[loc] = v`` for ``[n, kv_heads, head_dim]`` rows whose heads are
    contiguous (the rows may be strided). ``loc`` is int64 on the same GPU. Slots of float8_e4m3fn
    take bf16/fp16 rows divided by each head's scale (``k_scale``, ``v_scale``: float32 ``[kv_heads]``,
    powers of two), rounded and saturated to +-448 as ``KVPool.quantize`` does. Runs on torch's
    current stream, so it can be captured into a CUDA graph."""
    stream = torch.cuda.current_stream(k.device).cuda_stream
    if k_scale is None or v_scale is None:
        if k_slots.dtype == torch.float8_e4m3fn and k.dtype != k_slots.dtype:
            raise ValueError("storing into an FP8 cache needs k_scale and v_scale")
        k_scale = v_scale = loc  # not read for a plain copy
    _module().store_kv(k_slots, v_slots, loc, k, v, k_scale, v_scale, stream)
