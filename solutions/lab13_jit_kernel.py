"""Lab 13: a C++ kernel through TVM FFI, the engine's paged decode attention on the CPU.

At every decode step each layer attends one new query per request over that request's cached keys.
The keys lie in the KV pool wherever the page table put them; the torch path
(``minisgl.kernels.paged_attention.paged_decode_attention_torch``) first *gathers* them into a dense
``[B, Lmax, kv_heads, head_dim]`` copy (K and V, every layer, every step) and then multiplies. Lesson
13 measures that the copy costs more than the arithmetic. You write the kernel that reads each K/V
row where it lies, through the slot list, in C++, compile it at run time with
``tvm_ffi.cpp.load_inline`` and call it on torch tensors (they reach C++ through DLPack without a
copy, as ``tvm::ffi::TensorView``)::

    slots[b] = [ 7  8  9 10 | 3  4  . . ]   lens[b] = 6    (pages of 4; "." = padding)
    out[b, h] = sum_j softmax_j(q[b, h] . k[slots[b, j], g] * scale) v[slots[b, j], g],  j < lens[b]
    g: the KV head of query head h (grouped-query attention: H query heads share Hkv KV heads in order,
       the first H / Hkv of them KV head 0, the next H / Hkv KV head 1, ...)

Contract (the grader compares every result with the torch reference in float64; the engine's own
kernels are off limits here: a lab that calls, aliases or compiles them is graded 0):

* ``cpp_source()`` returns the C++ source text: ``CPP_HEADER`` followed by your code, which defines
  the exported function ``paged_decode``. Its parameters, in this order: ``q``, ``k``, ``v``,
  ``slots``, ``lens``, ``out``, each a ``TensorView``, then ``scale``, a ``double``; it returns nothing
  and writes ``out`` in place. (The grader calls it with exactly these seven arguments.)
* ``build(source)`` compiles ``source`` with ``tvm_ffi.cpp.load_inline`` (module name ``NAME``,
  exported function ``paged_decode``, ``extra_cflags=CFLAGS``) and returns the module. ``build()``
  builds ``cpp_source()``. Each distinct source is compiled once per process (``_BUILT``); tvm_ffi
  also keeps the library on disk, keyed by the name and a hash of the source and flags.
* ``paged_decode_attention(q, k_pool, v_pool, slots, lens, scale)`` is a ``DecodeKernel`` (see
  ``minisgl/kernels/paged_attention.py``): it allocates ``out`` (``[B, H, D]``, q's dtype,
  contiguous), runs the compiled ``paged_decode`` on the tensors as they are (no copy of the pool,
  no torch math) and returns ``out``. ``out``'s layout is its own: element ``(b, h, d)`` of the new
  contiguous tensor, whatever q's strides are. The grader plugs it into the engine through
  ``DECODE_KERNELS`` / ``use_decode_kernel`` and times it against the best torch version on the same
  machine (the faster of the engine's torch path and ``scaled_dot_product_attention`` on the gathered
  rows): at least 1.25x faster on one thread (the reference is about 1.6x faster).
* The tensors: ``q`` ``[B, H, D]`` in any strides (a view into each request's row of a fused qkv
  projection has ``q.stride(0) != H * D``; a head-major one ``q.stride(1) != D``); ``k``, ``v`` ``[S, Hkv, D]``
  (one layer of the pool, indexed by slot), ``out`` ``[B, H, D]``, ``slots`` ``[B, Lmax]`` int64 and
  ``lens`` ``[B]`` int32, all contiguous. ``q``, ``k``, ``v``, ``out`` share one dtype, float32 or
  bfloat16 (``uint16_t`` bits in C++: read with ``to_f``, write with ``put``, which rounds to nearest
  even); accumulate in float32. Scores are ``q . k * scale``; the softmax subtracts the row's maximum
  first (``exp`` of a score of 100 is already inf in float32).
* Request ``b`` attends to its first ``lens[b]`` slots only: ``slots[b, j]`` for ``j >= lens[b]``
  is padding. Any ``1 <= lens[b] <= Lmax`` is valid (a sequence that ends exactly on a page boundary,
  one token, a row filled to ``Lmax``).
* Checks, all before anything is read from the data or written to ``out`` (a refused call leaves
  ``out`` as it was): ``TypeError`` when q's dtype is not float32 or bfloat16, when ``k``, ``v`` or
  ``out`` (each on its own) has another dtype than q, when ``slots`` is not int64 or ``lens`` not
  int32; ``ValueError`` for a wrong ndim, ``k`` and ``v`` of different shapes, ``out`` not q's
  shape, ``k.size(2) != D``, ``H`` not a multiple of ``Hkv``, ``slots``/``lens`` not ``B`` rows, a
  tensor among k, v, out, slots, lens that is not contiguous (``dense``), a ``lens[b]`` outside
  ``[1, Lmax]``, and a slot that request ``b`` reads (``j < lens[b]``) outside ``[0, S)`` (each
  slot: reading past the pool reads memory that is not its data). ``TVM_FFI_THROW(ValueError) <<
  "..."`` raises a Python ``ValueError``.

A ``TensorView``'s element ``(i, j, ...)`` is at ``first<T>(t)`` plus ``i * t.stride(0) + j *
t.stride(1) + ...`` *elements*; ``size(i)``, ``ndim()``, ``dtype()`` (a ``DLDataType``: ``{kDLFloat,
32, 1}`` is float32, ``{kDLBfloat, 16, 1}`` bfloat16) describe it.

Pitfalls the grader recognises (its messages name them):

* padding: attending over all ``Lmax`` slots of the row instead of the first ``lens[b]``;
* grouped-query heads: the query heads of one KV head taken round-robin (head ``h`` reading KV head
  ``h % Hkv``: another model's layout) instead of in order;
* the softmax without its maximum subtracted: large scores overflow to inf and the output is NaN;
* q's strides: reading q as if it were contiguous (a view of wider rows, or head-major), or writing
  ``out`` at q's strides (past the end of ``out`` when q is a view of wider rows: the grader then sees
  the writes outside ``out``, which would otherwise corrupt the heap and crash the process);
* one slot row for all: every request reading the slots of request 0;
* the order of the checks: a ``lens`` or slot check inside the attention loop raises after earlier
  requests' outputs were written;
* speed: torch (a gather, ``.contiguous()`` of the pool, a matmul) inside ``paged_decode_attention``
  is correct and no faster than the torch path;
* a C++ compile error: the grader shows the compiler's first error lines.

Grading: ``python -m autograder lab13`` runs fixed cases (each pitfall, both dtypes, the boundary
lengths, page sizes 1, 4 and 16), random batches against the reference, the checks one argument at a
time, the speed check, and the engine decoding with your kernel (the same greedy tokens as the
engine's torch path).
"""

