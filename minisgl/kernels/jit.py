"""C++ kernels for the CPU, compiled for this machine through TVM FFI (``csrc/``)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from minisgl.env import ENV

logger = logging.getLogger(__name__)
CSRC = Path(__file__).parent / "csrc"
_BUILT: dict[tuple, object] = {}
_BUILDING: dict[tuple, threading.Lock] = {}


def cpu_module(name: str, functions: tuple[str, ...], *flags: str):
    """``csrc/<name>.cc`` compiled for this CPU through TVM FFI (once: tvm_ffi keeps the library on disk,
    keyed by source and flags), or None where it cannot be built (no compiler, ``MINISGL_DISABLE_JIT=1``):
    every caller then runs its torch version, so a missing compiler is never an error. ``-march=native``:
    it runs on the machine that compiled it (AVX-512 and its BF16 dot products where the CPU has them).
    Thread-safe: the engine builds its modules in the background at start-up (``build_cpu_kernels``), and
    a caller that needs one meanwhile waits for that build instead of starting its own."""
    key = (name, functions, flags)
    if key not in _BUILT:
        with _BUILDING.setdefault(key, threading.Lock()):
            if key not in _BUILT:
                _BUILT[key] = _build(name, functions, flags)
    return _BUILT[key]


def _build(name: str, functions: tuple[str, ...], flags: tuple[str, ...]):
    if ENV.disable_jit:
        return None
    try:
        import tvm_ffi.cpp

        return tvm_ffi.cpp.load_inline(
            f"minisgl_{name}",
            cpp_sources=(CSRC / f"{name}.cc").read_text(),
            functions=list(functions),
            extra_cflags=["-std=c++17", "-O3", "-march=native", "-fPIC", "-fopenmp", *flags],
            extra_ldflags=["-shared", "-fopenmp"],
            extra_include_paths=[str(CSRC)],
        )
    except Exception as e:  # a missing compiler or headers must not stop the engine
        logger.warning("the C++ kernel %s is unavailable (%s); using the torch version", name, e)
        return None
