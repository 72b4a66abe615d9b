// y = x w^T for a few rows of x on the CPU: a decode step's linear layers at batch 1..8.
//
//   x    [M, K]  float32 or bfloat16, contiguous (M small: every row of w is read once for all of them)
//   w    [N, K]  same dtype, contiguous (a linear layer's weight, rows = output features)
//   out  [M, N]  same dtype; float32 accumulation, rounded once at the end (as torch's bf16 matmul)
//
// At one token a step the product is a matrix-vector product: its time is the time to stream w from
// memory. Work is split over output rows; each weight row is read once, front to back, and multiplied
// with every row of x (at most 4 at a time, in registers). Blocks of 4 rows read side by side were
// half as fast here: the prefetchers follow one stream per core better than four. With
// AVX512-BF16 (-march=native on a CPU that has it) each instruction multiplies 32 bf16 pairs and
// accumulates in float32 (vdpbf16ps); elsewhere the same loops run on float32 values.
#include <algorithm>
#include <cstdint>

#include "cpu_common.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

using namespace minisgl;
using tvm::ffi::TensorView;

constexpr int kMaxTile = 4;     // rows of x per pass over a weight row
constexpr int64_t kSmallRows = 8;  // up to here one weight row at a time (streaming); past it, tiles
// a tile: 4 rows of x times 3 rows of w, two accumulators each: 24 of the 32 vector registers (U = 1
// with 4 x 6 was 5% faster from 32 rows up but 10% slower at batch 1, and gives other bits)
constexpr int kTileM = 4, kTileN = 3;

// One SIMD register's worth of T: how many, how to load them (past n: zeros), how to multiply-add
// them into float32 lanes. Only where the CPU has the instructions (Simd<T>::kOn).
template <typename T>
struct Simd {
  static constexpr bool kOn = false;
};
#if defined(__AVX512BF16__)
template <>
struct Simd<uint16_t> {
  static constexpr bool kOn = true;
  static constexpr int64_t kLanes = 32;  // vdpbf16ps: 32 bf16 pairs into 16 float32 sums
  using Vec = __m512bh;
  static Vec load(const uint16_t* p, int64_t n) {
    const __mmask32 m = n >= 32 ? ~__mmask32(0) : (__mmask32(1) << n) - 1;
    return (__m512bh)_mm512_maskz_loadu_epi16(m, p);
  }
  static __m512 madd(__m512 acc, Vec x, Vec w) { return _mm512_dpbf16_ps(acc, x, w); }
};
#endif
#if defined(__AVX512F__)
template <>
struct Simd<float> {
  static constexpr bool kOn = true;
  static constexpr int64_t kLanes = 16;
  using Vec = __m512;
  static Vec load(const float* p, int64_t n) {
    return _mm512_maskz_loadu_ps(n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1), p);
  }
  static __m512 madd(__m512 acc, Vec x, Vec w) { return _mm512_fmadd_ps(x, w, acc); }
};
#endif

// sums[m] = dot(x[m], w) for MT rows of x, K elements each
template <typename T, int MT>
void dots(const T* x, const T* w, int64_t K, float sums[kMaxTile]) {
#if defined(__AVX512F__)
  if constexpr (Simd<T>::kOn) {
    using S = Simd<T>;
    // U independent accumulators per row of x: a dot product is not one long dependency chain. The
    // same U for every tile, so a row's result does not depend on how many rows came with it: a
    // request's tokens do not change with the batch it decodes in.
    constexpr int U = 2;
    __m512 acc[MT][U];
    for (int m = 0; m < MT; ++m)
      for (int u = 0; u < U; ++u) acc[m][u] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + S::kLanes * U <= K; k += S::kLanes * U)
      for (int u = 0; u < U; ++u) {
        const auto wv = S::load(w + k + S::kLanes * u, S::kLanes);
        for (int m = 0; m < MT; ++m) acc[m][u] = S::madd(acc[m][u], S::load(x + m * K + k + S::kLanes * u, S::kLanes), wv);
      }
    for (; k < K; k += S::kLanes) {  // the rest, the last load masked
      const auto wv = S::load(w + k, K - k);
      for (int m = 0; m < MT; ++m) acc[m][0] = S::madd(acc[m][0], S::load(x + m * K + k, K - k), wv);
    }
    for (int m = 0; m < MT; ++m) {
      for (int u = 1; u < U; ++u) acc[m][0] = _mm512_add_ps(acc[m][0], acc[m][u]);
      sums[m] = _mm512_reduce_add_ps(acc[m][0]);
    }
    return;
  }