from __future__ import annotations

from typing import Any

import torch

NAME = "lab13_paged_decode"
CFLAGS = ["-O3", "-march=native", "-fopenmp-simd"]  # `#pragma omp simd` vectorises a float sum

CPP_HEADER = r"""
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

using tvm::ffi::TensorView;

// the address of element 0 of t (a view may start inside its buffer)
template <class T>
T* first(const TensorView& t) {
  return reinterpret_cast<T*>(static_cast<char*>(t.data_ptr()) + t.byte_offset());
}

// float32 and bfloat16 (uint16_t bits: the top half of a float32) as float, and back
inline float to_f(float x) { return x; }
inline float to_f(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline void put(float* p, float x) { *p = x; }
inline void put(uint16_t* p, float x) {  // round to nearest even; NaN stays NaN
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
    *p = static_cast<uint16_t>((bits >> 16) | 0x40);
    return;
  }
  bits += 0x7FFF + ((bits >> 16) & 1);
  *p = static_cast<uint16_t>(bits >> 16);
}

// laid out row after row with no gaps (as torch's is_contiguous: a dimension of size 1 has any stride)
inline bool dense(const TensorView& t) {
  int64_t expect = 1;
  for (int i = t.ndim() - 1; i >= 0; --i) {
    if (t.size(i) != 1 && t.stride(i) != expect) return false;
    expect *= t.size(i);
  }
  return true;
}

inline bool same_shape(const TensorView& a, const TensorView& b) {
  if (a.ndim() != b.ndim()) return false;
  for (int i = 0; i < a.ndim(); ++i)
    if (a.size(i) != b.size(i)) return false;
  return true;
}
"""


