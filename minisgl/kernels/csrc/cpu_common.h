// What the CPU kernels share: bfloat16 <-> float32, a tensor's data pointer, a layout check.
#pragma once

#include <tvm/ffi/container/tensor.h>

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace minisgl {

inline float to_f(float v) { return v; }
inline float to_f(uint16_t b) {  // bfloat16 bits: the top half of a float32
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

template <typename T>
T from_f(float x);
template <>
inline float from_f<float>(float x) {
  return x;
}
template <>
inline uint16_t from_f<uint16_t>(float x) {  // round to nearest even; NaN stays NaN
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

template <typename T>
T* ptr(const tvm::ffi::TensorView& t) {
  return reinterpret_cast<T*>(static_cast<char*>(t.data_ptr()) + t.byte_offset());
}

// Laid out row after row with no gaps. Not TensorView::IsContiguous: torch calls a tensor contiguous
// whatever the stride of a dimension of size 1 (a [1, d] row sliced out of a wider one), and so do we.
inline bool dense(const tvm::ffi::TensorView& t) {
  int64_t expect = 1;
  for (int i = t.ndim() - 1; i >= 0; --i) {
    if (t.size(i) != 1 && t.stride(i) != expect) return false;
    expect *= t.size(i);
  }
  return true;
}

inline bool is_index(const tvm::ffi::TensorView& t) {  // positions, slots: int32 or int64
  return t.dtype().code == kDLInt && (t.dtype().bits == 32 || t.dtype().bits == 64);
}
inline int64_t index_at(const tvm::ffi::TensorView& t, int64_t i) {
  return t.dtype().bits == 64 ? ptr<int64_t>(t)[i] : ptr<int32_t>(t)[i];
}

inline bool is_f32(const DLDataType& t) { return t.code == kDLFloat && t.bits == 32; }
inline bool is_bf16(const DLDataType& t) { return t.code == kDLBfloat && t.bits == 16; }

#if defined(__AVX512F__)
// 16 elements from i on (fewer at the end of a row: masked, the rest read as zeros) as float32
inline __m512 load16(const float* p, int64_t n) {
  return _mm512_maskz_loadu_ps(n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1), p);
}
inline __m512 load16(const uint16_t* p, int64_t n) {  // bf16 -> float32: the bits shifted up
  const __m256i b = _mm256_maskz_loadu_epi16(n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1), p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}

// exp(x) for 16 lanes: 2^n * p(r), x = n ln2 + r, |r| <= ln2 / 2, p a degree-7 Taylor polynomial
// (relative error < 2e-7, about an ulp); below -87 the result is 0 (expf's would be denormal or 0),
// above 88.7 inf
inline __m512 exp16(__m512 x) {
  const __m512 low = _mm512_set1_ps(-87.0f);
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, low, _CMP_LT_OQ);
  x = _mm512_max_ps(x, low);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);  // ln2 in two parts: r exact
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_maskz_mov_ps(~tiny, _mm512_scalef_ps(p, n));
}

// 16 float32 values rounded to T (round to nearest even for bfloat16, as from_f), still as float32
inline __m512 round16(__m512 x, float) { return x; }
inline __m512 round16(__m512 x, uint16_t) {
  const __m512i b = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_and_si512(_mm512_add_epi32(b, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd)),
                               _mm512_set1_epi32(int(0xFFFF0000u)));
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);  // NaN stays NaN (quiet)
  r = _mm512_mask_mov_epi32(r, nan, _mm512_and_si512(_mm512_or_si512(b, _mm512_set1_epi32(0x400000)),
                                                     _mm512_set1_epi32(int(0xFFFF0000u))));
  return _mm512_castsi512_ps(r);
}
// 16 values already rounded to T's values (round16), stored as T
inline void store16(float* p, __m512 x) { _mm512_storeu_ps(p, x); }
inline void store16(uint16_t* p, __m512 x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(x), 16)));
}
#endif

}  // namespace minisgl
