// y = x w^T for a few rows of x on the CPU: a decode step's linear layers at batch 1..64. The core, on
// raw pointers (the TVM FFI entry point is small_linear.cc):
//
//   x    [M, K]  float32 or bfloat16, contiguous (M small: every row of w is read once for all of them)
//   w    [N, K]  same dtype, contiguous (a linear layer's weight, rows = output features)
//   out  [M, N]  same dtype; float32 accumulation, rounded once at the end (as torch's bf16 matmul)
//
// At one token a step the product is a matrix-vector product: its time is the time to stream w from
// memory. Up to kSmallRows rows, work is split over output rows; each weight row is read once, front to
// back, and multiplied with every row of x (at most 4 at a time, in registers). Blocks of 4 weight rows
// read side by side were half as fast here: the prefetchers follow one stream per core better than
// four. Past kSmallRows the product is arithmetic, not streaming: tiles of kTileM rows of x times kTileN
// weight rows, all their sums in registers. bfloat16: with AVX512-BF16 (vdpbf16ps) 32 bf16 pairs per
// instruction into float32 sums; without it, x is widened to float32 once per call and each weight
// vector in registers (a bf16 is the top half of a float32: exact), so bf16 weights stream half the
// bytes of float32 ones and are multiplied in float32.
//
// Batch invariance: the sum of out[m, n] is accumulated in kU interleaved vector accumulators over the
// same chunks, then reduced in one fixed order, by both paths and every tile size, so a row's result
// does not depend on how many rows came with it (bit for bit, tested for 1..64 rows on each level).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "cpu_common.h"

