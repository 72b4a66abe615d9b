// Paged decode attention on the CPU, on raw pointers (the TVM FFI entry point and the contract:
// paged_decode.cc). A work item is a request's KV head with its query heads; the query, the running
// sums and the output of a head stay in vector registers (simd.h), the softmax's exponentials are
// computed a vector at a time, and each pass prefetches the K/V rows a few slots ahead, since the slot
// list scatters them. Head dims of up to 256 that fill whole vectors of 8 or 16 lanes run the vector
// code, others scalar code.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu_common.h"

namespace minisgl {
namespace attend_detail {

template <typename T>
inline void prefetch_row(const T* row, int64_t bytes) {
  for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(reinterpret_cast<const char*>(row) + o, 0, 3);
}

inline VF chunk(const float* p, int64_t n) { return n >= kLanes ? vload(p) : vload(p, n); }
inline VF chunk(const uint16_t* p, int64_t n) { return n >= kLanes ? vload(p) : vload(p, n); }

// One query head of one request over its L keys: pass 1 scores (q . k_j, scaled), pass 2 their
// softmax weights times v_j summed in NC float32 vectors (head_dim <= NC * kLanes). s: L + kLanes floats.
template <int NC, typename T>
void attend_head(const T* q, const T* const* krow, const T* const* vrow, int64_t L, int64_t D, float scale, float* s,
                 T* out) {
  constexpr int PF = 16;
  const int64_t bytes = D * int64_t(sizeof(T));
  VF qv[NC];
  for (int c = 0; c < NC; ++c) qv[c] = vmul(chunk(q + kLanes * c, D - kLanes * c), vset(scale));
  int64_t j = 0;
  for (; j < L; ++j) {
    if (j + PF < L) {
      prefetch_row(krow[j + PF], bytes);
      prefetch_row(vrow[j + PF], bytes);
    }
    VF acc = vmul(qv[0], chunk(krow[j], D));
    for (int c = 1; c < NC; ++c) acc = vfma(qv[c], chunk(krow[j] + kLanes * c, D - kLanes * c), acc);
    s[j] = vsum(acc);
  }
  VF mv = vset(-INFINITY);
  for (j = 0; j + kLanes <= L; j += kLanes) mv = vmax(mv, vload(s + j));
  float m = vmaxall(mv);
  for (; j < L; ++j) m = std::max(m, s[j]);
  const VF mb = vset(m);
  VF sum = vzero();
  for (j = 0; j < L; j += kLanes) {
    if (L - j >= kLanes) {
      const VF e = vexp(vsub(vload(s + j), mb));
      vstore(s + j, e);
      sum = vadd(sum, e);
    } else {  // the last lanes: stored and read back partially, so the lanes past L add 0
      vstore(s + j, vexp(vsub(vload(s + j, L - j), mb)), L - j);
      sum = vadd(sum, vload(s + j, L - j));
    }
  }
  VF acc[NC];
  for (int c = 0; c < NC; ++c) acc[c] = vzero();
  for (j = 0; j < L; ++j) {
    if (j + PF < L) prefetch_row(vrow[j + PF], bytes);
    const VF w = vset(s[j]);
    for (int c = 0; c < NC; ++c) acc[c] = vfma(w, chunk(vrow[j] + kLanes * c, D - kLanes * c), acc[c]);
  }
  const VF inv = vset(1.0f / vsum(sum));
  for (int c = 0; c < NC; ++c) {
    const int64_t n = std::min<int64_t>(kLanes, D - kLanes * c);
    alignas(64) float tmp[kLanes];
    vstore(tmp, vmul(acc[c], inv));
    for (int64_t d = 0; d < n; ++d) out[kLanes * c + d] = from_f<T>(tmp[d]);
  }
}

// The same in scalar code (head dims the vector code has no case for), and the reference it follows
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

}  // namespace attend_detail

// q: request b's heads start at q + b * q_stride (a row of a fused qkv projection, or of q alone);
// k, v: [S, Hkv, D] pools; sp: [B, Lmax] slots; lp: [B] lengths; out: [B, H, D] contiguous
template <typename T>
void attend(const T* qp, int64_t q_stride, const T* kp, const T* vp, const int64_t* sp, int64_t Lmax,
            const int32_t* lp, T* op, int64_t B, int64_t H, int64_t Hkv, int64_t D, float scale, int threads) {
  using namespace attend_detail;
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
    s.resize(std::max<size_t>(s.size(), Lmax + kLanes));
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
            switch ((D + kLanes - 1) / kLanes) {
#define MINISGL_HEAD(nc) \
  case nc:               \
    attend_head<nc>(q, krow.data(), vrow.data(), L, D, scale, s.data(), out); continue;
              // head dims up to 128 (256 with 16 lanes), 192 and 256
              MINISGL_HEAD(1) MINISGL_HEAD(2) MINISGL_HEAD(3) MINISGL_HEAD(4) MINISGL_HEAD(5) MINISGL_HEAD(6)
              MINISGL_HEAD(7) MINISGL_HEAD(8) MINISGL_HEAD(12) MINISGL_HEAD(16) MINISGL_HEAD(24) MINISGL_HEAD(32)
#undef MINISGL_HEAD
              default:
                break;
            }
            attend_head_scalar(q, krow.data(), vrow.data(), L, D, scale, s.data(), acc.data(), out);
          }
        }
      }
    }
  }
}

}  // namespace minisgl
