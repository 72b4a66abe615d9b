// Paged decode attention on the CPU: one query token per request, its keys and values read in
// place from the KV pool through the request's slot list (no gathered copy of K/V).
//
//   q      [B, H, D]        the new tokens' queries (float32 or bfloat16)
//   k, v   [S, Hkv, D]      the pool of one layer, indexed by slot
//   slots  [B, Lmax] int64  slots[b, j] = slot of token j of request b (j < lens[b])
//   lens   [B] int32        tokens each request attends to (its cached sequence + the new one)
//   out    [B, H, D]        softmax(q k^T * scale) v, per request and head (GQA: head h reads kv
//                           head h / (H / Hkv))
//
// Work is split over (request, query head); AVX-512 where the CPU has it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu_common.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

using namespace minisgl;
using tvm::ffi::TensorView;

#if defined(__AVX512F__)
// 16 elements from i on (fewer at the end of a row: masked, the rest read as zeros) as float32
inline __m512 load16(const float* p, int64_t n) {
  return _mm512_maskz_loadu_ps(n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1), p);
}
inline __m512 load16(const uint16_t* p, int64_t n) {  // bf16 -> float32: the bits shifted up
  const __m256i b = _mm256_maskz_loadu_epi16(n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1), p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}
#endif

// q . row over D elements (q in float32)
template <typename T>
inline float dot(const float* q, const T* row, int64_t D) {
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; d += 16) acc = _mm512_fmadd_ps(load16(q + d, D - d), load16(row + d, D - d), acc);
  return _mm512_reduce_add_ps(acc);
#else
  float s = 0.0f;
  for (int64_t d = 0; d < D; ++d) s += q[d] * to_f(row[d]);
  return s;
#endif
}

// acc += w * row over D elements
template <typename T>
inline void axpy(float w, const T* row, float* acc, int64_t D) {
#if defined(__AVX512F__)
  const __m512 wv = _mm512_set1_ps(w);
  for (int64_t d = 0; d < D; d += 16) {
    const __mmask16 m = D - d >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (D - d)) - 1);
    _mm512_mask_storeu_ps(acc + d, m, _mm512_fmadd_ps(wv, load16(row + d, D - d), _mm512_maskz_loadu_ps(m, acc + d)));
  }
#else
  for (int64_t d = 0; d < D; ++d) acc[d] += w * to_f(row[d]);
#endif
}

// q: request b's heads start at q + b * q_stride (a row of a fused qkv projection, or of q alone);
// out: [B, H, D] contiguous
template <typename T>
void attend(const T* qp, int64_t q_stride, const T* kp, const T* vp, const int64_t* sp, int64_t Lmax,
            const int32_t* lp, T* op, int64_t B, int64_t H, int64_t Hkv, int64_t D, float scale, int threads) {
  const int64_t G = H / Hkv;
  // one item per (request, query head): at batch 1 that is 9-32 items, enough for every core; the
  // heads of a KV group read the same K/V rows one after another, so the re-reads hit the cache
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t L = lp[b], g = h / G;
      std::vector<float> qf(D), acc(D, 0.0f), s(L);
      for (int64_t d = 0; d < D; ++d) qf[d] = to_f(qp[b * q_stride + h * D + d]) * scale;
      const int64_t* row_slots = sp + b * Lmax;
      float m = -INFINITY;
      for (int64_t j = 0; j < L; ++j) {
        s[j] = dot(qf.data(), kp + (row_slots[j] * Hkv + g) * D, D);
        m = std::max(m, s[j]);
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < L; ++j) sum += (s[j] = std::exp(s[j] - m));
      for (int64_t j = 0; j < L; ++j) axpy(s[j], vp + (row_slots[j] * Hkv + g) * D, acc.data(), D);
      const float inv = 1.0f / sum;
      for (int64_t d = 0; d < D; ++d) op[(b * H + h) * D + d] = from_f<T>(acc[d] * inv);
    }
  }
}

}  // namespace

void paged_decode_attention(TensorView q, TensorView k, TensorView v, TensorView slots, TensorView lens,
                            TensorView out, double scale, int64_t threads) {
  TVM_FFI_ICHECK(q.ndim() == 3 && k.ndim() == 3 && v.ndim() == 3 && out.ndim() == 3) << "q/k/v/out must be 3-D";
  TVM_FFI_ICHECK(dense(q) && dense(k) && dense(v) && dense(out)
                 && dense(slots) && dense(lens)) << "inputs must be contiguous";
  TVM_FFI_ICHECK(q.size(1) % k.size(1) == 0) << "query heads must be a multiple of KV heads";
  TVM_FFI_ICHECK(slots.dtype().code == kDLInt && slots.dtype().bits == 64) << "slots must be int64";
  TVM_FFI_ICHECK(lens.dtype().code == kDLInt && lens.dtype().bits == 32) << "lens must be int32";
  const DLDataType dt = q.dtype();
  TVM_FFI_ICHECK(dt == k.dtype() && dt == v.dtype() && dt == out.dtype()) << "q, k, v, out must share a dtype";
  const int n = static_cast<int>(std::max<int64_t>(1, threads));
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), Hkv = k.size(1), Lmax = slots.size(1);
  const int64_t* sp = ptr<int64_t>(slots);
  const int32_t* lp = ptr<int32_t>(lens);
  const float sc = static_cast<float>(scale);
  if (is_f32(dt)) {
    attend(ptr<float>(q), H * D, ptr<float>(k), ptr<float>(v), sp, Lmax, lp, ptr<float>(out), B, H, Hkv, D, sc, n);
  } else if (is_bf16(dt)) {
    using B16 = uint16_t;
    attend(ptr<B16>(q), H * D, ptr<B16>(k), ptr<B16>(v), sp, Lmax, lp, ptr<B16>(out), B, H, Hkv, D, sc, n);
  } else {
    TVM_FFI_THROW(TypeError) << "paged_decode_attention supports float32 and bfloat16";
  }
}
