"""Lab 16 adapter: ``decode`` and ``merge`` of ``lab16_flash_decoding.py`` (Triton kernels: under the
interpreter on a CPU, compiled on a GPU), and the swap-in that makes the engine's ``triton`` attention
backend decode with them (``DECODE_KERNELS`` / ``use_decode_kernel`` of ``minisgl.attention.triton_backend``).

Triton reports an error inside a kernel as its own exception: the interpreter's ``InterpreterError``
wraps what the kernel raised, a GPU's compiler raises ``CompilationError``. Both become an
``AssertionError`` that names the lab file's line (a stub's ``NotImplementedError`` stays one; the
engine's refusal of its own kernels, ``originality.EngineReference``, passes through unchanged).
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

if not torch.cuda.is_available():  # before triton is first imported: its kernels are defined at import
    os.environ["TRITON_INTERPRET"] = "1"

from autograder import originality  # noqa: E402
from autograder.impl import lab_file, require  # noqa: E402
from minisgl.attention import triton_backend  # noqa: E402

STEM = "lab16_flash_decoding"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _where_in_the_lab(exc: BaseException) -> str:
    """``lab16_flash_decoding.py:LINE in fn(): source`` of the deepest frame of ``exc`` in the lab file."""
    name = lab_file(STEM).name
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if Path(frame.filename).name == name:
            return f"{name}:{frame.lineno} in {frame.name}(): {(frame.line or '').strip()}"
    return ""


def _kernel_failure(exc: BaseException) -> BaseException:
    """What a test should raise for ``exc`` raised by (or around) a Triton kernel of the lab."""
    inner = exc.__cause__ if type(exc).__name__ == "InterpreterError" and exc.__cause__ is not None else exc
    if isinstance(inner, (NotImplementedError, originality.EngineReference, AssertionError)):
        return inner
    where = _where_in_the_lab(inner) or _where_in_the_lab(exc)
    if type(exc).__name__ == "CompilationError":  # a GPU's compiler: its message points at the kernel's line
        lines = [s for s in str(exc).splitlines() if s.strip()][:6]
        return AssertionError("your Triton kernel did not compile:\n" + "\n".join(lines))
    text = str(inner).splitlines()[0][:200] if str(inner) else ""
    return AssertionError(
        f"your kernel raised {type(inner).__name__}: {text}" + (f"\n  at {where}" if where else "") + "\n"
        "hint: tl.arange and block sizes must be powers of two; a load or store of a block needs a mask where "
        "the block runs past the data; a constexpr parameter must be passed by name"
    )


@contextmanager
def kernel_errors() -> Iterator[None]:
    """Triton's own errors (the interpreter's, the compiler's) said readably; the lab's own exceptions (its
    checks' TypeError / ValueError among them) pass through."""
    try:
        yield
    except Exception as e:
        if type(e).__module__.startswith("triton.") and type(e).__name__ in ("InterpreterError", "CompilationError"):
            raise _kernel_failure(e) from None
        raise


def decode(q, k_slots, v_slots, page_table, rows, lens, scale, splits, out=None, partial=None) -> torch.Tensor:
    with kernel_errors():
        return require(STEM, "decode")(q, k_slots, v_slots, page_table, rows, lens, scale, splits, out, partial)


def merge(part, lse, out, splits) -> None:
    with kernel_errors():
        return require(STEM, "merge")(part, lse, out, splits)


def kernel() -> Callable[..., torch.Tensor]:
    """The lab's ``decode`` with the adapter's error reporting (what the engine is given)."""
    require(STEM, "decode")
    return decode


@contextmanager
def engine_decoding_with(fn: Callable[..., torch.Tensor], name: str = "lab16") -> Iterator[None]:
    """``triton`` attention backends made inside the block decode with ``fn``."""
    with triton_backend.DECODE_KERNELS.registered(name, fn), triton_backend.use_decode_kernel(name):
        yield