namespace minisgl {
namespace linear_detail {

constexpr int64_t kSmallRows = 8;  // up to here one weight row at a time (streaming); past it, tiles
// U accumulators per sum (a dot product is not one long dependency chain); a tile of MT x NT sums needs
// MT * NT * U vector registers, plus NT weight vectors and one of x.
// Streaming (up to kSmallRows rows): kMaxTile rows of x times kStreamN weight rows read side by side.
#if defined(MINISGL_TILE_U)  // tuning builds: -DMINISGL_TILE_U=1 -DMINISGL_TILE_M=3 -DMINISGL_TILE_N=4 ...
constexpr int kU = MINISGL_TILE_U, kTileM = MINISGL_TILE_M, kTileN = MINISGL_TILE_N;
constexpr int kStreamN = MINISGL_STREAM_N, kMaxTile = MINISGL_STREAM_M;
#elif defined(__AVX512F__)
// 24 accumulators of 32 registers (4 x 6 with U = 1 was 5% faster from 32 rows up, 10% slower at batch
// 1); one weight row at a time: 4 side by side were half as fast (the prefetchers follow one stream
// per core better than four)
constexpr int kU = 2, kTileM = 4, kTileN = 3, kStreamN = 1, kMaxTile = 4;
#elif defined(__AVX2__)
// 16 registers: U = 1, so the 3 x 4 sums of a tile are 12 independent chains; streaming, 2 rows of x
// times 4 weight rows side by side (a single row of x would otherwise be one chain)
constexpr int kU = 1, kTileM = 3, kTileN = 4, kStreamN = 4, kMaxTile = 2;
#else
constexpr int kU = 2, kTileM = 2, kTileN = 2, kStreamN = 1, kMaxTile = 4;  // 8 vectors: 16 of NEON's 32
#endif

// How one step of a sum loads and multiplies: float32 lanes (bf16 widened), or bf16 pairs (AVX512-BF16)
template <typename XT, typename WT>
struct Mac {
  static constexpr int64_t kStep = kLanes;
  using XV = VF;
  using WV = VF;
  static VF x(const XT* p) { return vload(p); }
  static VF x(const XT* p, int64_t n) { return vload(p, n); }
  static VF w(const WT* p) { return vload(p); }
  static VF w(const WT* p, int64_t n) { return vload(p, n); }
  static VF madd(VF acc, VF xv, VF wv) { return vfma(xv, wv, acc); }
};
#if defined(__AVX512BF16__)
constexpr bool kNativeBf16 = true;
template <>
struct Mac<uint16_t, uint16_t> {
  static constexpr int64_t kStep = 32;  // vdpbf16ps: 32 bf16 pairs into 16 float32 sums
  using XV = __m512bh;
  using WV = __m512bh;
  static XV load(const uint16_t* p, int64_t n) {
    const __mmask32 m = n >= 32 ? ~__mmask32(0) : (__mmask32(1) << n) - 1;
    return (__m512bh)_mm512_maskz_loadu_epi16(m, p);
  }
  static XV x(const uint16_t* p) { return (__m512bh)_mm512_loadu_si512(p); }
  static XV x(const uint16_t* p, int64_t n) { return load(p, n); }
  static WV w(const uint16_t* p) { return (__m512bh)_mm512_loadu_si512(p); }
  static WV w(const uint16_t* p, int64_t n) { return load(p, n); }
  static VF madd(VF acc, XV xv, WV wv) { return _mm512_dpbf16_ps(acc, xv, wv); }
};
#else
constexpr bool kNativeBf16 = false;
#endif

// GCC keeps an array of accumulators in registers only when the loops over it are unrolled (the first
// version of the tiles kept them in memory: 12 stores per 12 multiply-adds, half torch's speed)
#define MINISGL_UNROLL _Pragma("GCC unroll 8")

// out[m * N + n] = dot(x[m], w[n]) for MT rows of x and NT rows of w (K elements each), every sum
// accumulated and reduced the same way whatever MT and NT are
template <typename XT, typename WT, typename OT, int MT, int NT>
void tile(const XT* x, const WT* w, OT* out, int64_t K, int64_t N) {
  using S = Mac<XT, WT>;
  constexpr int64_t L = S::kStep;
  VF acc[MT][NT][kU];
  MINISGL_UNROLL
  for (int m = 0; m < MT; ++m)
    MINISGL_UNROLL
    for (int n = 0; n < NT; ++n)
      MINISGL_UNROLL
      for (int u = 0; u < kU; ++u) acc[m][n][u] = vzero();
  int64_t k = 0;
  for (; k + L * kU <= K; k += L * kU)
    MINISGL_UNROLL
    for (int u = 0; u < kU; ++u) {
      typename S::WV wv[NT];
      MINISGL_UNROLL
      for (int n = 0; n < NT; ++n) wv[n] = S::w(w + n * K + k + L * u);
      MINISGL_UNROLL
      for (int m = 0; m < MT; ++m) {
        const auto xv = S::x(x + m * K + k + L * u);
        MINISGL_UNROLL
        for (int n = 0; n < NT; ++n) acc[m][n][u] = S::madd(acc[m][n][u], xv, wv[n]);
      }
    }
  for (; k < K; k += L) {  // the rest into the first accumulator, the last load partial
    typename S::WV wv[NT];
    MINISGL_UNROLL
    for (int n = 0; n < NT; ++n) wv[n] = S::w(w + n * K + k, K - k);
    MINISGL_UNROLL
    for (int m = 0; m < MT; ++m) {
      const auto xv = S::x(x + m * K + k, K - k);
      MINISGL_UNROLL
      for (int n = 0; n < NT; ++n) acc[m][n][0] = S::madd(acc[m][n][0], xv, wv[n]);
    }
  }
  MINISGL_UNROLL
  for (int m = 0; m < MT; ++m)
    MINISGL_UNROLL
    for (int n = 0; n < NT; ++n) {
      MINISGL_UNROLL
      for (int u = 1; u < kU; ++u) acc[m][n][0] = vadd(acc[m][n][0], acc[m][n][u]);
      out[m * N + n] = from_f<OT>(vsum(acc[m][n][0]));
    }
}

#undef MINISGL_UNROLL

template <typename XT, typename WT, typename OT, int NT>
void tiles(const XT* x, const WT* w, OT* out, int64_t M, int64_t K, int64_t N) {
  static_assert(kTileM <= 4, "the switch below lists tile heights 4 to 1");
  for (int64_t m0 = 0; m0 < M; m0 += kTileM) {  // the NT weight rows stay in L1 while x passes by
    const XT* xm = x + m0 * K;
    OT* om = out + m0 * N;
    switch (std::min<int64_t>(kTileM, M - m0)) {
      case 4: tile<XT, WT, OT, 4, NT>(xm, w, om, K, N); break;
      case 3: tile<XT, WT, OT, 3, NT>(xm, w, om, K, N); break;
      case 2: tile<XT, WT, OT, 2, NT>(xm, w, om, K, N); break;
      default: tile<XT, WT, OT, 1, NT>(xm, w, om, K, N); break;
    }
  }
}

template <typename XT, typename WT, typename OT>
void run(const XT* x, const WT* w, OT* out, int64_t M, int64_t K, int64_t N, int threads) {
  if (M > kSmallRows) {
    constexpr int64_t NT = kTileN;
    static_assert(NT <= 4, "the switch below lists block widths 4 to 1");
    const int64_t blocks = (N + NT - 1) / NT;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t n = b * NT;
      switch (std::min<int64_t>(NT, N - n)) {
        case 4: tiles<XT, WT, OT, 4>(x, w + n * K, out + n, M, K, N); break;
        case 3: tiles<XT, WT, OT, 3>(x, w + n * K, out + n, M, K, N); break;
        case 2: tiles<XT, WT, OT, 2>(x, w + n * K, out + n, M, K, N); break;
        default: tiles<XT, WT, OT, 1>(x, w + n * K, out + n, M, K, N); break;
      }
    }
    return;
  }
  const int64_t blocks = (N + kStreamN - 1) / kStreamN;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t n = b * kStreamN;
    for (int64_t m0 = 0; m0 < M; m0 += kMaxTile) {  // the weight rows stay in L1 between passes
      const XT* xm = x + m0 * K;
      OT* om = out + m0 * N + n;
      const WT* wn = w + n * K;
      const int64_t mt = std::min<int64_t>(kMaxTile, M - m0);
      if (kStreamN > 1 && n + kStreamN <= N) {
        switch (mt) {
          case 4: tile<XT, WT, OT, 4, kStreamN>(xm, wn, om, K, N); break;
          case 3: tile<XT, WT, OT, 3, kStreamN>(xm, wn, om, K, N); break;
          case 2: tile<XT, WT, OT, 2, kStreamN>(xm, wn, om, K, N); break;
          default: tile<XT, WT, OT, 1, kStreamN>(xm, wn, om, K, N); break;
        }
        continue;
      }
      for (int64_t j = 0; j < std::min<int64_t>(kStreamN, N - n); ++j) {  // one row at a time
        switch (mt) {
          case 4: tile<XT, WT, OT, 4, 1>(xm, wn + j * K, om + j, K, N); break;
          case 3: tile<XT, WT, OT, 3, 1>(xm, wn + j * K, om + j, K, N); break;
          case 2: tile<XT, WT, OT, 2, 1>(xm, wn + j * K, om + j, K, N); break;
          default: tile<XT, WT, OT, 1, 1>(xm, wn + j * K, om + j, K, N); break;
        }
      }
    }
  }
}

}  // namespace linear_detail

// Whether this build multiplies bfloat16 pairs natively (AVX512-BF16); else bf16 is widened to float32
constexpr bool kBf16Dot = linear_detail::kNativeBf16;

// out = x w^T (see the top of this file); T = float or uint16_t (bfloat16 bits)
template <typename T>
void linear(const T* x, const T* w, T* out, int64_t M, int64_t K, int64_t N, int threads) {
  if constexpr (std::is_same_v<T, uint16_t> && !linear_detail::kNativeBf16) {
    thread_local std::vector<float> xf;  // kept from call to call (fresh ones would come from mmap)
    if (static_cast<int64_t>(xf.size()) < M * K) xf.resize(M * K);
    for (int64_t i = 0; i < M * K; ++i) xf[i] = to_f(x[i]);
    linear_detail::run<float, uint16_t, uint16_t>(xf.data(), w, out, M, K, N, threads);
  } else {
    linear_detail::run<T, T, T>(x, w, out, M, K, N, threads);
  }
}

}  // namespace minisgl
