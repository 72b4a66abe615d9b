"""C++ kernels for the CPU, compiled for this machine through TVM FFI (``csrc/``), one library per
instruction-set level.

Levels, widest first (``csrc/simd.h`` writes each kernel once against a vector type of each):

=========  ==========================  ==========================================================
level      compiler flags              runs on
=========  ==========================  ==========================================================
avx512     ``-march=native``           x86-64 CPUs with AVX-512F (and its BF16 dot products where
                                       the CPU has AVX512-BF16: Zen 4+, Sapphire Rapids+)
avx2       ``-march=haswell``          x86-64 with AVX2 + FMA + F16C (Haswell+, Zen 1+): a fixed
                                       target, so an AVX-512 machine builds exactly what an
                                       AVX2-only one runs
portable   none (the target's base)    anything GCC or Clang compiles for: GCC vector extensions,
                                       SSE2 on x86-64, NEON on aarch64
=========  ==========================  ==========================================================

The engine runs the widest level this CPU has; ``MINISGL_CPU_ISA`` picks a narrower one (asking for
one the CPU lacks is an error, raised by :func:`isa`), so an AVX-512 machine can run and test the AVX2
and portable code too. Each level is its own tvm_ffi library (its own name, so its own cache entry).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import platform
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minisgl.env import ENV

logger = logging.getLogger(__name__)
CSRC = Path(__file__).parent / "csrc"
ROOT = "decode_layer.cc"  # includes every other CPU source: one library, one compile
FUNCTIONS = (
    "isa",
    "small_linear",
    "rmsnorm",
    "fused_add_rmsnorm",
    "silu_and_mul",
    "rope",
    "paged_decode_attention",
    "decode_layer",
    "quant_linear",
    "dequantize",
)
ISAS = ("avx512", "avx2", "portable")  # widest first
ISA_FLAGS = {"avx512": ["-march=native"], "avx2": ["-march=haswell"], "portable": []}
# no contraction into fused multiply-adds: each product is rounded where the code rounds it (the FMAs
# simd.h asks for by name stay), and a portable build gives the same bits on every machine
CFLAGS = ["-std=c++17", "-O3", "-ffp-contract=off", "-fPIC", "-fopenmp", "-Wno-psabi"]
_BUILT: dict[str, object] = {}
_LOCKS = {level: threading.Lock() for level in ISAS}  # levels may build side by side


@functools.cache
def cpu_isas() -> tuple[str, ...]:
    """The levels this CPU can run, widest first: from the CPU's flags in ``/proc/cpuinfo`` (Linux on
    x86-64; elsewhere torch's view of the CPU); ``portable`` everywhere."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return ("portable",)
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(next((line for line in f if line.startswith("flags")), "").split())
    except OSError:  # not Linux: what torch dispatches to tells the same
        import torch

        cap = torch.backends.cpu.get_cpu_capability()  # "AVX512", "AVX2" or "DEFAULT"
        flags = {"avx2", "fma", "f16c"} if cap in ("AVX512", "AVX2") else set()
        flags |= {"avx512f"} if cap == "AVX512" else set()
    levels = ["avx512"] if "avx512f" in flags else []
    levels += ["avx2"] if {"avx2", "fma", "f16c"} <= flags else []
    return (*levels, "portable")


def isa() -> str:
    """The level the engine's kernels run: ``MINISGL_CPU_ISA`` if set, else the widest this CPU has.
    Raises ``ValueError`` for a level the CPU cannot run."""
    if ENV.cpu_isa is None:
        return cpu_isas()[0]
    if ENV.cpu_isa not in cpu_isas():
        raise ValueError(f"MINISGL_CPU_ISA={ENV.cpu_isa}: this CPU cannot run it (it runs {', '.join(cpu_isas())})")
    return ENV.cpu_isa


def cpu_module(level: str | None = None):
    """The CPU kernels of ``csrc/`` compiled for ``level`` (default :func:`isa`) through TVM FFI, all in
    one library (once per machine, level and version of the sources: tvm_ffi keeps it on disk; ~6 s of
    g++ the first time), or None where they cannot be built (no compiler, ``MINISGL_DISABLE_JIT=1``):
    every caller then runs its torch version, so a missing compiler is never an error.

    Thread-safe: an engine starts the build in a background thread while its weights load, and a
    caller that needs the library meanwhile waits for that build instead of starting its own. (Not
    waiting, running torch meanwhile, was slower: on 2 cores the compiler starves torch's threads.)"""
    level = isa() if level is None else level
    mod = _BUILT.get(level)
    if mod is None and level not in _BUILT:
        with _LOCKS[level]:
            if level not in _BUILT:
                _BUILT[level] = _build(level)
        mod = _BUILT[level]
    return mod


def available() -> bool:
    return cpu_module() is not None


@dataclass(frozen=True)
class CpuKernels:
    """The C++ kernels one engine runs, chosen once (:func:`choose`) from the level in use, so that the
    layers' per-call checks read two fields instead of asking the environment and the build again."""

    level: str  # one of ISAS
    lib: Any  # the compiled library (cpu_module(level)); None: every caller runs its torch version


_IN_USE: list[CpuKernels] = []  # a stack: the innermost engine's forward pass wins (see forward_context)


def choose() -> CpuKernels:
    """The kernels for the level in use now (``MINISGL_CPU_ISA``, else the widest): waits for their build."""
    level = isa()
    return CpuKernels(level, cpu_module(level))


@contextmanager
def use(kernels: CpuKernels | None) -> Iterator[None]:
    """Inside the block (an engine's forward pass), :func:`kernels` answers ``kernels`` (None: unchanged)."""
    if kernels is None:
        yield
        return
    _IN_USE.append(kernels)
    try:
        yield
    finally:
        _IN_USE.pop()


def kernels() -> CpuKernels:
    """The kernels a layer runs: its engine's inside a forward pass; elsewhere (a lesson calling a layer
    by itself) those :func:`choose` picks at this call."""
    return _IN_USE[-1] if _IN_USE else choose()


def wait_built(say: Callable[[str], None]) -> None:
    """Have this machine's kernels built before anything waits for them inside a step (the engine starts
    the build while its weights load): ``say`` what is being waited for, if anything is."""
    if isa() not in _BUILT:
        say("compiling the CPU kernels (once per machine) ...")
        cpu_module()


def _build(level: str):
    if ENV.disable_jit:
        return None
    if level not in cpu_isas():
        raise ValueError(f"this CPU cannot run the {level} kernels (it runs {', '.join(cpu_isas())})")
    try:
        import tvm_ffi.cpp

        # tvm_ffi keys its cache by the root source; the name keys it by every file it includes as well
        texts = b"".join(f.read_bytes() for f in sorted(CSRC.glob("*.[ch]*")) if f.suffix in (".cc", ".h"))
        return tvm_ffi.cpp.load_inline(
            f"minisgl_cpu_{level}_{hashlib.sha256(texts).hexdigest()[:12]}",
            cpp_sources=(CSRC / ROOT).read_text(),
            functions=list(FUNCTIONS),
            extra_cflags=CFLAGS + ISA_FLAGS[level],
            extra_ldflags=["-shared", "-fopenmp"],
            extra_include_paths=[str(CSRC)],
        )
    except Exception as e:  # a missing compiler or headers must not stop the engine
        logger.warning("the C++ CPU kernels (%s) are unavailable (%s); using the torch versions", level, e)
        return None
