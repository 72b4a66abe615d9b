"""Lab 13 adapter: the ``prefix_len`` of ``lab13_jit_kernel.py`` (a C++ kernel built through
``tvm_ffi.cpp.load_inline``), and the swap-in that lets the engine's radix cache compare its keys
with it: a ``RadixPrefixCache`` whose ``prefix_len`` is the student's, registered in
``minisgl.kvcache.PREFIX_CACHES`` as ``"lab13"``.

The build happens on the first call. A C++ compile error becomes an ``AssertionError`` that shows
the compiler's first error lines, so every test fails with it instead of crashing the grader."""

from __future__ import annotations

import hashlib
import re
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from autograder.impl import require
from minisgl.kvcache import PREFIX_CACHES, RadixPrefixCache
from minisgl.kvcache.radix import common_prefix_len

STEM = "lab13_jit_kernel"
_ERROR = re.compile(r"\berror\b", re.IGNORECASE)


class CompileError(AssertionError):
    pass


def compiler_errors(message: str, source: str = "", lines: int = 6) -> str:
    """The first lines of a compiler's output that matter: each ``error:`` line and the source line
    it points at (ninja's command lines dropped), with the file's line numbers turned into lines of
    ``source`` where it can tell (tvm_ffi compiles ``main.cpp``: a few lines of its own, then the source)."""
    text = message.splitlines()
    offset = None
    path = next((m.group(1) for line in text if (m := re.search(r"(\S*main\.cpp):\d+", line))), None)
    if path and source:
        try:
            whole = Path(path).read_text()
            offset = whole[: whole.index(source)].count("\n") if source in whole else None
        except OSError:
            pass

    def where(m: re.Match) -> str:
        line = int(m.group(1))
        return f"cpp_source() line {line - offset}:" if offset is not None else f"main.cpp line {line}:"

    out: list[str] = []
    for i, line in enumerate(text):
        if _ERROR.search(line) and not line.startswith(("c++ ", "FAILED:", "ninja", "[")):
            out.append(re.sub(r"\S*main\.cpp:(\d+):(?:\d+:)?", where, line.strip()))
            out += [
                re.sub(r"^\s*\d+ \|", "    |", s.rstrip()) for s in text[i + 1 : i + 3] if re.match(r"\s*\d+ \|", s)
            ]
        if len(out) >= lines:
            break
    return "\n".join(out[:lines]) or "\n".join(text[-lines:])


def _failure_file(source: str) -> Path:
    """Where a failed compile of ``source`` is remembered: every test runs in its own process, and a
    source that did not compile fails the same way again, so later tests report it without the
    seconds of a second compile."""
    return Path(tempfile.gettempdir()) / "minisgl-lab13" / f"{hashlib.sha256(source.encode()).hexdigest()}.txt"


_built: list[object] = []  # the module, once built in this process (each test runs in a process of its own)


def build() -> object:
    """The student's compiled module (``build()`` of the lab file); a compile error is an
    ``AssertionError`` with the compiler's first errors and a hint."""
    if _built:
        return _built[0]
    source = require(STEM, "cpp_source")()
    failed = _failure_file(source) if isinstance(source, str) else None
    if failed is not None and failed.exists():
        raise CompileError(failed.read_text())
    try:
        _built.append(require(STEM, "build")())
        return _built[0]
    except FileNotFoundError as e:  # tvm_ffi runs ninja, which runs the compiler
        raise AssertionError(
            f"the C++ build could not start ({e}): lab 13 needs a C++ compiler and ninja (the README says how "
            "to install them)"
        ) from None
    except RuntimeError as e:
        if "ninja" not in str(e) and "error" not in str(e):
            raise
        message = (
            "your C++ source did not compile. The compiler's first errors:\n"
            f"{compiler_errors(str(e), source if isinstance(source, str) else '')}\n"
            "hint: read the first error; a missing ';' or '}', a misspelt TensorView method (size, stride, "
            "data_ptr, byte_offset, dtype, ndim) or a missing #include are the usual causes"
        )
        if failed is not None and "error:" in str(e):  # a compiler's verdict, not a missing tool
            failed.parent.mkdir(parents=True, exist_ok=True)
            failed.write_text(message)
        raise CompileError(message) from None


def kernel() -> Callable[[torch.Tensor, torch.Tensor], int]:
    """The student's ``prefix_len``, after a build (so a compile error is reported as such); the speed
    test times this function itself, without the adapter's checks."""
    build()
    return require(STEM, "prefix_len")


def prefix_len(a: torch.Tensor, b: torch.Tensor) -> int:
    return kernel()(a, b)


def as_tensor(ids: list[int]) -> torch.Tensor:
    """A list of token ids as a 1-D int64 tensor (the cheapest way: a numpy array, shared with torch)."""
    return torch.from_numpy(np.fromiter(ids, dtype=np.int64, count=len(ids)))


def kernel_cache_class(fn: Callable[[torch.Tensor, torch.Tensor], int] | None = None) -> type[RadixPrefixCache]:
    """The engine's radix cache comparing its (list) keys with ``fn`` (default: the student's
    ``prefix_len``); ``calls`` counts the compares. A compare that disagrees with the engine's raises
    ``AssertionError`` where it happens: a wrong length can send the tree walk round forever."""
    fn = fn or prefix_len

    class KernelRadixCache(RadixPrefixCache):
        calls = 0

        @staticmethod
        def prefix_len(a: list[int], b: list[int]) -> int:
            KernelRadixCache.calls += 1
            got, want = fn(as_tensor(a), as_tensor(b)), common_prefix_len(a, b)
            if got != want:
                shown = lambda x: x if len(x) <= 8 else f"{len(x)} ids {x[:4]}..."  # noqa: E731
                raise AssertionError(
                    f"inside the engine, prefix_len({shown(a)}, {shown(b)}) returned {got!r}, expected {want} "
                    "(two radix keys, as int64 tensors)"
                )
            return got

    return KernelRadixCache


@contextmanager
def registered_cache(cls: type[RadixPrefixCache], name: str = "lab13") -> Iterator[str]:
    """``cls`` as the engine's ``cache_type=name`` inside the block; yields the name."""
    with PREFIX_CACHES.registered(name, cls):
        yield name
