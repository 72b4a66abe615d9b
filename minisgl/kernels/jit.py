"""C++ kernels for the CPU, compiled for this machine through TVM FFI (``csrc/``)."""

from __future__ import annotations

import hashlib
import logging
import threading
from pathlib import Path

from minisgl.env import ENV

logger = logging.getLogger(__name__)
CSRC = Path(__file__).parent / "csrc"
ROOT = "decode_layer.cc"  # includes every other CPU source: one library, one compile
FUNCTIONS = (
    "small_linear",
    "simd_dtypes",
    "rmsnorm",
    "fused_add_rmsnorm",
    "silu_and_mul",
    "rope",
    "paged_decode_attention",
    "decode_layer",
)
_BUILT: list = []
_LOCK = threading.Lock()


def cpu_module():
    """The CPU kernels of ``csrc/`` compiled for this machine through TVM FFI, all in one library (once
    per machine and version of the sources: tvm_ffi keeps it on disk; ~6 s of g++ the first time), or
    None where they cannot be built (no compiler, ``MINISGL_DISABLE_JIT=1``): every caller then runs its
    torch version, so a missing compiler is never an error. ``-march=native``: it runs on the machine
    that compiled it (AVX-512 and its BF16 dot products where the CPU has them); no contraction into
    fused multiply-adds, so each product is rounded where torch rounds it.

    Thread-safe: an engine starts the build in a background thread while its weights load, and a
    caller that needs the library meanwhile waits for that build instead of starting its own. (Not
    waiting, running torch meanwhile, was slower: on 2 cores the compiler starves torch's threads.)"""
    if not _BUILT:
        with _LOCK:
            if not _BUILT:
                _BUILT.append(_build())
    return _BUILT[0]


def available() -> bool:
    return cpu_module() is not None


def _build():
    if ENV.disable_jit:
        return None
    try:
        import tvm_ffi.cpp

        # tvm_ffi keys its cache by the root source; the name keys it by every file it includes as well
        texts = b"".join(f.read_bytes() for f in sorted(CSRC.glob("*.[ch]*")) if f.suffix in (".cc", ".h"))
        return tvm_ffi.cpp.load_inline(
            f"minisgl_cpu_{hashlib.sha256(texts).hexdigest()[:12]}",
            cpp_sources=(CSRC / ROOT).read_text(),
            functions=list(FUNCTIONS),
            extra_cflags=["-std=c++17", "-O3", "-march=native", "-ffp-contract=off", "-fPIC", "-fopenmp"],
            extra_ldflags=["-shared", "-fopenmp"],
            extra_include_paths=[str(CSRC)],
        )
    except Exception as e:  # a missing compiler or headers must not stop the engine
        logger.warning("the C++ CPU kernels are unavailable (%s); using the torch versions", e)
        return None