#endif
  // portable: float32 arithmetic in 16 independent lanes, which compilers vectorise
  constexpr int kLanes = 16;
  float acc[MT][kLanes] = {};
  for (int64_t k0 = 0; k0 < K; k0 += kLanes) {
    const int n = static_cast<int>(std::min<int64_t>(kLanes, K - k0));
    for (int m = 0; m < MT; ++m)
      for (int l = 0; l < n; ++l) acc[m][l] += to_f(x[m * K + k0 + l]) * to_f(w[k0 + l]);
  }
  for (int m = 0; m < MT; ++m) {
    sums[m] = 0.0f;
    for (int l = 0; l < kLanes; ++l) sums[m] += acc[m][l];
  }
}

template <typename T, int MT>
void row(const T* x, const T* w, T* out, int64_t K, int64_t N, int64_t n) {
  float sums[kMaxTile];
  dots<T, MT>(x, w + n * K, K, sums);
  for (int m = 0; m < MT; ++m) out[m * N + n] = from_f<T>(sums[m]);
}

// GCC keeps an array of accumulators in registers only when the loops over it are unrolled
#define UNROLL _Pragma("GCC unroll 8")

// MT rows of x times NT rows of w, for decode batches past a few rows, where the product is no longer
// a matter of streaming w but of arithmetic: each x and w vector loaded feeds NT or MT multiply-adds
// instead of one. Every sum is accumulated exactly as dots<> does it (U = 2, the same chunks, the same
// reduction), so a row's result is the same bits whichever path computes it.
template <typename T, int MT, int NT>
void tile(const T* x, const T* w, T* out, int64_t K, int64_t N) {
#if defined(__AVX512F__)
  if constexpr (Simd<T>::kOn) {
    using S = Simd<T>;
    constexpr int U = 2;
    __m512 acc[MT][NT][U];
    UNROLL
    for (int m = 0; m < MT; ++m)
      UNROLL
      for (int n = 0; n < NT; ++n)
        UNROLL
        for (int u = 0; u < U; ++u) acc[m][n][u] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + S::kLanes * U <= K; k += S::kLanes * U)
      UNROLL
      for (int u = 0; u < U; ++u) {
        typename S::Vec wv[NT];
        UNROLL
        for (int n = 0; n < NT; ++n) wv[n] = S::load(w + n * K + k + S::kLanes * u, S::kLanes);
        UNROLL
        for (int m = 0; m < MT; ++m) {
          const auto xv = S::load(x + m * K + k + S::kLanes * u, S::kLanes);
          UNROLL
          for (int n = 0; n < NT; ++n) acc[m][n][u] = S::madd(acc[m][n][u], xv, wv[n]);
        }
      }
    for (; k < K; k += S::kLanes) {
      typename S::Vec wv[NT];
      UNROLL
      for (int n = 0; n < NT; ++n) wv[n] = S::load(w + n * K + k, K - k);
      UNROLL
      for (int m = 0; m < MT; ++m) {
        const auto xv = S::load(x + m * K + k, K - k);
        UNROLL
        for (int n = 0; n < NT; ++n) acc[m][n][0] = S::madd(acc[m][n][0], xv, wv[n]);
      }
    }
    UNROLL
    for (int m = 0; m < MT; ++m)
      UNROLL
      for (int n = 0; n < NT; ++n) {
        UNROLL
        for (int u = 1; u < U; ++u) acc[m][n][0] = _mm512_add_ps(acc[m][n][0], acc[m][n][u]);
        out[m * N + n] = from_f<T>(_mm512_reduce_add_ps(acc[m][n][0]));
      }
    return;
  }
