"""Lab 13: a C++ kernel through TVM FFI, the radix cache's key compare.

The radix cache compares token keys all the time: ``prefix_len(a, b)`` is the length of the
longest common prefix of two token arrays. In Python that costs tens of microseconds per thousand
tokens (every element is a boxed ``int``); in C++ over the raw int64 buffer it is a tight loop.
You write that loop in C++, compile it at run time with ``tvm_ffi.cpp.load_inline`` and call it on
torch tensors, which reach C++ through DLPack without a copy (``tvm::ffi::TensorView``)::

    a = [5 9 2 7 7 1]
    b = [5 9 2 4]          prefix_len(a, b) -> 3      (a[:3] == b[:3], a[3] != b[3])
    b = [5 9]              prefix_len(a, b) -> 2      (no mismatch: the shorter length)

Contract (the grader compares every result with the engine's Python compare on lists; the engine's
own compare is off limits here: a lab that aliases or calls it is graded 0):

* ``cpp_source()`` returns the C++ source text: ``CPP_HEADER`` followed by your function
  ``int64_t prefix_len(tvm::ffi::TensorView a, tvm::ffi::TensorView b)``.
* ``build(source)`` compiles ``source`` with ``tvm_ffi.cpp.load_inline`` (module name ``NAME``,
  exported function ``prefix_len``, ``-O3``) and returns the module. ``build()`` builds
  ``cpp_source()``. Each distinct source is compiled once per process (``_BUILT``); tvm_ffi also
  keeps the compiled library on disk, keyed by the name and a hash of the source, so a second
  process loads it in milliseconds.
* ``prefix_len(a, b)`` takes two 1-D int64 CPU tensors of any lengths (0 included) and any
  stride (``x[::2]``, a column of a matrix) and returns, as a Python ``int``, the largest
  ``i <= min(len(a), len(b))`` with ``a[:i] == b[:i]``. Token ids are full 64-bit values. It
  reads the tensors in place: no copy, no conversion (the grader times it against the Python
  compare: at least 5x faster on 32k tokens). Anything but two 1-D int64 tensors raises
  ``ValueError`` or ``TypeError`` (``TVM_FFI_THROW(ValueError) << "..."`` raises a Python
  ``ValueError``): each tensor is checked on its own (its ndim, and its whole dtype: type code,
  bits and lanes), before anything else (an empty int32 tensor raises too).
* The engine's radix cache keeps its keys as lists; the grader's swap-in converts both keys to
  int64 tensors and calls your ``prefix_len`` from ``RadixPrefixCache.prefix_len`` (lesson 13
  measures what that conversion costs).

A ``TensorView``'s element ``i`` is at ``data_ptr() + byte_offset()`` plus ``i * stride(0)``
*elements*; ``size(0)`` is its length, ``dtype()`` a ``DLDataType`` (``{kDLInt, 64, 1}`` for int64).

Pitfalls the grader recognises (its messages name them):

* the end: an off-by-one that stops one element early (a full match comes out one short) or
  counts the mismatching element;
* reading past the shorter array (a loop bound from one tensor only): past its end lies memory
  that is not its data, and may even continue the match;
* int32 token ids: comparing through ``int`` or ``int32_t`` truncates ids above 2^31, and ids that
  differ only in their high bits compare equal;
* strides: assuming a contiguous tensor (``x[::2]`` then reads the wrong elements), or that both
  tensors share one layout (each has its own ``stride(0)``; a contiguous fast path needs both);
* no mismatch: the answer is the shorter length, not 0 or -1 (a "not found" sentinel) nor the longer
  length;
* dtype: an int32 tensor read as int64 (check the dtype of each tensor and raise);
* speed: a Python loop or ``.tolist()`` inside ``prefix_len`` (correct, but no faster than Python);
* a C++ compile error: the grader shows the compiler's first error lines.

Grading: ``python -m autograder lab13`` runs fixed edge cases, random arrays against the Python
compare, the speed check, and the engine with the radix cache comparing keys through your kernel.
"""

from __future__ import annotations

from typing import Any

import torch

NAME = "lab13_prefix_len"

CPP_HEADER = r"""
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>

#include <cstdint>

using tvm::ffi::TensorView;
"""


def cpp_source() -> str:
    """The C++ source of ``prefix_len``: ``CPP_HEADER`` followed by your function, shaped like

        int64_t prefix_len(TensorView a, TensorView b) {
          // 1. two 1-D int64 tensors, else TVM_FFI_THROW(ValueError or TypeError) << "why";
          // 2. n = the shorter length; element i of a is at (its first element) + i * a.stride(0)
          // 3. count equal elements from the start; stop at the first difference, or at n
        }

    and returned as one string: ``CPP_HEADER + r'''...'''``."""
    # BEGIN SOLUTION hint="return CPP_HEADER + the C++ text of prefix_len (see the docstring)"
    return (
        CPP_HEADER
        + r"""
// the address of element 0 of a 1-D int64 tensor (a view may start inside its buffer)
static const int64_t* first(const TensorView& t) {
  return reinterpret_cast<const int64_t*>(static_cast<const char*>(t.data_ptr()) + t.byte_offset());
}

int64_t prefix_len(TensorView a, TensorView b) {  // a, b: 1-D int64, any stride
  const DLDataType i64{kDLInt, 64, 1};
  if (a.ndim() != 1 || b.ndim() != 1) TVM_FFI_THROW(ValueError) << "prefix_len takes two 1-D tensors";
  if (a.dtype() != i64 || b.dtype() != i64) TVM_FFI_THROW(TypeError) << "prefix_len takes int64 tensors";
  const int64_t n = a.size(0) < b.size(0) ? a.size(0) : b.size(0);
  const int64_t sa = a.stride(0), sb = b.stride(0);
  const int64_t* pa = first(a);
  const int64_t* pb = first(b);
  int64_t i = 0;
  if (sa == 1 && sb == 1) {
    while (i < n && pa[i] == pb[i]) ++i;  // the common case: contiguous keys
  } else {
    while (i < n && pa[i * sa] == pb[i * sb]) ++i;
  }
  return i;
}
"""
    )
    # END SOLUTION


_BUILT: dict[str, Any] = {}  # source text -> compiled module


def build(source: str | None = None):
    """Compile ``source`` (default ``cpp_source()``) once per process and return the module; a
    compile error raises (the compiler's output is in the message)."""
    source = cpp_source() if source is None else source
    if source not in _BUILT:
        # BEGIN SOLUTION hint="compile source with tvm_ffi.cpp.load_inline (see the docstring) into _BUILT[source]"
        import tvm_ffi.cpp

        _BUILT[source] = tvm_ffi.cpp.load_inline(
            NAME, cpp_sources=source, functions=["prefix_len"], extra_cflags=["-O3"]
        )
        # END SOLUTION
    return _BUILT[source]


def prefix_len(a: torch.Tensor, b: torch.Tensor) -> int:
    """Length of the longest common prefix of two 1-D int64 tensors, computed by the C++ kernel."""
    # BEGIN SOLUTION hint="call the compiled prefix_len on the tensors themselves; return an int"
    return int(build().prefix_len(a, b))
    # END SOLUTION