def cpp_source() -> str:
    """The C++ source text: ``CPP_HEADER`` followed by your code, which defines ``paged_decode`` (the
    module docstring states its parameters, its checks and what it writes), as one string. The
    header's ``to_f`` and ``put`` read and write both dtypes (``float``, and ``uint16_t`` for bfloat16's
    bits), so one C++ template can serve the two."""
    # BEGIN SOLUTION what="the C++ source of paged_decode: its checks, then the attention of every request and query head" hint="CPP_HEADER + a template attend<T> (T float or uint16_t) looping over requests and heads: scores over the first lens[b] slots, softmax with the maximum subtracted, the weighted sum of V rows, written with put(); then paged_decode: every check first (TVM_FFI_THROW), then attend<float> or attend<uint16_t>"
    return (
        CPP_HEADER
        + r"""
template <typename T>
void attend(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& slots,
            const TensorView& lens, const TensorView& out, float scale) {
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), Hkv = k.size(1), Lmax = slots.size(1);
  const T *kp = first<T>(k), *vp = first<T>(v);
  const int64_t* sp = first<int64_t>(slots);
  std::vector<float> qf(D), s(Lmax), acc(D);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t L = first<int32_t>(lens)[b];
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / Hkv);  // the KV head of query head h
      const T* qh = first<T>(q) + b * q.stride(0) + h * q.stride(1);
      for (int64_t d = 0; d < D; ++d) qf[d] = to_f(qh[d * q.stride(2)]) * scale;
      float m = -INFINITY;
      for (int64_t j = 0; j < L; ++j) {
        const T* kr = kp + (sp[b * Lmax + j] * Hkv + g) * D;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < D; ++d) dot += qf[d] * to_f(kr[d]);
        s[j] = dot;
        m = std::max(m, dot);
      }
      float sum = 0.0f;  // exp(s - m) <= 1: no overflow whatever the scores
      for (int64_t j = 0; j < L; ++j) sum += (s[j] = std::exp(s[j] - m));
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < L; ++j) {
        const T* vr = vp + (sp[b * Lmax + j] * Hkv + g) * D;
        const float w = s[j];
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) acc[d] += w * to_f(vr[d]);
      }
      T* o = first<T>(out) + (b * H + h) * D;
      for (int64_t d = 0; d < D; ++d) put(o + d, acc[d] / sum);
    }
  }
}

void paged_decode(TensorView q, TensorView k, TensorView v, TensorView slots, TensorView lens, TensorView out,
                  double scale) {
  const DLDataType dt = q.dtype(), f32{kDLFloat, 32, 1}, bf16{kDLBfloat, 16, 1};
  if (dt != f32 && dt != bf16) TVM_FFI_THROW(TypeError) << "q must be float32 or bfloat16";
  if (k.dtype() != dt || v.dtype() != dt || out.dtype() != dt) TVM_FFI_THROW(TypeError) << "k, v, out: q's dtype";
  if (slots.dtype() != DLDataType{kDLInt, 64, 1} || lens.dtype() != DLDataType{kDLInt, 32, 1})
    TVM_FFI_THROW(TypeError) << "slots must be int64, lens int32";
  if (q.ndim() != 3 || k.ndim() != 3 || out.ndim() != 3 || slots.ndim() != 2 || lens.ndim() != 1)
    TVM_FFI_THROW(ValueError) << "q, k, v, out are 3-D, slots 2-D, lens 1-D";
  const int64_t B = q.size(0), H = q.size(1), S = k.size(0), Hkv = k.size(1), Lmax = slots.size(1);
  if (!same_shape(k, v) || !same_shape(q, out) || k.size(2) != q.size(2)) TVM_FFI_THROW(ValueError) << "shapes";
  if (Hkv < 1 || H % Hkv != 0) TVM_FFI_THROW(ValueError) << "H must be a multiple of Hkv";
  if (slots.size(0) != B || lens.size(0) != B) TVM_FFI_THROW(ValueError) << "slots and lens need B rows";
  if (!dense(k) || !dense(v) || !dense(out) || !dense(slots) || !dense(lens)) TVM_FFI_THROW(ValueError) << "dense";
  const int32_t* lp = first<int32_t>(lens);
  const int64_t* sp = first<int64_t>(slots);
  for (int64_t b = 0; b < B; ++b) {
    if (lp[b] < 1 || lp[b] > Lmax) TVM_FFI_THROW(ValueError) << "lens[" << b << "] = " << lp[b] << " not in [1, Lmax]";
    for (int64_t j = 0; j < lp[b]; ++j)
      if (sp[b * Lmax + j] < 0 || sp[b * Lmax + j] >= S) TVM_FFI_THROW(ValueError) << "a slot outside the pool";
  }
  if (dt == f32) return attend<float>(q, k, v, slots, lens, out, static_cast<float>(scale));
  attend<uint16_t>(q, k, v, slots, lens, out, static_cast<float>(scale));
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
        import tvm_ffi.cpp

        # BEGIN SOLUTION what="the compiled module of source, kept in _BUILT" hint="tvm_ffi.cpp.load_inline(NAME, cpp_sources=source, functions=[...], extra_cflags=CFLAGS)"
        _BUILT[source] = tvm_ffi.cpp.load_inline(
            NAME, cpp_sources=source, functions=["paged_decode"], extra_cflags=CFLAGS
        )
        # END SOLUTION
    return _BUILT[source]


def paged_decode_attention(
    q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor, lens: torch.Tensor, scale: float
) -> torch.Tensor:
    """Decode attention of ``q`` ``[B, H, D]`` over the pool's rows ``slots`` (``lens[b]`` of row b),
    computed by the C++ kernel into a new ``[B, H, D]`` tensor of q's dtype."""
    # BEGIN SOLUTION what="the kernel's output for these tensors, computed by the compiled paged_decode" hint="allocate out (q's shape and dtype), call build().paged_decode on the tensors as they are, return out"
    out = torch.empty(q.shape, dtype=q.dtype)
    build().paged_decode(q, k_pool, v_pool, slots, lens, out, scale)
    return out
    # END SOLUTION
