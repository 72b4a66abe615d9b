"""Lab 13 adapter: the ``paged_decode_attention`` of ``lab13_jit_kernel.py`` (a C++ kernel built
through ``tvm_ffi.cpp.load_inline``) and its compiled ``paged_decode``, and the swap-in that makes the
engine's decode attention run it (``DECODE_KERNELS`` / ``use_decode_kernel`` of
``minisgl.kernels.paged_attention``).

The build happens on the first call. A C++ compile error becomes an ``AssertionError`` that shows
the compiler's first error lines, so every test fails with it instead of crashing the grader. A
build that compiles the engine's own C++ (its ``csrc/`` files, included or pasted) is refused as the
engine's implementation: the lab scores 0."""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from autograder import originality
from autograder.impl import require
from minisgl.kernels import paged_attention

STEM = "lab13_jit_kernel"
CSRC = Path(paged_attention.__file__).resolve().parent / "csrc"
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


def _engine_lines() -> set[str]:
    """The distinctive lines of the engine's C++ CPU kernels (long enough not to be boilerplate; not
    those of its shared helpers, ``cpu_common.h``, whose bfloat16 conversions the lab's ``CPP_HEADER``
    gives too)."""
    lines = lambda f: {s.strip() for s in f.read_text().splitlines() if len(s.strip()) >= 40}  # noqa: E731
    kernels = set().union(*(lines(f) for f in CSRC.glob("*.cc")))
    return kernels - lines(CSRC / "cpu_common.h")


def engine_source_used(source: object, include_paths: object = None) -> str | None:
    """Why ``source`` (with these include paths) compiles the engine's own C++, or None: an include
    path into ``minisgl/kernels``, an ``#include`` of one of its files, or three of its lines."""
    for p in [include_paths] if isinstance(include_paths, str | Path) else list(include_paths or []):
        if Path(p).resolve() == CSRC or CSRC in Path(p).resolve().parents or Path(p).resolve() == CSRC.parent:
            return f"an include path into the engine's kernels ({p})"
    texts = [source] if isinstance(source, str) else [s for s in (source or []) if isinstance(s, str)]
    names = {f.name for f in CSRC.glob("*")}
    engine = _engine_lines()
    for text in texts:
        for m in re.finditer(r'#\s*include\s*[<"]([^>"]+)[>"]', text):
            if Path(m.group(1)).name in names:
                return f"#include of the engine's {Path(m.group(1)).name}"
        shared = [s.strip() for s in text.splitlines() if s.strip() in engine]
        if len(shared) >= 3:
            return f"lines of the engine's C++ sources (for one: {shared[0][:60]!r})"
    return None


_LIBRARY = (".so", ".dylib", ".dll", ".pyd")


def _engine_library(path: Path) -> str | None:
    """Why the shared library at ``path`` is the engine's compiled C++ (its name, or the same bytes as a
    library the engine built: tvm_ffi names the engine's ``minisgl_cpu_<level>_<hash>``), or None."""
    if path.name.startswith("minisgl_"):
        return f"the engine's library {path.name}"
    cache = Path(os.environ.get("TVM_FFI_CACHE_DIR", Path.home() / ".cache" / "tvm-ffi"))
    try:
        size, digest = path.stat().st_size, None
        for built in cache.glob("minisgl_*/*"):
            if built.suffix in _LIBRARY and built.stat().st_size == size:
                digest = digest or hashlib.sha256(path.read_bytes()).hexdigest()
                if hashlib.sha256(built.read_bytes()).hexdigest() == digest:
                    return f"a copy of the engine's library {built.name}"
    except OSError:
        return None
    return None


def engine_build_used(args: tuple, kwargs: dict) -> str | None:
    """Why a loader call (``tvm_ffi.cpp.load_inline`` / ``build_inline`` / ``build`` / ``load``,
    ``tvm_ffi.load_module``, ``ctypes.CDLL``, torch's extension loaders) compiles or loads the engine's
    own C++, or None: its sources, source files, include paths and libraries are looked at
    (``originality.LABS["lab13"]`` watches these loaders for lab code)."""
    texts: list[str] = []
    includes = kwargs.get("extra_include_paths")
    why = engine_source_used("", includes)
    if why:
        return why
    values = list(args) + [v for k, v in kwargs.items() if k not in ("extra_include_paths", "extra_cflags")]
    for value in values:
        for item in [value] if isinstance(value, str | os.PathLike) else list(value or []) if _iterable(value) else []:
            if not isinstance(item, str | os.PathLike):
                continue
            text = os.fspath(item)
            path = Path(text) if len(text) < 4096 and "\n" not in text else None
            if path is not None and path.suffix in _LIBRARY:
                why = _engine_library(path.resolve()) if path.exists() else None
                if why:
                    return why
            elif path is not None and path.exists() and path.is_file():
                if path.resolve().parent == CSRC:
                    return f"the engine's source file {path.name}"
                try:
                    texts.append(path.read_text(errors="replace"))
                except OSError:
                    pass
            else:
                texts.append(text)
    return engine_source_used(texts)


def _iterable(value: object) -> bool:
    return isinstance(value, list | tuple | set | dict)


def _refuse_engine(why: str) -> originality.EngineReference:
    return originality._refuse(
        f"your build compiles or loads the engine's own C++ ({why}): the lab asks you to write the kernel, not to "
        "build minisgl/kernels/csrc (graded 0 until then)"
    )


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
    # while grading, every loader refuses the engine's C++ for lab code (originality.LABS["lab13"])
    source = require(STEM, "cpp_source")()
    why = engine_source_used(source)
    if why:
        raise _refuse_engine(why)
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
            "data_ptr, byte_offset, dtype, ndim), a template argument or a missing #include are the usual causes"
        )
        if failed is not None and "error:" in str(e):  # a compiler's verdict, not a missing tool
            failed.parent.mkdir(parents=True, exist_ok=True)
            failed.write_text(message)
        raise CompileError(message) from None


def paged_decode(q, k, v, slots, lens, out, scale: float) -> None:
    """The compiled C++ ``paged_decode`` itself (the checks and the in-place write)."""
    build().paged_decode(q, k, v, slots, lens, out, scale)


def kernel() -> Callable[..., torch.Tensor]:
    """The student's ``paged_decode_attention``, after a build (so a compile error is reported as
    such); the speed test times this function itself, without the adapter's checks."""
    build()
    return require(STEM, "paged_decode_attention")


def paged_decode_attention(q, k_pool, v_pool, slots, lens, scale: float) -> torch.Tensor:
    return kernel()(q, k_pool, v_pool, slots, lens, scale)


@contextmanager
def engine_decoding_with(fn: Callable[..., torch.Tensor], name: str = "lab13") -> Iterator[None]:
    """The engine's CPU decode attention runs ``fn`` inside the block."""
    with paged_attention.DECODE_KERNELS.registered(name, fn), paged_attention.use_decode_kernel(name):
        yield
