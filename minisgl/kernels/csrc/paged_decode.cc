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
// AVX-512 where the CPU has it (any head_dim up to 128, and 192 and 256), else scalar code.
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
template <typename T>
inline void prefetch_row(const T* row, int64_t bytes) {
  for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(row) + o, _MM_HINT_T0);
}

// One query head of one request over its L keys: pass 1 scores (q . k_j, scaled), pass 2 their
// softmax weights times v_j summed in NC float32 registers of 16 (head_dim <= 16 NC). K/V rows lie
// wherever the slot list puts them, so each pass prefetches the row PF positions ahead.
template <int NC, typename T>
void attend_head(const T* q, const T* const* krow, const T* const* vrow, int64_t L, int64_t D, float scale, float* s,
                 T* out) {
  constexpr int PF = 16;
  const int64_t bytes = D * int64_t(sizeof(T));
  __m512 qv[NC];
  for (int c = 0; c < NC; ++c) qv[c] = _mm512_mul_ps(load16(q + 16 * c, D - 16 * c), _mm512_set1_ps(scale));
  __m512 mv = _mm512_set1_ps(-INFINITY);
  int64_t j = 0;
  for (; j < L; ++j) {
    if (j + PF < L) {
      prefetch_row(krow[j + PF], bytes);
      prefetch_row(vrow[j + PF], bytes);
    }
    __m512 acc = _mm512_mul_ps(qv[0], load16(krow[j], D));
    for (int c = 1; c < NC; ++c) acc = _mm512_fmadd_ps(qv[c], load16(krow[j] + 16 * c, D - 16 * c), acc);
    s[j] = _mm512_reduce_add_ps(acc);
  }
  for (j = 0; j + 16 <= L; j += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(s + j));
  float m = _mm512_reduce_max_ps(mv);
  for (; j < L; ++j) m = std::max(m, s[j]);
  const __m512 mb = _mm512_set1_ps(m);
  __m512 sum = _mm512_setzero_ps();
  for (j = 0; j < L; j += 16) {
    const __mmask16 k = L - j >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (L - j)) - 1);
    const __m512 e = _mm512_maskz_mov_ps(k, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), mb)));
    _mm512_mask_storeu_ps(s + j, k, e);
    sum = _mm512_add_ps(sum, e);
  }
  __m512 acc[NC];
  for (int c = 0; c < NC; ++c) acc[c] = _mm512_setzero_ps();
  for (j = 0; j < L; ++j) {
    if (j + PF < L) prefetch_row(vrow[j + PF], bytes);
    const __m512 w = _mm512_set1_ps(s[j]);
    for (int c = 0; c < NC; ++c) acc[c] = _mm512_fmadd_ps(w, load16(vrow[j] + 16 * c, D - 16 * c), acc[c]);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
  for (int c = 0; c < NC; ++c) {
    const int64_t n = std::min<int64_t>(16, D - 16 * c);
    alignas(64) float tmp[16];
    _mm512_store_ps(tmp, _mm512_mul_ps(acc[c], inv));
    for (int64_t d = 0; d < n; ++d) out[16 * c + d] = from_f<T>(tmp[d]);
  }
}
#endif

// The same without AVX-512 (any head_dim), and the reference the vector version follows
template <typename T>
void attend_head_scalar(const T* q, const T* const* krow, const T* const* vrow, int64_t L, int64_t D, float scale,
                        float* s, float* acc, T* out) {
  float m = -INFINITY;
  for (int64_t j = 0; j < L; j++) {
    float dot = 0.0f;
    for (int64_t d = 0; d < D; ++d) dot += to_f(q[d]) * scale * to_f(krow[j][d]);
    s[j] = dot;
    m = std::max(m, dot);
  }
  float sum = 0.0f;
  for (int64_t j = 0; j < L; j++) sum += (s[j] = std::exp(s[j] - m));
  std::fill(acc, acc + D, 0.0f);
  for (int64_t j = 0; j < L; j++)
    for (int64_t d = 0; d < D; ++d) acc[d] += s[j] * to_f(vrow[j][d]);
  for (int64_t d = 0; d < D; ++d) out[d] = from_f<T>(acc[d] / sum);
}

// q: request b's heads start at q + b * q_stride (a row of a fused qkv projection, or of q alone);
// out: [B, H, D] contiguous
template <typename T>
void attend(const T* qp, int64_t q_stride, const T* kp, const T* vp, const int64_t* sp, int64_t Lmax,
            const int32_t* lp, T* op, int64_t B, int64_t H, int64_t Hkv, int64_t D, float scale, int threads) {
  const int64_t G = H / Hkv;
  // Items are (request, KV head, part of its query heads). With enough requests a KV group is one
  // item: its heads run one after another on one core and re-read the group's K/V rows from that
  // core's cache. With few (batch 1: 3-8 groups for 2+ cores) each head is an item of its own.
  const int64_t parts = B * Hkv >= 4 * threads ? 1 : G;
  const int64_t per = (G + parts - 1) / parts;
#pragma omp parallel num_threads(threads)
  {
    thread_local std::vector<const T*> krow, vrow;
    thread_local std::vector<float> s, acc;
    krow.resize(std::max<size_t>(krow.size(), Lmax));
    vrow.resize(krow.size());
    s.resize(std::max<size_t>(s.size(), Lmax + 16));
    acc.resize(std::max<size_t>(acc.size(), D));
#pragma omp for collapse(3) schedule(static)
    for (int64_t b = 0; b < B; b++) {
      for (int64_t g = 0; g < Hkv; ++g) {
        for (int64_t part = 0; part < parts; ++part) {
          const int64_t L = lp[b], h0 = g * G + part * per, h1 = std::min(g * G + G, h0 + per);
          for (int64_t j = 0; j < L; j++) {  // the slot list read once for all heads of the group
            krow[j] = kp + (sp[b * Lmax + j] * Hkv + g) * D;
            vrow[j] = vp + (sp[b * Lmax + j] * Hkv + g) * D;
          }
          for (int64_t h = h0; h < h1; ++h) {
            const T* q = qp + b * q_stride + h * D;
            T* out = op + (b * H + h) * D;
#if defined(__AVX512F__)
            switch ((D + 15) / 16) {
#define MINISGL_HEAD(nc) \
  case nc:               \
    attend_head<nc>(q, krow.data(), vrow.data(), L, D, scale, s.data(), out); continue;
              MINISGL_HEAD(1) MINISGL_HEAD(2) MINISGL_HEAD(3) MINISGL_HEAD(4) MINISGL_HEAD(5) MINISGL_HEAD(6)
              MINISGL_HEAD(7) MINISGL_HEAD(8) MINISGL_HEAD(12) MINISGL_HEAD(16)
#undef MINISGL_HEAD
              default:
                break;
            }
#endif
            attend_head_scalar(q, krow.data(), vrow.data(), L, D, scale, s.data(), acc.data(), out);
          }
        }
      }
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
  const int64_t B = q.size(0), D = q.size(2), H = q.size(1), Hkv = k.size(1), Lmax = slots.size(1);
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