#endif
  float sums[kMaxTile];
  for (int n = 0; n < NT; ++n)
    for (int m = 0; m < MT; ++m) {
      dots<T, 1>(x + m * K, w + n * K, K, sums);
      out[m * N + n] = from_f<T>(sums[0]);
    }
}

#undef UNROLL  // this file is included into decode_layer.cc: the macro stays here

template <typename T, int NT>
void tiles(const T* x, const T* w, T* out, int64_t M, int64_t K, int64_t N) {
  for (int64_t m0 = 0; m0 < M; m0 += kTileM) {  // the NT weight rows stay in L1 while x passes by
    const T* xm = x + m0 * K;
    T* om = out + m0 * N;
    switch (std::min<int64_t>(kTileM, M - m0)) {
      case 4: tile<T, 4, NT>(xm, w, om, K, N); break;
      case 3: tile<T, 3, NT>(xm, w, om, K, N); break;
      case 2: tile<T, 2, NT>(xm, w, om, K, N); break;
      default: tile<T, 1, NT>(xm, w, om, K, N); break;
    }
  }
}

template <typename T>
void run(const T* x, const T* w, T* out, int64_t M, int64_t K, int64_t N, int threads) {
  if (M > kSmallRows) {
    constexpr int64_t NT = kTileN;
    static_assert(NT == 3, "the switch below lists the block widths 3, 2, 1");
    const int64_t blocks = (N + NT - 1) / NT;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t n = b * NT;
      switch (std::min<int64_t>(NT, N - n)) {
        case 3: tiles<T, 3>(x, w + n * K, out + n, M, K, N); break;
        case 2: tiles<T, 2>(x, w + n * K, out + n, M, K, N); break;
        default: tiles<T, 1>(x, w + n * K, out + n, M, K, N); break;
      }
    }
    return;
  }
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t m0 = 0; m0 < M; m0 += kMaxTile) {  // the weight row stays in L1 between tiles
      const T* xm = x + m0 * K;
      T* om = out + m0 * N;
      switch (std::min<int64_t>(kMaxTile, M - m0)) {
        case 4: row<T, 4>(xm, w, om, K, N, n); break;
        case 3: row<T, 3>(xm, w, om, K, N, n); break;
        case 2: row<T, 2>(xm, w, om, K, N, n); break;
        default: row<T, 1>(xm, w, om, K, N, n); break;
      }
    }
  }
}

}  // namespace

// What this build computes with AVX-512 (bit 0: float32 products and the element-wise kernels; bit 1:
// bfloat16 products, AVX512-BF16). Elsewhere the same loops are portable C++, which loses to torch's
// BLAS past a few rows: the Python side then keeps to the one-row-at-a-time path.
int64_t simd_dtypes() { return (Simd<float>::kOn ? 1 : 0) | (Simd<uint16_t>::kOn ? 2 : 0); }

void small_linear(TensorView x, TensorView w, TensorView out, int64_t threads) {
  TVM_FFI_ICHECK(x.ndim() == 2 && w.ndim() == 2 && out.ndim() == 2) << "x, w, out must be 2-D";
  TVM_FFI_ICHECK(dense(x) && dense(w) && dense(out)) << "x, w, out must be contiguous";
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TVM_FFI_ICHECK(w.size(1) == K) << "x has " << K << " features, w " << w.size(1);
  TVM_FFI_ICHECK(out.size(0) == M && out.size(1) == N) << "out must be [" << M << ", " << N << "]";
  const DLDataType dt = x.dtype();
  TVM_FFI_ICHECK(dt == w.dtype() && dt == out.dtype()) << "x, w, out must share a dtype";
  const int n = static_cast<int>(std::max<int64_t>(1, threads));
  if (is_f32(dt)) {
    run<float>(ptr<float>(x), ptr<float>(w), ptr<float>(out), M, K, N, n);
  } else if (is_bf16(dt)) {
    run<uint16_t>(ptr<uint16_t>(x), ptr<uint16_t>(w), ptr<uint16_t>(out), M, K, N, n);
  } else {
    TVM_FFI_THROW(TypeError) << "small_linear supports float32 and bfloat16";
  }
}
